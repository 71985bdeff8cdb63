package runnable

import "flag"

// BindFlags binds the durations of o to flags of fs, with o's values as their defaults, the
// way kubebuilder's main.go binds its own settings (the standard flag package; pflag users
// add fs with pflag.CommandLine.AddGoFlagSet). Call it before fs is parsed:
//
//	var qopts runnable.Options
//	qopts.BindFlags(flag.CommandLine)
//	flag.Parse()
//
// The flags, with the zero Options' defaults (suited to `make run`: no delay), are:
//
//	--quiesce-shutdown-delay  ShutdownDelay (0)
//	--quiesce-grace-period    GracePeriod (0: 25s)
//	--quiesce-cancel-after    CancelAfter (0: 4/5 of the grace period; 1ns: at once)
//	--quiesce-debug-without-filter  DebugWithoutFilter (false)
//
// A Deployment passes its production values as container args, e.g.
// --quiesce-shutdown-delay=5s. Add checks the values as it checks any Options; its errors
// then name the flags, e.g. "--quiesce-grace-period (GracePeriod) (30s) must be below ...".
func (o *Options) BindFlags(fs *flag.FlagSet) {
	o.flagsBound = true
	fs.DurationVar(&o.ShutdownDelay, flagNames["ShutdownDelay"], o.ShutdownDelay,
		"How long the operator keeps serving after SIGTERM, with readiness failing, before it stops "+
			"(needs mgr.Start(q.StopContext(ctx))). 0: no delay.")
	fs.DurationVar(&o.GracePeriod, flagNames["GracePeriod"], o.GracePeriod,
		"How long, from the manager's stop (the end of the shutdown delay), quiesce waits for in-flight "+
			"reconciles and calls before it names the ones it abandons. 0: 25s.")
	fs.DurationVar(&o.CancelAfter, flagNames["CancelAfter"], o.CancelAfter,
		"When, from the manager's stop (the end of the shutdown delay), the contexts of calls still running "+
			"are cancelled. "+
			"0: 4/5 of the grace period; 1ns: at once, as controller-runtime alone; negative: never.")
	fs.BoolVar(&o.DebugWithoutFilter, "quiesce-debug-without-filter", o.DebugWithoutFilter,
		"Serve /debug/quiesce (object names, code lines) on a metrics server without authentication "+
			"(--metrics-secure=false). Off by default: it is served only behind the metrics server's filter.")
}

// flagNames are the flags BindFlags binds the durations to, by field.
var flagNames = map[string]string{
	"ShutdownDelay": "quiesce-shutdown-delay",
	"GracePeriod":   "quiesce-grace-period",
	"CancelAfter":   "quiesce-cancel-after",
}

// name is how errors name a field: the field, after its path in the config file when
// Config.Apply set the Options, or after its flag when BindFlags bound it (the value may come
// from the flag or from the code: both are named).
func (o *Options) name(field string) string {
	if json, ok := configNames[field]; ok && o.fromConfig {
		return o.configPrefix + json + " (" + field + ")"
	}
	if !o.flagsBound || flagNames[field] == "" {
		return field
	}
	return "--" + flagNames[field] + " (" + field + ")"
}
