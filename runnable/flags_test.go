package runnable_test

import (
	"flag"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/quiesce-dev/quiesce/runnable"
)

func TestBindFlags(t *testing.T) {
	fs := flag.NewFlagSet("operator", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	opts := runnable.Options{GracePeriod: 20 * time.Second}
	opts.BindFlags(fs)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if opts.ShutdownDelay != 0 || opts.GracePeriod != 20*time.Second || opts.CancelAfter != 0 {
		t.Fatalf("with no flags: %+v, want the values given as defaults", opts)
	}
	if opts.DebugWithoutFilter {
		t.Fatal("DebugWithoutFilter on with no flags")
	}
	if err := fs.Parse([]string{"--quiesce-shutdown-delay=5s", "--quiesce-grace-period=25s", "--quiesce-cancel-after=-1s",
		"--quiesce-debug-without-filter"}); err != nil {
		t.Fatal(err)
	}
	if !opts.DebugWithoutFilter || opts.ShutdownDelay != 5*time.Second || opts.GracePeriod != 25*time.Second || opts.CancelAfter != -time.Second {
		t.Fatalf("after the flags: delay %v, grace %v, cancelAfter %v", opts.ShutdownDelay, opts.GracePeriod, opts.CancelAfter)
	}
	if err := fs.Parse([]string{"--quiesce-grace-period=soon"}); err == nil {
		t.Fatal("a grace period that is no duration was accepted")
	}
}

// With the durations bound to flags, Setup's errors name the flag the user set.
func TestBoundFlagsInErrors(t *testing.T) {
	fs := flag.NewFlagSet("operator", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var opts runnable.Options
	opts.BindFlags(fs)
	if err := fs.Parse([]string{"--quiesce-grace-period=40s"}); err != nil {
		t.Fatal(err)
	}
	_, err := runnable.Setup(&rest.Config{}, &ctrl.Options{}, opts)
	want := "--quiesce-grace-period (GracePeriod) (40s) must be below the manager's GracefulShutdownTimeout"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("Setup = %v, want an error with %q", err, want)
	}
}

// Bind quiesce's durations to main's flags, kubebuilder style; the Deployment passes its
// production values as container args.
func ExampleOptions_BindFlags() {
	fs := flag.NewFlagSet("manager", flag.ContinueOnError) // in main.go: flag.CommandLine
	var opts runnable.Options
	opts.BindFlags(fs)
	_ = fs.Parse([]string{"--quiesce-shutdown-delay=5s"}) // in main.go: flag.Parse()
	fmt.Println(opts.ShutdownDelay, opts.GracePeriod)
	// Output: 5s 0s
}
