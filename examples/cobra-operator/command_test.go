package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"k8s.io/client-go/rest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// execute runs the command with args, and returns its output, its error, and whether it
// ran the operator.
func execute(args ...string) (string, *options, error) {
	var ran *options
	cmd := newCommand(func(_ context.Context, o *options) error {
		ran = o
		return nil
	})
	var out strings.Builder
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), ran, err
}

// --help shows quiesce's flags in a section of their own, with the defaults the operator
// really uses.
func TestHelp(t *testing.T) {
	out, ran, err := execute("--help")
	if err != nil || ran != nil {
		t.Fatalf("--help: %v, ran %v", err, ran != nil)
	}
	for _, want := range []string{
		"Generic flags:", "Logging flags:", "Quiesce flags:",
		"--graceful-shutdown-timeout duration", "(default 30s)",
		"--quiesce-shutdown-delay duration", "--quiesce-grace-period duration", "(default 25s)",
		"--quiesce-cancel-after duration", "4/5 of the grace period",
		"--quiesce-report-every duration", "(default 5s)",
		"--quiesce-slow-after duration", "(default 1m0s)",
		"--quiesce-debug-address string",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("--help lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "(default 0s)") {
		t.Errorf("--help shows a default of 0s:\n%s", out)
	}
	if strings.Index(out, "Quiesce flags:") > strings.Index(out, "--quiesce-shutdown-delay duration") {
		t.Errorf("quiesce's flags are not in their section:\n%s", out)
	}
}

// The args a Deployment passes reach quiesce's Options; the defaults are the real ones.
func TestFlags(t *testing.T) {
	_, o, err := execute("--quiesce-shutdown-delay=10s", "--quiesce-cancel-after=1ns", "--quiesce-debug-address=127.0.0.1:8083",
		"--graceful-shutdown-timeout=40s", "--log-format=json")
	if err != nil || o == nil {
		t.Fatalf("execute: %v", err)
	}
	q := o.quiesce
	if q.ShutdownDelay != 10*time.Second || q.GracePeriod != 25*time.Second || q.CancelAfter != time.Nanosecond ||
		q.DebugAddress != "127.0.0.1:8083" || o.gracefulShutdownTimeout != 40*time.Second || o.logFormat != "json" {
		t.Fatalf("options = %+v", o)
	}
}

// A bad value is refused before the operator runs, with an error that names the flag.
func TestBadValuesNameTheFlag(t *testing.T) {
	for _, tc := range []struct{ arg, want string }{
		{"--quiesce-grace-period=soon", `invalid argument "soon" for "--quiesce-grace-period" flag`},
		{"--quiesce-shutdown-delay=10", `"--quiesce-shutdown-delay" flag: time: missing unit in duration "10"`},
		{"--quiesce-debugaddress=127.0.0.1:8083", "unknown flag: --quiesce-debugaddress"},
		{"--log-format=xml", `--log-format is "xml": set it to text or json`},
	} {
		_, ran, err := execute(tc.arg)
		if err == nil || !strings.Contains(err.Error(), tc.want) || ran != nil {
			t.Errorf("%s: %v (ran: %v), want an error with %q", tc.arg, err, ran != nil, tc.want)
		}
	}
}

// Values that parse but do not fit together are refused at setup, naming the flags.
func TestSetupErrorsNameTheFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--quiesce-grace-period=40s"},
			"--quiesce-grace-period (GracePeriod) (40s) must be below the manager's GracefulShutdownTimeout (30s"},
		{[]string{"--quiesce-grace-period=40s"}, "--graceful-shutdown-timeout"},
		{[]string{"--quiesce-cancel-after=30s"},
			"--quiesce-cancel-after (CancelAfter) (30s) must be below --quiesce-grace-period (GracePeriod) (25s)"},
	} {
		_, o, err := execute(tc.args...)
		if err != nil {
			t.Fatal(err)
		}
		_, _, err = o.setup(&rest.Config{Host: noAPIServer})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: setup = %v, want an error with %q", tc.args, err, tc.want)
		}
	}
}

// With the defaults, setup makes the manager with quiesce, the controller and its webhook,
// without reaching an API server.
func TestSetup(t *testing.T) {
	_, o, err := execute("--metrics-bind-address=0", "--health-probe-bind-address=0")
	if err != nil {
		t.Fatal(err)
	}
	mgr, q, err := o.setup(&rest.Config{Host: noAPIServer})
	if err != nil {
		t.Fatal(err)
	}
	if mgr == nil || q.Executor() == nil {
		t.Fatal("setup returned no manager or no quiesce runnable")
	}
	if err := q.Add(mgr); err == nil {
		t.Fatal("quiesce was not added to the manager: a second Add succeeded")
	}
}
