package runnable

import (
	"cmp"
	"flag"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/quiesce-dev/quiesce/internal"
)

// BindFlags binds quiesce's settings to flags of fs, the standard flag package as
// kubebuilder's main.go uses it (cobra and pflag: BindPFlags). Call it before fs is parsed:
//
//	var qopts runnable.Options
//	qopts.BindFlags(flag.CommandLine)
//	flag.Parse()
//
// The flags, each bound to the Options field of the same name, are:
//
//	--quiesce-shutdown-delay            ShutdownDelay
//	--quiesce-grace-period              GracePeriod
//	--quiesce-cancel-after              CancelAfter
//	--quiesce-report-every              ReportEvery
//	--quiesce-slow-after                SlowAfter
//	--quiesce-debug-address             DebugAddress
//	--quiesce-termination-grace-period  TerminationGracePeriod
//
// Each flag's default is the field's value when BindFlags is called, and a field left zero
// is bound to the default that zero stands for (GracePeriod: 25s, ReportEvery: 5s,
// SlowAfter: 1m), so that --help shows what the operator will really use; CancelAfter,
// whose default follows the grace period, stays 0. A Deployment passes the values as
// container args, e.g. --quiesce-shutdown-delay=10s. From then on the errors of Setup (and
// q.Add) about these fields name the flag beside the field, e.g. "--quiesce-grace-period
// (GracePeriod) (30s) must be below ...": the value may come from the flag or from the code.
func (o *Options) BindFlags(fs *flag.FlagSet) { o.bind(fs) }

// BindPFlags binds the flags of BindFlags (the same names, defaults and help texts) to a
// pflag.FlagSet, for operators whose command line is cobra's. With component-base's named
// flag sets, --help shows them in a section of their own:
//
//	var qopts runnable.Options
//	var fss cliflag.NamedFlagSets // k8s.io/component-base/cli/flag
//	qopts.BindPFlags(fss.FlagSet("quiesce"))
//	for _, fs := range fss.FlagSets {
//		cmd.Flags().AddFlagSet(fs)
//	}
//	cliflag.SetUsageAndHelpFunc(cmd, fss, 80)
//
// then, in cmd's RunE (its flags parsed), q, err := runnable.Setup(cfg, &mgrOpts, qopts).
// pflag reports a bad value naming the flag, e.g. invalid argument "soon" for
// "--quiesce-grace-period" flag. examples/cobra-operator is such an operator.
func (o *Options) BindPFlags(fs *pflag.FlagSet) { o.bind(fs) }

// flagSet is the part of *flag.FlagSet and *pflag.FlagSet that bind uses: the one
// definition of quiesce's flags serves both.
type flagSet interface {
	DurationVar(p *time.Duration, name string, value time.Duration, usage string)
	StringVar(p *string, name string, value string, usage string)
}

// flagNames are the flags bound to the fields, by field.
var flagNames = map[string]string{
	"ShutdownDelay":          "quiesce-shutdown-delay",
	"GracePeriod":            "quiesce-grace-period",
	"CancelAfter":            "quiesce-cancel-after",
	fieldReportEvery:         "quiesce-report-every",
	fieldSlowAfter:           "quiesce-slow-after",
	"DebugAddress":           "quiesce-debug-address",
	"TerminationGracePeriod": "quiesce-termination-grace-period",
}

func (o *Options) bind(fs flagSet) {
	o.flagsBound = true
	fs.DurationVar(&o.ShutdownDelay, flagNames["ShutdownDelay"], o.ShutdownDelay,
		"How long the operator keeps serving after SIGTERM, its readiness check failing so that Services "+
			"route elsewhere, before it stops. Set it to at least the readiness probe's periodSeconds × "+
			"failureThreshold. 0: no delay.")
	fs.DurationVar(&o.GracePeriod, flagNames["GracePeriod"], cmp.Or(o.GracePeriod, DefaultGracePeriod),
		"How long in-flight reconciles and webhook calls get to finish once the operator stops (after the "+
			"shutdown delay); those still running are then logged by name and abandoned. It must be below the "+
			"operator's graceful shutdown timeout (30s unless the operator sets another), and the pod's "+
			"terminationGracePeriodSeconds above the shutdown delay plus that timeout.")
	fs.DurationVar(&o.CancelAfter, flagNames["CancelAfter"], o.CancelAfter,
		"When, within the grace period, the calls still running are asked to stop (their contexts cancelled). "+
			"0: at 4/5 of the grace period; 1ns: at once, as without quiesce; negative: never.")
	fs.DurationVar(&o.ReportEvery, flagNames[fieldReportEvery], cmp.Or(o.ReportEvery, internal.DefaultReportEvery),
		"How often, while the operator waits for calls at its stop, it logs those still running and where.")
	fs.DurationVar(&o.SlowAfter, flagNames[fieldSlowAfter], cmp.Or(o.SlowAfter, internal.DefaultSlowAfter),
		"Calls running longer than this are logged as slow. Negative: never.")
	fs.DurationVar(&o.TerminationGracePeriod, flagNames["TerminationGracePeriod"], o.TerminationGracePeriod,
		"The pod's terminationGracePeriodSeconds (less a preStop hook's time), or systemd's TimeoutStopSec: "+
			"the operator refuses to start unless the shutdown delay plus its graceful shutdown timeout fit "+
			"below it. Pass the value the pod spec sets. 0: not checked.")
	fs.StringVar(&o.DebugAddress, flagNames["DebugAddress"], o.DebugAddress,
		"Serve /debug/quiesce (the objects in flight, the code lines they wait on) on this loopback address "+
			"(e.g. 127.0.0.1:8083), to be reached with kubectl port-forward. Empty: not served there.")
}

// name is how errors name a field: the field, after its path in the config file when
// Config.Apply set the Options, or after its flag when BindFlags or BindPFlags bound it (the
// value may come from the flag or from the code: both are named).
func (o *Options) name(field string) string {
	if o.fromConfig { // Config's JSON names are its fields', lowerCamelCase
		return o.configPrefix + strings.ToLower(field[:1]) + field[1:] + " (" + field + ")"
	}
	if !o.flagsBound || flagNames[field] == "" {
		return field
	}
	return "--" + flagNames[field] + " (" + field + ")"
}

// Field names that errors, flags and config keys are keyed by.
const (
	fieldReportEvery = "ReportEvery"
	fieldSlowAfter   = "SlowAfter"
)
