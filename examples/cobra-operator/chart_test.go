package main

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/yaml"

	"github.com/quiesce-dev/quiesce/examples/internal/helmtest"
	"github.com/quiesce-dev/quiesce/runnable"
)

// The chart's directory, and the release it is rendered for.
const chart, releaseName, releaseNamespace = "chart", "cobra-operator", "operators"

// noAPIServer is the host of a rest.Config that reaches no API server: nothing here needs one.
const noAPIServer = "http://127.0.0.1:1"

// render renders the chart with the real helm (values.schema.json checked), its values
// overridden by values (a nil value removes the key), and returns its Deployment, or helm's
// error. A manifest that is no Deployment fails t.
func render(t *testing.T, chart string, values map[string]any) (*appsv1.Deployment, error) {
	t.Helper()
	files, err := helmtest.Template(t, chart, releaseName, releaseNamespace, values)
	if err != nil {
		return nil, err
	}
	var d appsv1.Deployment
	if err := yaml.UnmarshalStrict([]byte(files["deployment.yaml"]), &d); err != nil {
		t.Fatalf("the Deployment is not one: %v\n%s", err, files["deployment.yaml"])
	}
	return &d, nil
}

// parseArgs parses a container's args with the operator's own command, as the binary would,
// and returns the options it would run with.
func parseArgs(args []string) (*options, error) {
	var got *options
	cmd := newCommand(func(_ context.Context, o *options) error {
		got = o
		return nil
	})
	cmd.SetArgs(args)
	cmd.SetOut(new(strings.Builder))
	cmd.SetErr(new(strings.Builder))
	if err := cmd.Execute(); err != nil {
		return nil, err
	}
	return got, nil
}

// checkBudget returns what is wrong with the Deployment for quiesce: its args must parse,
// and pass quiesce's checks (runnable.Setup, on the manager Options they make); and the
// timing budget must hold, each term a time since SIGTERM:
//
//	readiness periodSeconds × failureThreshold  ≤  shutdownDelay
//	shutdownDelay + gracePeriod  <  shutdownDelay + gracefulShutdownTimeout  <  terminationGracePeriodSeconds
func checkBudget(d *appsv1.Deployment) error {
	pod := d.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		return fmt.Errorf("the pod has %d containers, want 1", len(pod.Containers))
	}
	ctr := pod.Containers[0]
	o, err := parseArgs(ctr.Args)
	if err != nil {
		return fmt.Errorf("the operator refuses its args: %w", err)
	}
	delay, timeout := o.quiesce.ShutdownDelay, o.gracefulShutdownTimeout
	mgrOpts := ctrl.Options{GracefulShutdownTimeout: &timeout}
	if _, err := runnable.Setup(&rest.Config{Host: noAPIServer}, &mgrOpts, o.quiesce); err != nil {
		return err // naming the flag: "--quiesce-grace-period (GracePeriod) ..."
	}
	p := ctr.ReadinessProbe
	if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/readyz" {
		return fmt.Errorf("the readiness probe must GET /readyz, where quiesce's check fails during the shutdown delay")
	}
	period, failures := cmp.Or(p.PeriodSeconds, 10), cmp.Or(p.FailureThreshold, 3) // unset: the API server's defaults
	if notReady := time.Duration(period*failures) * time.Second; delay > 0 && notReady > delay {
		return fmt.Errorf("the readiness probe's periodSeconds × failureThreshold (%d × %d) must not exceed "+
			"--quiesce-shutdown-delay (%v)", period, failures, delay)
	}
	tgps := pod.TerminationGracePeriodSeconds
	if tgps == nil || time.Duration(*tgps)*time.Second <= delay+timeout {
		return fmt.Errorf("terminationGracePeriodSeconds (%v) must exceed --quiesce-shutdown-delay (%v) + "+
			"--graceful-shutdown-timeout (%v)", ptrString(tgps), delay, timeout)
	}
	return nil
}

func ptrString(p *int64) string {
	if p == nil {
		return "unset"
	}
	return fmt.Sprintf("%ds", *p)
}

// TestChart renders the chart with the real helm, with its values, then with values that
// are wrong for quiesce, each of which must fail the check.
func TestChart(t *testing.T) {
	if err := helmtest.Lint(t, chart, nil); err != nil {
		t.Fatalf("the chart's values: %v", err)
	}
	q := func(kv ...any) map[string]any { return map[string]any{"quiesce": nest(kv...)} }
	for _, tc := range []struct {
		name   string
		values map[string]any
		want   string // in checkBudget's error; "": none
	}{
		{name: "the chart's values"},
		{name: "every quiesce setting", values: q("cancelAfter", "20s", "reportEvery", "10s", "slowAfter", "2m",
			"debugAddress", "127.0.0.1:8083")},
		{name: "kubebuilder's 10s", values: nest("terminationGracePeriodSeconds", 10),
			// the operator refuses it itself: the chart passes the Pod's value as a flag
			want: "--quiesce-shutdown-delay (ShutdownDelay) (10s) plus the manager's GracefulShutdownTimeout (30s, " +
				"from the manager's Options) must be below --quiesce-termination-grace-period (TerminationGracePeriod) (10s)"},
		{name: "gracefulShutdownTimeout left out: the default 30s counts",
			values: nest("gracefulShutdownTimeout", nil, "terminationGracePeriodSeconds", 35),
			want:   "GracefulShutdownTimeout (30s, from the manager's Options) must be below --quiesce-termination-grace-period (TerminationGracePeriod) (35s)"},
		{name: "shutdown delay shorter than the probe's failures", values: q("shutdownDelay", "5s"),
			want: "periodSeconds × failureThreshold (2 × 3) must not exceed --quiesce-shutdown-delay (5s)"},
		{name: "probe failing later", values: nest("readinessProbe", nest("periodSeconds", 7, "failureThreshold", 3)),
			want: "(7 × 3) must not exceed --quiesce-shutdown-delay (10s)"},
		{name: "grace period not below the manager's", values: q("gracePeriod", "30s"),
			want: "--quiesce-grace-period (GracePeriod) (30s) must be below the manager's GracefulShutdownTimeout"},
		{name: "cancelAfter not below gracePeriod", values: q("cancelAfter", "25s"),
			want: "--quiesce-cancel-after (CancelAfter) (25s) must be below --quiesce-grace-period (GracePeriod) (25s)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := render(t, chart, tc.values)
			if err != nil {
				t.Fatal(err)
			}
			err = checkBudget(d)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("checkBudget = %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("checkBudget = %v, want an error with %q", err, tc.want)
			}
		})
	}
}

// hostile are values that would add fields to the pod spec, or args to the container, if
// the templates inserted them as text; at is where values.schema.json refuses each.
var hostile = []struct {
	name, at string
	values   map[string]any
}{
	{"replicas", "/replicas", nest("replicas", "2\n  paused: true")},
	{"terminationGracePeriodSeconds", "/terminationGracePeriodSeconds",
		nest("terminationGracePeriodSeconds", "45\n      hostPID: true\n      hostNetwork: true")},
	{"an arg of its own", "/quiesce/gracePeriod",
		nest("quiesce", nest("shutdownDelay", "10s", "gracePeriod", "25s\n            - --quiesce-cancel-after=1ns"))},
	{"a quoted arg of its own", "/quiesce/shutdownDelay",
		nest("quiesce", nest("shutdownDelay", "10s\"\n            - \"--quiesce-cancel-after=1ns", "gracePeriod", "25s"))},
	{"two flags in one arg", "/logFormat", nest("logFormat", "text --quiesce-cancel-after=1ns")},
	{"a flag in another case", "/quiesce",
		nest("quiesce", nest("shutdownDelay", "10s", "gracePeriod", "25s", "debugaddress", "0.0.0.0:8083"))},
	{"a number as a duration", "/quiesce/gracePeriod", nest("quiesce", nest("shutdownDelay", "10s", "gracePeriod", 25))},
	{"image", "/image", nest("image", "evil:1\"\n          securityContext: {privileged: true}\n          x: \"")},
	{"probe period", "/readinessProbe/periodSeconds",
		nest("readinessProbe", nest("periodSeconds", "2\n            initialDelaySeconds: 3600", "failureThreshold", 3))},
	{"webhook port", "/webhook/port", nest("webhook", nest("port", "9443, hostPort: 9443", "certSecret", "cobra-operator-webhook-cert"))},
}

// Hostile values are refused by helm lint and helm template (values.schema.json), naming
// where; and the templates alone, without the schema, render them inert: the Deployment is
// the chart's own but for the value's own field, with as many args, each for the same flag,
// and the setting the values try to slip in (cancelling calls at once) stays unset.
func TestChartHostileValues(t *testing.T) {
	want, err := render(t, chart, nil)
	if err != nil {
		t.Fatal(err)
	}
	noSchema := helmtest.WithoutSchema(t, chart)
	for _, tc := range hostile {
		t.Run(tc.name, func(t *testing.T) {
			if err := helmtest.Lint(t, chart, tc.values); err == nil || !strings.Contains(err.Error(), tc.at) {
				t.Errorf("helm lint --strict = %v, want an error at %s", err, tc.at)
			}
			if _, err := render(t, chart, tc.values); err == nil || !strings.Contains(err.Error(), tc.at) {
				t.Errorf("helm template = %v, want an error at %s", err, tc.at)
			}

			got, err := render(t, noSchema, tc.values)
			if err != nil {
				return // refused by the templates: inert
			}
			// The fields the values set, as the chart's own values set them.
			got.Spec.Replicas = want.Spec.Replicas
			pod, wantPod := &got.Spec.Template.Spec, want.Spec.Template.Spec
			pod.TerminationGracePeriodSeconds = wantPod.TerminationGracePeriodSeconds
			var changed []string
			if len(pod.Containers) == 1 && len(pod.Containers[0].Ports) > 0 && pod.Containers[0].ReadinessProbe != nil {
				ctr, wantCtr := &pod.Containers[0], wantPod.Containers[0]
				ctr.Image = wantCtr.Image
				ctr.Ports[0].ContainerPort = wantCtr.Ports[0].ContainerPort
				ctr.ReadinessProbe.PeriodSeconds = wantCtr.ReadinessProbe.PeriodSeconds
				for i := range min(len(ctr.Args), len(wantCtr.Args)) {
					flag, _, _ := strings.Cut(wantCtr.Args[i], "=")
					if ctr.Args[i] != wantCtr.Args[i] && strings.HasPrefix(ctr.Args[i], flag+"=") {
						changed = append(changed, ctr.Args[i])
						ctr.Args[i] = wantCtr.Args[i]
					}
				}
			}
			if !equality.Semantic.DeepEqual(got, want) {
				t.Fatalf("without the schema, the value changed the Deployment beyond its own field:\n%+v", got.Spec.Template.Spec)
			}
			// What the values try to slip in stays unset: the operator refuses the arg, or reads it
			// as the value of its own flag.
			if o, err := parseArgs(changed); err == nil && o.quiesce.CancelAfter == time.Nanosecond {
				t.Errorf("without the schema, %q set --quiesce-cancel-after", changed)
			}
		})
	}
}

// debugAddress is refused off loopback by values.schema.json, naming where, and without
// the schema by the operator's setup, naming the flag.
func TestChartDebugAddressOnLoopbackOnly(t *testing.T) {
	noSchema := helmtest.WithoutSchema(t, chart)
	for _, tc := range []struct {
		addr     string
		loopback bool
	}{
		{"127.0.0.1:8083", true}, {"[::1]:8083", true}, {"localhost:8083", true},
		{"0.0.0.0:8083", false}, {":8083", false}, {"10.0.0.1:8083", false},
	} {
		values := map[string]any{"quiesce": nest("debugAddress", tc.addr)}
		err := helmtest.Lint(t, chart, values)
		if tc.loopback != (err == nil) || err != nil && !strings.Contains(err.Error(), "/quiesce/debugAddress") {
			t.Errorf("%s: helm lint --strict = %v, want an error at /quiesce/debugAddress exactly off loopback", tc.addr, err)
		}
		d, err := render(t, noSchema, values)
		if err != nil {
			t.Fatal(err)
		}
		err = checkBudget(d)
		want := fmt.Sprintf("--quiesce-debug-address (DebugAddress) is %q: set a loopback host:port", tc.addr)
		if tc.loopback && err != nil || !tc.loopback && (err == nil || !strings.Contains(err.Error(), want)) {
			t.Errorf("%s: checkBudget = %v, want an error with %q exactly off loopback", tc.addr, err, want)
		}
	}
}

// nest makes a map of key, value pairs.
func nest(kv ...any) map[string]any {
	m := map[string]any{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i].(string)] = kv[i+1]
	}
	return m
}
