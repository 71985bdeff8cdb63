package runnable_test

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"
	cliflag "k8s.io/component-base/cli/flag"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/quiesce-dev/quiesce/runnable"
)

// flagKind binds opts to a new flag set of one kind, and returns the set's parse and its
// --help text (after the binding, before any parse).
type flagKind struct {
	name string
	bind func(opts *runnable.Options) (parse func(args ...string) error, help string)
}

var flagKinds = []flagKind{
	{"flag", func(opts *runnable.Options) (func(...string) error, string) {
		fs := flag.NewFlagSet("operator", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		opts.BindFlags(fs)
		var help bytes.Buffer
		fs.SetOutput(&help)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
		return func(args ...string) error { return fs.Parse(args) }, help.String()
	}},
	{"pflag", func(opts *runnable.Options) (func(...string) error, string) {
		fs := pflag.NewFlagSet("operator", pflag.ContinueOnError)
		fs.SetOutput(io.Discard)
		opts.BindPFlags(fs)
		return func(args ...string) error { return fs.Parse(args) }, fs.FlagUsages()
	}},
}

func TestBindFlags(t *testing.T) {
	for _, k := range flagKinds {
		t.Run(k.name, func(t *testing.T) {
			opts := runnable.Options{GracePeriod: 20 * time.Second}
			parse, _ := k.bind(&opts)
			if err := parse(); err != nil {
				t.Fatal(err)
			}
			// Zero fields are bound to the defaults they stand for; others keep their value.
			if opts.ShutdownDelay != 0 || opts.GracePeriod != 20*time.Second || opts.CancelAfter != 0 ||
				opts.ReportEvery != 5*time.Second || opts.SlowAfter != time.Minute || opts.DebugAddress != "" {
				t.Fatalf("with no flags: %+v, want the values given, or the defaults, as defaults", opts)
			}
			if err := parse("--quiesce-shutdown-delay=5s", "--quiesce-grace-period=25s", "--quiesce-cancel-after=-1s",
				"--quiesce-report-every=10s", "--quiesce-slow-after=-1s", "--quiesce-debug-address=127.0.0.1:8083",
				"--quiesce-termination-grace-period=1m"); err != nil {
				t.Fatal(err)
			}
			if opts.DebugAddress != "127.0.0.1:8083" || opts.ShutdownDelay != 5*time.Second || opts.GracePeriod != 25*time.Second ||
				opts.CancelAfter != -time.Second || opts.ReportEvery != 10*time.Second || opts.SlowAfter != -time.Second ||
				opts.TerminationGracePeriod != time.Minute {
				t.Fatalf("after the flags: %+v", opts)
			}
			// The parser's error names the flag.
			if err := parse("--quiesce-grace-period=soon"); err == nil || !strings.Contains(err.Error(), "quiesce-grace-period") {
				t.Fatalf("a grace period that is no duration: %v, want an error naming the flag", err)
			}
		})
	}
}

// --help shows the defaults the operator really uses, for both kinds of flags, and speaks
// to whoever runs the operator, not to its developer.
func TestFlagsHelp(t *testing.T) {
	for _, k := range flagKinds {
		t.Run(k.name, func(t *testing.T) {
			var opts runnable.Options
			_, help := k.bind(&opts)
			for _, want := range []string{"(default 25s)", "(default 5s)", "(default 1m0s)", "4/5 of the grace period"} {
				if !strings.Contains(help, want) {
					t.Errorf("--help lacks %q:\n%s", want, help)
				}
			}
			for _, unwanted := range []string{"(default 0s)", "0: 25s", "mgr.Start", "StopContext", "--metrics-secure"} {
				if strings.Contains(help, unwanted) {
					t.Errorf("--help has %q:\n%s", unwanted, help)
				}
			}
		})
	}
}

// With the durations bound to flags of either kind, Setup's errors name the flag the user
// set, beside the field.
func TestBoundFlagsInErrors(t *testing.T) {
	for _, k := range flagKinds {
		t.Run(k.name, func(t *testing.T) {
			for _, tc := range []struct{ args, want string }{
				{"--quiesce-grace-period=40s",
					"--quiesce-grace-period (GracePeriod) (40s) must be below the manager's GracefulShutdownTimeout"},
				{"--quiesce-cancel-after=30s",
					"--quiesce-cancel-after (CancelAfter) (30s) must be below --quiesce-grace-period (GracePeriod) (25s)"},
				{"--quiesce-shutdown-delay=-1s", "--quiesce-shutdown-delay (ShutdownDelay) is -1s"},
				{"--quiesce-debug-address=:8083", `--quiesce-debug-address (DebugAddress) is ":8083": set a loopback host:port`},
			} {
				var opts runnable.Options
				parse, _ := k.bind(&opts)
				if err := parse(tc.args); err != nil {
					t.Fatal(err)
				}
				_, err := runnable.Setup(&rest.Config{Host: noAPIServer}, &ctrl.Options{}, opts)
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("%s: Setup = %v, want an error with %q", tc.args, err, tc.want)
				}
			}
		})
	}
}

// Bind quiesce's settings to main's flags, kubebuilder style; the Deployment passes its
// values as container args.
func ExampleOptions_BindFlags() {
	fs := flag.NewFlagSet("manager", flag.ContinueOnError) // in main.go: flag.CommandLine
	var opts runnable.Options
	opts.BindFlags(fs)
	_ = fs.Parse([]string{"--quiesce-shutdown-delay=5s"}) // in main.go: flag.Parse()
	fmt.Println(opts.ShutdownDelay, opts.GracePeriod)
	// Output: 5s 25s
}

// A cobra command with component-base's named flag sets: quiesce's flags in a section of
// their own in --help, parsed with the command's.
func ExampleOptions_BindPFlags() {
	var qopts runnable.Options
	cmd := &cobra.Command{
		Use: "operator",
		RunE: func(*cobra.Command, []string) error {
			// Here: q, err := runnable.Setup(cfg, &mgrOpts, qopts), then the manager.
			fmt.Println("shutdown delay", qopts.ShutdownDelay, "grace period", qopts.GracePeriod)
			return nil
		},
	}
	var fss cliflag.NamedFlagSets
	qopts.BindPFlags(fss.FlagSet("quiesce"))
	for _, fs := range fss.FlagSets {
		cmd.Flags().AddFlagSet(fs)
	}
	cliflag.SetUsageAndHelpFunc(cmd, fss, 80)

	cmd.SetArgs([]string{"--quiesce-shutdown-delay=10s"}) // the Deployment's container args
	if err := cmd.Execute(); err != nil {
		fmt.Println(err)
	}
	// Output: shutdown delay 10s grace period 25s
}
