package main

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"text/template"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/quiesce-dev/quiesce/examples/config-operator/config"
	"github.com/quiesce-dev/quiesce/runnable"
)

// tgps is the key of terminationGracePeriodSeconds in values.yaml.
const tgps = "terminationGracePeriodSeconds"

// The release the chart is rendered for.
const releaseName, releaseNamespace = "config-operator", "operators"

// helmFuncs are the few Helm template functions the chart uses, as Helm defines them.
var helmFuncs = template.FuncMap{
	"toYaml": func(v any) (string, error) {
		b, err := yaml.Marshal(v)
		return strings.TrimSuffix(string(b), "\n"), err
	},
	"nindent": func(n int, s string) string {
		pad := strings.Repeat(" ", n)
		return "\n" + pad + strings.ReplaceAll(s, "\n", "\n"+pad)
	},
	"quote": func(v any) string { return strconv.Quote(fmt.Sprint(v)) },
}

// render renders chart/templates/*.yaml with chart/values.yaml, overridden by overrides
// (merged key by key; a nil value removes the key), by file name.
func render(t *testing.T, overrides map[string]any) map[string]string {
	t.Helper()
	var values map[string]any
	b, err := os.ReadFile(filepath.Join("chart", "values.yaml"))
	if err == nil {
		err = yaml.Unmarshal(b, &values) // as Helm reads values: numbers as float64
	}
	if err != nil {
		t.Fatal(err)
	}
	merge(values, overrides)
	data := map[string]any{"Values": values, "Release": map[string]any{"Name": releaseName, "Namespace": releaseNamespace}}
	files, err := filepath.Glob(filepath.Join("chart", "templates", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no templates: %v", err)
	}
	out := map[string]string{}
	for _, f := range files {
		tmpl, err := template.New(filepath.Base(f)).Funcs(helmFuncs).Option("missingkey=error").ParseFiles(f)
		var buf bytes.Buffer
		if err == nil {
			err = tmpl.Execute(&buf, data)
		}
		if err != nil {
			t.Fatalf("failed to render %s: %v", f, err)
		}
		out[filepath.Base(f)] = buf.String()
	}
	return out
}

func merge(dst, src map[string]any) {
	for k, v := range src {
		sub, ok := v.(map[string]any)
		switch d, isMap := dst[k].(map[string]any); {
		case v == nil:
			delete(dst, k)
		case ok && isMap:
			merge(d, sub)
		default:
			dst[k] = v
		}
	}
}

// checkChart returns what is wrong with the rendered chart for quiesce: the config file it
// renders must load and apply (strict decoding, then the checks of Apply and runnable.Setup),
// the pod must get longer than quiesce.shutdownDelay + the manager's GracefulShutdownTimeout
// (the Options the config package builds: its defaults included) between SIGTERM and SIGKILL,
// and be ready on /readyz, the endpoint quiesce's check fails during the delay.
func checkChart(files map[string]string) error {
	var cm corev1.ConfigMap
	if err := yaml.UnmarshalStrict([]byte(files["configmap.yaml"]), &cm); err != nil {
		return fmt.Errorf("configmap.yaml: %w", err)
	}
	c, err := config.Parse([]byte(cm.Data["config.yaml"]))
	if err != nil {
		return err
	}
	mgrOpts, qopts, err := c.Options(scheme.Scheme)
	if err != nil {
		return err
	}
	mgrOpts.LeaderElectionNamespace = releaseNamespace // in a pod, controller-runtime reads the pod's
	if _, err := runnable.Setup(&rest.Config{Host: "http://127.0.0.1:1"}, &mgrOpts, qopts); err != nil {
		return err
	}

	var d appsv1.Deployment
	if err := yaml.UnmarshalStrict([]byte(files["deployment.yaml"]), &d); err != nil {
		return fmt.Errorf("deployment.yaml: %w", err)
	}
	pod := d.Spec.Template.Spec
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
	return checkContainer(pod, pod.Containers[0], mgrOpts.HealthProbeBindAddress, &cm)
}

// checkContainer checks the readiness probe (/readyz, on the port of probeAddr) and that the
// file named by --config is the ConfigMap's.
func checkContainer(pod corev1.PodSpec, ctr corev1.Container, probeAddr string, cm *corev1.ConfigMap) error {
	p := ctr.ReadinessProbe
	if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/readyz" {
		return fmt.Errorf("the readiness probe must GET /readyz, where quiesce's check fails during the shutdown delay")
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

// TestChart renders the chart with its values, then with values and templates that are
// wrong for quiesce, each of which must fail the check.
func TestChart(t *testing.T) {
	cfg := func(kv ...any) map[string]any { return map[string]any{"config": nest(kv...)} }
	for _, tc := range []struct {
		name   string
		values map[string]any
		edit   func(files map[string]string) // changes the rendered templates
		want   string                        // in checkChart's error; "": none
	}{
		{name: "the chart's values"},
		{name: "kubebuilder's 10s", values: map[string]any{tgps: 10},
			want: "terminationGracePeriodSeconds (10s) must exceed quiesce.shutdownDelay (10s) + gracefulShutdownTimeout (30s)"},
		{name: "no margin", values: map[string]any{tgps: 40},
			want: "terminationGracePeriodSeconds (40s) must exceed"},
		{name: "gracefulShutdownTimeout left out: the default 30s counts",
			values: merged(cfg("gracefulShutdownTimeout", nil), map[string]any{tgps: 35}),
			want:   "+ gracefulShutdownTimeout (30s)"},
		{name: "longer shutdown delay", values: cfg("quiesce", nest("shutdownDelay", "20s")),
			want: "must exceed quiesce.shutdownDelay (20s)"},
		{name: "grace period not below the manager's", values: cfg("quiesce", nest("gracePeriod", "30s")),
			want: "quiesce.gracePeriod (GracePeriod) (30s) must be below the manager's GracefulShutdownTimeout"},
		{name: "cancelAfter not below gracePeriod", values: cfg("quiesce", nest("cancelAfter", "25s")),
			want: "quiesce.cancelAfter (CancelAfter) (25s) must be below quiesce.gracePeriod"},
		{name: "misspelt field", values: cfg("quiesce", nest("gracePeriode", "20s")),
			want: `unknown field "gracePeriode"`},
		{name: "probe port", values: cfg("probeAddr", ":9090"), want: "the readiness probe's port is 8081, probeAddr's is 9090"},
		{name: "readiness on /healthz", edit: func(f map[string]string) {
			f["deployment.yaml"] = strings.Replace(f["deployment.yaml"], "path: /readyz", "path: /healthz", 1)
		}, want: "the readiness probe must GET /readyz"},
		{name: "config file elsewhere", edit: func(f map[string]string) {
			f["deployment.yaml"] = strings.Replace(f["deployment.yaml"], "--config=/etc/config-operator/", "--config=/etc/", 1)
		}, want: "--config=/etc/config.yaml is not the file of ConfigMap config-operator-config"},
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

// nest makes a map of key, value pairs; merged, the union of maps (the later win).
func nest(kv ...any) map[string]any {
	m := map[string]any{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i].(string)] = kv[i+1]
	}
	return m
}

func merged(ms ...map[string]any) map[string]any {
	out := map[string]any{}
	for _, m := range ms {
		merge(out, m)
	}
	return out
}
