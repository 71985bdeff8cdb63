package runnable_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/quiesce-dev/quiesce/runnable"
)

// metricsChild is set in the environment of the process TestMetricsRegisteredAtSetup starts:
// a fresh process, where no Setup ran yet.
const metricsChild = "QUIESCE_METRICS_CHILD"

// Importing quiesce registers no metric; the first Setup does.
func TestMetricsRegisteredAtSetup(t *testing.T) {
	if os.Getenv(metricsChild) == "" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestMetricsRegisteredAtSetup$")
		cmd.Env = append(os.Environ(), metricsChild+"=1")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("the child process failed: %v\n%s", err, out)
		}
		return
	}
	registered := func() bool {
		t.Helper()
		families, err := metrics.Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range families {
			if strings.HasPrefix(f.GetName(), "quiesce_") {
				return true
			}
		}
		return false
	}
	if registered() {
		t.Fatal("quiesce metrics are in metrics.Registry before any Setup")
	}
	if _, err := runnable.Setup(&rest.Config{}, &ctrl.Options{}, runnable.Options{}); err != nil {
		t.Fatal(err)
	}
	if !registered() {
		t.Fatal("quiesce metrics are not in metrics.Registry after Setup")
	}
}
