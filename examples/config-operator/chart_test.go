package main

import (
	"cmp"
	"fmt"
	"maps"
	"net"
	"path"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/quiesce-dev/quiesce/examples/config-operator/config"
	"github.com/quiesce-dev/quiesce/examples/internal/helmtest"
	"github.com/quiesce-dev/quiesce/runnable"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// tgps is the key of terminationGracePeriodSeconds in values.yaml.
const tgps = "terminationGracePeriodSeconds"

// The release the chart is rendered for.
const releaseName, releaseNamespace = "config-operator", "operators"

// chart is the chart's directory.
const chart = "chart"

// render renders the chart with the real helm (helm template, values.schema.json checked),
// its values overridden by overrides (a nil value removes the key), by template file name.
func render(t *testing.T, overrides map[string]any) map[string]string {
	t.Helper()
	files, err := helmtest.Template(t, chart, releaseName, releaseNamespace, overrides)
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// checkChart returns what is wrong with the rendered chart for quiesce: the config file it
// renders must carry the Pod's terminationGracePeriodSeconds as quiesce.terminationGracePeriod
// (so that the operator itself refuses, at start, a stop that cannot fit), load and apply
// (strict decoding, then the checks of Apply and runnable.Setup), the pod must get longer than
// quiesce.shutdownDelay + the manager's GracefulShutdownTimeout (the Options the config package
// builds: its defaults included) between SIGTERM and SIGKILL, and be ready on /readyz, the
// endpoint quiesce's check fails during the delay.
func checkChart(files map[string]string) error {
	var cm corev1.ConfigMap
	if err := yaml.UnmarshalStrict([]byte(files["configmap.yaml"]), &cm); err != nil {
		return fmt.Errorf("configmap.yaml: %w", err)
	}
	var d appsv1.Deployment
	if err := yaml.UnmarshalStrict([]byte(files["deployment.yaml"]), &d); err != nil {
		return fmt.Errorf("deployment.yaml: %w", err)
	}
	pod := d.Spec.Template.Spec
	c, err := config.Parse([]byte(cm.Data["config.yaml"]))
	if err != nil {
		return err
	}
	mgrOpts, qopts, err := c.Options(scheme.Scheme)
	if err != nil {
		return err
	}
	if pod.TerminationGracePeriodSeconds == nil ||
		qopts.TerminationGracePeriod != time.Duration(*pod.TerminationGracePeriodSeconds)*time.Second {
		return fmt.Errorf("quiesce.terminationGracePeriod (%v) is not the Pod's terminationGracePeriodSeconds (%v): "+
			"the operator cannot check that its stop fits", qopts.TerminationGracePeriod,
			ptrString(pod.TerminationGracePeriodSeconds))
	}
	mgrOpts.LeaderElectionNamespace = releaseNamespace // in a pod, controller-runtime reads the pod's
	if _, err := runnable.Setup(&rest.Config{Host: "http://127.0.0.1:1"}, &mgrOpts, qopts); err != nil {
		return err
	}

	need := qopts.ShutdownDelay + *mgrOpts.GracefulShutdownTimeout
	if *mgrOpts.GracefulShutdownTimeout < 0 {
		return fmt.Errorf("gracefulShutdownTimeout is negative: the manager would wait without a limit")
	}
	if pod.TerminationGracePeriodSeconds == nil ||
		time.Duration(*pod.TerminationGracePeriodSeconds)*time.Second <= need {
		return fmt.Errorf("terminationGracePeriodSeconds (%v) must exceed quiesce.shutdownDelay (%v) + "+
			"gracefulShutdownTimeout (%v)", ptrString(pod.TerminationGracePeriodSeconds), qopts.ShutdownDelay,
			*mgrOpts.GracefulShutdownTimeout)
	}
	if len(pod.Containers) != 1 {
		return fmt.Errorf("the pod has %d containers, want 1", len(pod.Containers))
	}
	return checkContainer(pod, pod.Containers[0], mgrOpts.HealthProbeBindAddress, qopts.ShutdownDelay, &cm)
}

// checkContainer checks the readiness probe (/readyz, on the port of probeAddr, failing
// within the shutdown delay: periodSeconds × failureThreshold ≤ delay) and that the file
// named by --config is the ConfigMap's.
func checkContainer(pod corev1.PodSpec, ctr corev1.Container, probeAddr string, delay time.Duration,
	cm *corev1.ConfigMap) error {
	p := ctr.ReadinessProbe
	if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/readyz" {
		return fmt.Errorf("the readiness probe must GET /readyz, where quiesce's check fails during the shutdown delay")
	}
	period, failures := cmp.Or(p.PeriodSeconds, 10), cmp.Or(p.FailureThreshold, 3) // unset: the API server's defaults
	if notReady := time.Duration(period*failures) * time.Second; delay > 0 && notReady > delay {
		return fmt.Errorf("the readiness probe's periodSeconds × failureThreshold (%d × %d) must not exceed "+
			"quiesce.shutdownDelay (%v): Services would still route here when the delay ends", period, failures, delay)
	}
	_, want, err := net.SplitHostPort(probeAddr)
	if err != nil {
		return fmt.Errorf("probeAddr: %w", err)
	}
	if got := containerPort(ctr, p.HTTPGet.Port); got != want {
		return fmt.Errorf("the readiness probe's port is %s, probeAddr's is %s", got, want)
	}
	file := ""
	for _, a := range ctr.Args {
		if v, ok := strings.CutPrefix(a, "--config="); ok {
			file = v
		}
	}
	for _, m := range ctr.VolumeMounts {
		for _, v := range pod.Volumes {
			if v.Name == m.Name && v.ConfigMap != nil && v.ConfigMap.Name == cm.Name &&
				path.Dir(file) == m.MountPath && cm.Data[path.Base(file)] != "" {
				return nil
			}
		}
	}
	return fmt.Errorf("--config=%s is not the file of ConfigMap %s", file, cm.Name)
}

// containerPort resolves a probe's port, by name or number, to a number.
func containerPort(ctr corev1.Container, port intstr.IntOrString) string {
	for _, p := range ctr.Ports {
		if port.Type == intstr.String && p.Name == port.StrVal {
			return strconv.Itoa(int(p.ContainerPort))
		}
	}
	return port.String()
}

func ptrString(p *int64) string {
	if p == nil {
		return "unset"
	}
	return fmt.Sprintf("%ds", *p)
}

// TestChart renders the chart with the real helm, with its values, then with values and
// templates that are wrong for quiesce, each of which must fail the check.
func TestChart(t *testing.T) {
	if err := helmtest.Lint(t, chart, nil); err != nil {
		t.Fatalf("the chart's values: %v", err)
	}
	for _, tc := range []struct {
		name   string
		values map[string]any
		edit   func(files map[string]string) // changes the rendered templates
		want   string                        // in checkChart's error; "": none
	}{
		{name: "the chart's values"},
		// The operator refuses these itself: the config file carries the Pod's value.
		{name: "kubebuilder's 10s", values: map[string]any{tgps: 10},
			want: "quiesce.shutdownDelay (ShutdownDelay) (10s) plus the manager's GracefulShutdownTimeout (30s, " +
				"from the manager's Options) must be below quiesce.terminationGracePeriod (TerminationGracePeriod) (10s)"},
		{name: "no margin", values: map[string]any{tgps: 40},
			want: "must be below quiesce.terminationGracePeriod (TerminationGracePeriod) (40s)"},
		{name: "gracefulShutdownTimeout left out: the default 30s counts",
			values: merged(cfg("gracefulShutdownTimeout", nil), map[string]any{tgps: 35}),
			want:   "GracefulShutdownTimeout (30s, from the manager's Options) must be below quiesce.terminationGracePeriod (TerminationGracePeriod) (35s)"},
		{name: "longer shutdown delay", values: cfg("quiesce", nest("shutdownDelay", "20s")),
			want: "quiesce.shutdownDelay (ShutdownDelay) (20s) plus"},
		{name: "the Pod's value not passed", edit: replace("configmap.yaml", "terminationGracePeriod: 45s", ""),
			want: "quiesce.terminationGracePeriod (0s) is not the Pod's terminationGracePeriodSeconds (45s)"},
		{name: "another value passed", edit: replace("configmap.yaml", "terminationGracePeriod: 45s", "terminationGracePeriod: 90s"),
			want: "quiesce.terminationGracePeriod (1m30s) is not the Pod's terminationGracePeriodSeconds (45s)"},
		{name: "shutdown delay shorter than the probe's failures", values: cfg("quiesce", nest("shutdownDelay", "5s")),
			want: "periodSeconds × failureThreshold (2 × 3) must not exceed quiesce.shutdownDelay (5s)"},
		{name: "grace period not below the manager's", values: cfg("quiesce", nest("gracePeriod", "30s")),
			want: "quiesce.gracePeriod (GracePeriod) (30s) must be below the manager's GracefulShutdownTimeout"},
		{name: "cancelAfter not below gracePeriod", values: cfg("quiesce", nest("cancelAfter", "25s")),
			want: "quiesce.cancelAfter (CancelAfter) (25s) must be below quiesce.gracePeriod"},
		{name: "probe port", values: cfg("probeAddr", ":9090"), want: "the readiness probe's port is 8081, probeAddr's is 9090"},
		{name: "readiness on /healthz", edit: replace("deployment.yaml", "path: /readyz", "path: /healthz"),
			want: "the readiness probe must GET /readyz"},
		{name: "config file elsewhere", edit: replace("deployment.yaml", "--config=/etc/config-operator/", "--config=/etc/"),
			want: "--config=/etc/config.yaml is not the file of ConfigMap config-operator-config"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			files := render(t, tc.values)
			if tc.edit != nil {
				tc.edit(files)
			}
			err := checkChart(files)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("checkChart = %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("checkChart = %v, want an error with %q", err, tc.want)
			}
		})
	}
}

// hostile are values that would add fields to the pod spec, or settings to the config
// file, if the templates inserted them as text; at is where values.schema.json refuses each.
var hostile = []struct {
	name, at string
	values   map[string]any
}{
	{"replicas", "/replicas", map[string]any{"replicas": "2\n  paused: true"}},
	{"terminationGracePeriodSeconds", "/terminationGracePeriodSeconds",
		map[string]any{tgps: "45\n      hostPID: true\n      hostNetwork: true"}},
	{"webhook port", "/config/webhook/port", cfg("webhook", nest("port", "9443, hostPort: 9443"))},
	{"image", "/image", map[string]any{"image": "evil:1\"\n          securityContext: {privileged: true}\n          x: \""}},
	{"a config key in another case", "/config/quiesce",
		cfg("quiesce", nest("debugaddress", "127.0.0.1:8083"))},
	{"a duration with a line of its own", "/config/quiesce/gracePeriod",
		cfg("quiesce", nest("gracePeriod", "20s\n    debugAddress: 127.0.0.1:8083"))},
	// The chart writes the Pod's own value there: without the schema, the values' is overwritten.
	{"the Pod's limit in the config", "/config/quiesce", cfg("quiesce", nest("terminationGracePeriod", "90s"))},
	{"the debug view on the pod's network", "/config/quiesce/debugAddress",
		cfg("quiesce", nest("debugAddress", "0.0.0.0:8083"))},
	{"an unknown key", "/config", cfg("webhookk", nest("port", 1))},
	// YAML reads U+2028 as a line break: the config file would not be what the values say.
	{"a line separator in a URL", "/config/publishURL", cfg("publishURL", "http://store\u2028quiesce: {cancelAfter: 1ns}")},
	{"a line separator in a path", "/config/webhook/certDir", cfg("webhook", nest("port", 9443, "certDir", "/certs\u2028"))},
}

// Hostile values are refused by helm lint and helm template (values.schema.json), naming
// where; and the templates alone, without the schema, render them inert: the Deployment is
// the chart's own but for the value's own field, and a config file the operator would not
// load.
func TestChartHostileValues(t *testing.T) {
	baseline := render(t, nil)
	var want appsv1.Deployment
	if err := yaml.UnmarshalStrict([]byte(baseline["deployment.yaml"]), &want); err != nil {
		t.Fatal(err)
	}
	noSchema := helmtest.WithoutSchema(t, chart)
	for _, tc := range hostile {
		t.Run(tc.name, func(t *testing.T) {
			if err := helmtest.Lint(t, chart, tc.values); err == nil || !strings.Contains(err.Error(), tc.at) {
				t.Errorf("helm lint --strict = %v, want an error at %s", err, tc.at)
			}
			if _, err := helmtest.Template(t, chart, releaseName, releaseNamespace, tc.values); err == nil ||
				!strings.Contains(err.Error(), tc.at) {
				t.Errorf("helm template = %v, want an error at %s", err, tc.at)
			}

			files, err := helmtest.Template(t, noSchema, releaseName, releaseNamespace, tc.values)
			if err != nil {
				return // refused by the templates: inert
			}
			var got appsv1.Deployment
			if err := yaml.UnmarshalStrict([]byte(files["deployment.yaml"]), &got); err != nil {
				t.Fatalf("without the schema, the Deployment is not one: %v\n%s", err, files["deployment.yaml"])
			}
			// The fields the values set, as the chart's own values set them.
			got.Spec.Replicas = want.Spec.Replicas
			pod, wantPod := &got.Spec.Template.Spec, want.Spec.Template.Spec
			pod.TerminationGracePeriodSeconds = wantPod.TerminationGracePeriodSeconds
			if len(pod.Containers) == 1 && len(pod.Containers[0].Ports) > 0 {
				pod.Containers[0].Image = wantPod.Containers[0].Image
				pod.Containers[0].Ports[0].ContainerPort = wantPod.Containers[0].Ports[0].ContainerPort
			}
			if !equality.Semantic.DeepEqual(got, want) {
				t.Errorf("without the schema, the value changed the Deployment beyond its own field:\n%s",
					files["deployment.yaml"])
			}
			if files["configmap.yaml"] != baseline["configmap.yaml"] && checkChart(files) == nil {
				t.Errorf("without the schema, the operator would load the config file:\n%s", files["configmap.yaml"])
			}
		})
	}
}

// replace returns an edit of the rendered file that replaces the first from by to.
func replace(file, from, to string) func(files map[string]string) {
	return func(files map[string]string) { files[file] = strings.Replace(files[file], from, to, 1) }
}

// cfg makes the values of config, the operator's config file, from key, value pairs.
func cfg(kv ...any) map[string]any { return map[string]any{"config": nest(kv...)} }

// merged is the union of maps whose keys differ.
func merged(ms ...map[string]any) map[string]any {
	out := map[string]any{}
	for _, m := range ms {
		maps.Copy(out, m)
	}
	return out
}

// nest makes a map of key, value pairs.
func nest(kv ...any) map[string]any {
	m := map[string]any{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i].(string)] = kv[i+1]
	}
	return m
}
