package runnable_test

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/quiesce-dev/quiesce/runnable"
)

// signalChild is set in the environment of the process that TestSecondSignalDuringTheDelay
// starts: the test then plays the operator.
const signalChild = "QUIESCE_SIGNAL_CHILD"

// A second SIGTERM during ShutdownDelay exits at once with code 1: controller-runtime's
// signal handler, which quiesce keeps.
func TestSecondSignalDuringTheDelay(t *testing.T) {
	if os.Getenv(signalChild) != "" {
		runSignalChild()
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestSecondSignalDuringTheDelay$")
	cmd.Env = append(os.Environ(), signalChild+"=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	lines := bufio.NewScanner(out)
	waitFor := func(msg string) {
		t.Helper()
		for lines.Scan() {
			if strings.Contains(lines.Text(), msg) {
				return
			}
		}
		t.Fatalf("the child exited before %q", msg)
	}
	waitFor("ready")
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitFor(`"msg"="Stop began"`)
	begin := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	go func() {
		for lines.Scan() { // drain the pipe until the child exits
		}
		exited <- cmd.Wait()
	}()
	select {
	case err := <-exited:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 {
			t.Fatalf("the child exited with %v, want exit code 1", err)
		}
		if took := time.Since(begin); took > 30*time.Second {
			t.Errorf("the child exited %v after the second SIGTERM, want at once (the delay is 10m)", took)
		}
	case <-time.After(time.Minute):
		_ = cmd.Process.Kill()
		t.Log(<-exited)
		t.Fatal("the child did not exit on the second SIGTERM")
	}
}

// runSignalChild runs a manager with a 10-minute ShutdownDelay until a signal ends the process.
func runSignalChild() {
	ctx := ctrl.SetupSignalHandler()
	log := funcr.New(func(_, args string) { fmt.Println(args) }, funcr.Options{})
	opts := ctrl.Options{GracefulShutdownTimeout: ptr.To(time.Hour),
		Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0"}
	q, err := runnable.Setup(&rest.Config{Host: noAPIServer}, &opts, runnable.Options{Logger: log, ShutdownDelay: 10 * time.Minute})
	if err != nil {
		fmt.Println(err)
		os.Exit(3)
	}
	mgr, err := ctrl.NewManager(&rest.Config{Host: noAPIServer}, opts)
	if err == nil {
		err = q.Add(mgr)
	}
	if err != nil {
		fmt.Println(err)
		os.Exit(3)
	}
	fmt.Println("ready")
	_ = mgr.Start(q.StopContext(ctx))
	os.Exit(0) // not reached: the second signal exits with 1
}
