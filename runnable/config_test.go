package runnable_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/yaml"

	"github.com/quiesce-dev/quiesce/runnable"
)

// operatorConfig is an operator's own config file, with quiesce's settings embedded.
type operatorConfig struct {
	MetricsAddr string          `json:"metricsAddr"`
	Quiesce     runnable.Config `json:"quiesce"`
}

func decode(t *testing.T, file string) operatorConfig {
	t.Helper()
	var c operatorConfig
	if err := yaml.UnmarshalStrict([]byte(file), &c); err != nil {
		t.Fatal(err)
	}
	return c
}

func TestConfigApplies(t *testing.T) {
	c := decode(t, `
metricsAddr: ":8443"
quiesce:
  shutdownDelay: 5s
  gracePeriod: 1m
  cancelAfter: 50s
  slowAfter: 2m
  reportAfter: 2s
  reportEvery: 10s
  maxConcurrent: 4
  debugAddress: 127.0.0.1:8083
  terminationGracePeriod: 90s
`)
	opts := runnable.Options{SlowAfter: time.Hour}
	if err := c.Quiesce.Apply("quiesce", &opts); err != nil {
		t.Fatal(err)
	}
	want := runnable.Options{ShutdownDelay: 5 * time.Second, GracePeriod: time.Minute, CancelAfter: 50 * time.Second,
		SlowAfter: 2 * time.Minute, ReportAfter: 2 * time.Second, ReportEvery: 10 * time.Second, MaxConcurrent: 4,
		DebugAddress: "127.0.0.1:8083"}
	if got := fmt.Sprint(opts.ShutdownDelay, opts.GracePeriod, opts.CancelAfter, opts.SlowAfter, opts.ReportAfter,
		opts.ReportEvery, opts.MaxConcurrent, opts.DebugAddress); got != fmt.Sprint(want.ShutdownDelay,
		want.GracePeriod, want.CancelAfter, want.SlowAfter, want.ReportAfter, want.ReportEvery, want.MaxConcurrent,
		want.DebugAddress) {
		t.Fatalf("Options = %s, want %+v", got, want)
	}
	if opts.TerminationGracePeriod != 90*time.Second {
		t.Fatalf("TerminationGracePeriod = %v, want 90s", opts.TerminationGracePeriod)
	}

	// Fields left out keep what Options had: the defaults, or values set in code.
	opts = runnable.Options{SlowAfter: time.Hour}
	if err := decode(t, "quiesce: {gracePeriod: 10s}").Quiesce.Apply("quiesce", &opts); err != nil {
		t.Fatal(err)
	}
	if opts.GracePeriod != 10*time.Second || opts.SlowAfter != time.Hour || opts.ShutdownDelay != 0 {
		t.Fatalf("Options = %+v, want only GracePeriod set", opts)
	}
}

// Each bad value is an error naming the field by its path in the file; the Options stay as
// they were. Setup's checks name the fields the same way.
func TestConfigErrorsNameTheField(t *testing.T) {
	for _, tc := range []struct{ file, want string }{
		{"quiesce: {shutdownDelay: -1s}", "quiesce.shutdownDelay (ShutdownDelay) is -1s"},
		{"quiesce: {gracePeriod: 10s, cancelAfter: 10s}", "quiesce.cancelAfter (CancelAfter) (10s) must be below quiesce.gracePeriod (GracePeriod) (10s)"},
		{"quiesce: {maxConcurrent: -2}", "quiesce.maxConcurrent (MaxConcurrent) is -2"},
		{"quiesce: {debugAddress: '0.0.0.0:8083'}", `quiesce.debugAddress (DebugAddress) is "0.0.0.0:8083": set a loopback host:port`},
	} {
		opts := runnable.Options{GracePeriod: time.Second}
		err := decode(t, tc.file).Quiesce.Apply("quiesce", &opts)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Apply = %v, want an error with %q", tc.file, err, tc.want)
		}
		if opts.GracePeriod != time.Second || opts.ShutdownDelay != 0 || opts.MaxConcurrent != 0 || opts.DebugAddress != "" {
			t.Errorf("%s: a failed Apply changed Options: %+v", tc.file, opts)
		}
	}

	opts := runnable.Options{}
	if err := decode(t, "quiesce: {gracePeriod: 40s}").Quiesce.Apply("quiesce", &opts); err != nil {
		t.Fatal(err)
	}
	mo := ctrl.Options{GracefulShutdownTimeout: ptr.To(30 * time.Second)}
	_, err := runnable.Setup(&rest.Config{Host: noAPIServer}, &mo, opts)
	if want := "quiesce.gracePeriod (GracePeriod) (40s) must be below the manager's GracefulShutdownTimeout"; err == nil ||
		!strings.Contains(err.Error(), want) {
		t.Fatalf("Setup = %v, want an error with %q", err, want)
	}
}

// Strict decoding refuses what Apply could not tell apart from a default: a misspelt field,
// a duplicate one, a duration without a unit.
func TestConfigDecodedStrictly(t *testing.T) {
	for _, file := range []string{
		"quiesce: {gracePeriode: 10s}",
		"quiesce: {gracePeriod: 10s, gracePeriod: 20s}",
		"quiesce: {gracePeriod: 10}",
	} {
		var c operatorConfig
		if err := yaml.UnmarshalStrict([]byte(file), &c); err == nil {
			t.Errorf("%s: decoded as %+v, want an error", file, c.Quiesce)
		}
	}
}

// Keys that differ from a field's name only in case are refused, naming the key, whatever
// the decoder: sigs.k8s.io/yaml (encoding/json) alone matches them to the field, the last
// one winning (Helm's toYaml sorts keys: "debugaddress" comes after "debugAddress").
func TestConfigDecodedCaseSensitively(t *testing.T) {
	for _, tc := range []struct{ file, want string }{
		{"quiesce: {debugAddress: '127.0.0.1:8083', debugaddress: '0.0.0.0:8083'}", `unknown field "debugaddress"`},
		{"quiesce: {gracePeriod: 25s, graceperiod: 1ns}", `unknown field "graceperiod"`},
		{"quiesce: {GracePeriod: 1ns}", `unknown field "GracePeriod"`},
	} {
		for name, decode := range map[string]func([]byte, any) error{
			"yaml.UnmarshalStrict": func(b []byte, v any) error { return yaml.UnmarshalStrict(b, v) },
			"yaml.Unmarshal":       func(b []byte, v any) error { return yaml.Unmarshal(b, v) },
		} {
			var c operatorConfig
			err := decode([]byte(tc.file), &c)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s(%s) = %v (gracePeriod %v, debugAddress %q), want an error with %q",
					name, tc.file, err, c.Quiesce.GracePeriod, ptr.Deref(c.Quiesce.DebugAddress, ""), tc.want)
			}
		}
	}
}

func ExampleConfig_Apply() {
	file := []byte(`
metricsAddr: ":8443"
quiesce:
  shutdownDelay: 5s
  gracePeriod: 20s
`)
	var c operatorConfig // the operator's own: MetricsAddr, and Quiesce runnable.Config `json:"quiesce"`
	if err := yaml.UnmarshalStrict(file, &c); err != nil {
		fmt.Println(err)
		return
	}
	var qopts runnable.Options
	if err := c.Quiesce.Apply("quiesce", &qopts); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(qopts.ShutdownDelay, qopts.GracePeriod)

	bad := runnable.Config{CancelAfter: c.Quiesce.GracePeriod}
	fmt.Println(bad.Apply("quiesce", &qopts))
	// Output:
	// 5s 20s
	// failed to apply quiesce config: quiesce.cancelAfter (CancelAfter) (20s) must be below quiesce.gracePeriod (GracePeriod) (20s): lower quiesce.cancelAfter (CancelAfter), or raise quiesce.gracePeriod (GracePeriod)
}
