package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/quiesce-dev/quiesce/examples/internal/runner"
)

// replica is one operator process and its log.
type replica struct {
	name        string
	webhookAddr string // where its webhook server listens
	readyz      string // its /readyz URL
	cmd         *exec.Cmd
	exited      chan struct{} // closed once cmd.Wait returned
	logDone     chan struct{} // closed once its output reached EOF

	mu      sync.Mutex
	log     []string
	changed chan struct{} // a token when a line was added or the process exited
}

// startReplica runs bin with args and KUBECONFIG; its output goes to out (nil: kept only).
func startReplica(bin, name string, args []string, kubeconfig string, out io.Writer) (*replica, error) {
	webhookAddr, err := runner.FreeAddr()
	if err != nil {
		return nil, err
	}
	probeAddr, err := runner.FreeAddr()
	if err != nil {
		return nil, err
	}
	host, port, _ := strings.Cut(webhookAddr, ":")
	args = append([]string{"--id=" + name, "--webhook-host=" + host, "--webhook-port=" + port,
		"--health-probe-bind-address=" + probeAddr}, args...)
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig)
	// A process group of its own: a Ctrl-C reaches the runner only, which then kills it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("failed to create a pipe: %w", err)
	}
	cmd.Stdout, cmd.Stderr = w, w
	err = cmd.Start()
	_ = w.Close() // the process has its own copy of the write end
	if err != nil {
		_ = r.Close()
		return nil, fmt.Errorf("failed to start %s: %w", filepath.Base(bin), err)
	}
	rp := &replica{
		name: name, webhookAddr: webhookAddr, readyz: "http://" + probeAddr + "/readyz", cmd: cmd,
		exited: make(chan struct{}), logDone: make(chan struct{}), changed: make(chan struct{}, 1),
	}
	go func() {
		defer close(rp.logDone)
		defer func() { _ = r.Close() }()
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
		for sc.Scan() {
			if out != nil {
				_, _ = fmt.Fprintln(out, sc.Text())
			}
			rp.mu.Lock()
			rp.log = append(rp.log, sc.Text())
			rp.mu.Unlock()
			rp.notify()
		}
		_, _ = io.Copy(io.Discard, r) // after a too long line: never block the process
	}()
	go func() {
		_ = cmd.Wait() // the exit status is in cmd.ProcessState
		close(rp.exited)
		rp.notify()
	}()
	return rp, nil
}

func (rp *replica) notify() {
	select {
	case rp.changed <- struct{}{}:
	default:
	}
}

// entries returns its log lines that are JSON objects, decoded, in order.
func (rp *replica) entries() []map[string]any {
	rp.mu.Lock()
	defer rp.mu.Unlock()
	var es []map[string]any
	for _, l := range rp.log {
		var e map[string]any
		if json.Unmarshal([]byte(l), &e) == nil {
			es = append(es, e)
		}
	}
	return es
}

func (rp *replica) count(substr string) int {
	rp.mu.Lock()
	defer rp.mu.Unlock()
	n := 0
	for _, l := range rp.log {
		if strings.Contains(strings.ToLower(l), strings.ToLower(substr)) {
			n++
		}
	}
	return n
}

// waitFor waits until n lines of its log contain substr, in any case, for startTimeout at most.
func (rp *replica) waitFor(ctx context.Context, substr string, n int) error {
	timeout := startTimeout
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for rp.count(substr) < n {
		select {
		case <-rp.changed:
		case <-rp.exited:
			<-rp.logDone
			if rp.count(substr) >= n {
				return nil
			}
			return fmt.Errorf("%s exited (%s) before %d log lines said %q", rp.name, rp.cmd.ProcessState, n, substr)
		case <-ctx.Done():
			return fmt.Errorf("interrupted while waiting for %s: %w", rp.name, ctx.Err())
		case <-deadline.C:
			return fmt.Errorf("timed out after %s waiting for %d log lines of %s saying %q (got %d)",
				timeout, n, rp.name, substr, rp.count(substr))
		}
	}
	return nil
}

// stop sends SIGTERM and waits for the exit and the log, killing the process after timeout.
func (rp *replica) stop(timeout time.Duration) error {
	if err := rp.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return fmt.Errorf("failed to send SIGTERM to %s: %w", rp.name, err)
	}
	select {
	case <-rp.exited:
	case <-time.After(timeout):
		rp.kill()
		return fmt.Errorf("%s did not exit within %s of SIGTERM", rp.name, timeout)
	}
	<-rp.logDone
	return nil
}

// kill ends the process at once unless it exited, and waits for it and its log.
func (rp *replica) kill() {
	select {
	case <-rp.exited:
	default:
		_ = rp.cmd.Process.Kill()
		<-rp.exited
	}
	<-rp.logDone
}
