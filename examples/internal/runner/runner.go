// Package runner holds what the example runners (make demo, make demo-rollout) share beside
// shutdowntest: a free loopback port, the module to build from, and a writer for several
// goroutines' lines. It is an example's helper, not part of quiesce's API.
package runner

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
)

// FreeAddr returns a 127.0.0.1 address with a port free right now, for a server of the
// operator. Another process could take the port before the operator binds it; the operator
// then fails to start, and the runner says so.
func FreeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("failed to find a free port: %w", err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		return "", fmt.Errorf("failed to free port %s: %w", addr, err)
	}
	return addr, nil
}

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
