package runnable

import (
	"errors"
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	kjson "sigs.k8s.io/json"
)

// Config is the part of Options that a config file holds, for operators configured by a
// file rather than by flags (component-config style): embed it in the operator's own
// config struct, decode the file strictly and case-sensitively (sigs.k8s.io/yaml.YAMLToJSONStrict,
// then sigs.k8s.io/json.UnmarshalStrict, which refuses unknown and duplicate fields and
// names that differ from a field's only in case, among the operator's own fields too;
// Config itself refuses those, whatever the decoder: see UnmarshalJSON), then Apply it.
// Durations are written as Go durations ("25s", "1m30s"). A field left out keeps the value
// Options already has (the zero Options: the documented defaults).
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
	// Each field is the Options field of the same name.
	ShutdownDelay *metav1.Duration `json:"shutdownDelay,omitempty"`
	GracePeriod   *metav1.Duration `json:"gracePeriod,omitempty"`
	CancelAfter   *metav1.Duration `json:"cancelAfter,omitempty"`
	SlowAfter     *metav1.Duration `json:"slowAfter,omitempty"`
	ReportAfter   *metav1.Duration `json:"reportAfter,omitempty"`
	ReportEvery   *metav1.Duration `json:"reportEvery,omitempty"`
	MaxConcurrent *int             `json:"maxConcurrent,omitempty"`
	DebugAddress  *string          `json:"debugAddress,omitempty"`

	TerminationGracePeriod *metav1.Duration `json:"terminationGracePeriod,omitempty"`
}

// UnmarshalJSON decodes c strictly and case-sensitively (sigs.k8s.io/json.UnmarshalStrict):
// an unknown field, a duplicate one, or one whose name differs from a field's only in case
// ("graceperiod", "debugaddress") is an error naming it. encoding/json, and so
// sigs.k8s.io/yaml, matches names regardless of case, the last one winning: a
// "graceperiod: 1ns" written beside "gracePeriod: 25s" (Helm's toYaml sorts keys) would
// override it. On an error c is as it was.
func (c *Config) UnmarshalJSON(data []byte) error {
	type plain Config // Config without this method
	var p plain
	strict, err := kjson.UnmarshalStrict(data, &p)
	if err != nil {
		return fmt.Errorf("failed to decode quiesce config: %w", err)
	}
	if len(strict) > 0 {
		msgs := make([]string, len(strict))
		for i, e := range strict {
			msgs[i] = e.Error()
		}
		return fmt.Errorf("failed to decode quiesce config: %s (field names are case-sensitive)", strings.Join(msgs, ", "))
	}
	*c = Config(p)
	return nil
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
	set(c.TerminationGracePeriod, &o.TerminationGracePeriod)
	o.MaxConcurrent = ptr.Deref(c.MaxConcurrent, o.MaxConcurrent)
	o.DebugAddress = ptr.Deref(c.DebugAddress, o.DebugAddress)
	o.fromConfig, o.configPrefix = true, ""
	if path != "" {
		o.configPrefix = path + "."
	}
	if o.MaxConcurrent < 0 {
		return fmt.Errorf("failed to apply quiesce config: %s is %d: set it to 0 (unbounded) or more",
			o.name("MaxConcurrent"), o.MaxConcurrent)
	}
	if err := errors.Join(checkDurations(o), checkDebugAddress(o)); err != nil {
		return fmt.Errorf("failed to apply quiesce config: %w", err)
	}
	*opts = o
	return nil
}
