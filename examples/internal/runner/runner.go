// Package runner holds what the example runners (make demo, make demo-rollout) share beside
// shutdowntest: the module to build from, and a writer for several goroutines' lines. It is
// an example's helper, not part of quiesce's API.
package runner

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
)

// ModuleRoot returns the directory of the main module's go.mod, as the go command sees it
// from the working directory: the runners build their operator from that module.
func ModuleRoot(ctx context.Context) (string, error) {
	b, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("failed to run go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(b))
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("failed to find the quiesce module: run from inside it (make does), or pass --operator")
	}
	return filepath.Dir(gomod), nil
}

// SyncWriter serialises the writes of several goroutines (a runner's narration and the
// operators' log lines) to W.
type SyncWriter struct {
	mu sync.Mutex
	W  io.Writer
}

func (s *SyncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.W.Write(p)
}
