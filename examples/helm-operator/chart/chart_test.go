package chart

import (
	"strings"
	"testing"

	"go.uber.org/goleak"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// render renders the chart as release "work" at the value version, and returns its manifests
// by template name, trimmed, the empty ones left out (as Helm leaves them out).
func render(t *testing.T, version string) map[string]string {
	t.Helper()
	c, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	vals, err := chartutil.ToRenderValues(c, map[string]any{"version": version},
		chartutil.ReleaseOptions{Name: "work", Namespace: "ns", Revision: 1, IsInstall: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	out, err := engine.Render(c, vals)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for name, s := range out {
		if s = strings.TrimSpace(s); s != "" {
			m[name] = s
		}
	}
	return m
}

// The envtest specs' Job stays as it was; a version "<n>-ready<seconds>" selects the
// Deployment, Ready after those seconds, instead.
func TestVersionSelectsTheWork(t *testing.T) {
	job := `apiVersion: batch/v1
kind: Job
metadata:
  name: work-work-2
  labels:
    app.kubernetes.io/instance: work
    app.kubernetes.io/version: "2"
spec:
  backoffLimit: 0
  template:
    spec:
      restartPolicy: Never
      containers:
        - name: work
          image: busybox:1.37
          command: ["sh", "-c", "echo work 2"]`
	got := render(t, "2")
	if len(got) != 1 || got["work/templates/job.yaml"] != job {
		t.Errorf("version 2: got %q, want only the Job %q", got, job)
	}

	got = render(t, "2-ready45")
	dep, ok := got["work/templates/deployment.yaml"]
	if len(got) != 1 || !ok {
		t.Fatalf("version 2-ready45: got %q, want only the Deployment", got)
	}
	for _, want := range []string{
		"kind: Deployment", "name: work-work\n  labels", "type: Recreate", `app.kubernetes.io/version: "2-ready45"`,
		"image: localhost/ready-after:test", `args: ["--ready-after=45s"]`, "path: /readyz",
	} {
		if !strings.Contains(dep, want) {
			t.Errorf("version 2-ready45: the Deployment lacks %q:\n%s", want, dep)
		}
	}
}
