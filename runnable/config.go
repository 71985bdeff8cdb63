package runnable

import (
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Config is the part of Options that a config file holds, for operators configured by a
// file rather than by flags (component-config style): embed it in the operator's own
// config struct, decode the file strictly (sigs.k8s.io/yaml.UnmarshalStrict refuses
// unknown and duplicate fields), then Apply it. Durations are written as Go durations
// ("25s", "1m30s"). A field left out keeps the value Options already has (the zero Options:
// the documented defaults).
//
//	type OperatorConfig struct {
//		MetricsAddr string          `json:"metricsAddr"`
//		Quiesce     runnable.Config `json:"quiesce"`
//	}
//
//	var qopts runnable.Options
//	if err := cfg.Quiesce.Apply("quiesce", &qopts); err != nil { ... }
//	q, err := runnable.Setup(restCfg, &mgrOpts, qopts)
type Config struct {
	// ShutdownDelay, GracePeriod, CancelAfter, SlowAfter, ReportAfter and ReportEvery are
	// the Options of the same names.
	ShutdownDelay *metav1.Duration `json:"shutdownDelay,omitempty"`
	GracePeriod   *metav1.Duration `json:"gracePeriod,omitempty"`
	CancelAfter   *metav1.Duration `json:"cancelAfter,omitempty"`
	SlowAfter     *metav1.Duration `json:"slowAfter,omitempty"`
	ReportAfter   *metav1.Duration `json:"reportAfter,omitempty"`
	ReportEvery   *metav1.Duration `json:"reportEvery,omitempty"`
	// MaxConcurrent is Options.MaxConcurrent: 0 unbounded; negative is an error.
	MaxConcurrent *int `json:"maxConcurrent,omitempty"`
	// DebugWithoutFilter is Options.DebugWithoutFilter.
	DebugWithoutFilter *bool `json:"debugWithoutFilter,omitempty"`
}

// configNames are the JSON names of Config's fields, by Options field.
var configNames = map[string]string{
	"ShutdownDelay": "shutdownDelay",
	"GracePeriod":   "gracePeriod",
	"CancelAfter":   "cancelAfter",
	"MaxConcurrent": "maxConcurrent",
}

// Apply sets the fields of opts that c sets and checks them, as Setup and Add would, with
// errors that name each field by its path in the file: path (where c sits in the
// operator's config, e.g. "quiesce"; "" at the top) and the field's JSON name, e.g.
// "quiesce.gracePeriod (GracePeriod) (30s) must be below ...". Setup's and Add's own
// errors about these fields name them the same way. On an error opts is as it was.
func (c Config) Apply(path string, opts *Options) error {
	o := *opts
	set := func(d *metav1.Duration, to *time.Duration) {
		if d != nil {
			*to = d.Duration
		}
	}
	set(c.ShutdownDelay, &o.ShutdownDelay)
	set(c.GracePeriod, &o.GracePeriod)
	set(c.CancelAfter, &o.CancelAfter)
	set(c.SlowAfter, &o.SlowAfter)
	set(c.ReportAfter, &o.ReportAfter)
	set(c.ReportEvery, &o.ReportEvery)
	if c.MaxConcurrent != nil {
		o.MaxConcurrent = *c.MaxConcurrent
	}
	if c.DebugWithoutFilter != nil {
		o.DebugWithoutFilter = *c.DebugWithoutFilter
	}
	o.fromConfig, o.configPrefix = true, ""
	if path != "" {
		o.configPrefix = path + "."
	}
	if o.MaxConcurrent < 0 {
		return fmt.Errorf("failed to apply quiesce config: %s is %d: set it to 0 (unbounded) or more",
			o.name("MaxConcurrent"), o.MaxConcurrent)
	}
	if err := checkDurations(o); err != nil {
		return fmt.Errorf("failed to apply quiesce config: %w", err)
	}
	*opts = o
	return nil
}
