package metricstest

import (
	dto "github.com/prometheus/client_model/go"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// T is what Value needs of a test: *testing.T, or Ginkgo's GinkgoT().
type T interface {
	Helper()
	Fatal(args ...any)
}

// Value returns the first sample of the metric name in metrics.Registry whose labels include
// labels (nil: any): a counter's or a gauge's value, a histogram's count; 0 if there is none.
// A failed Gather fails t.
func Value(t T, name string, labels map[string]string) float64 {
	t.Helper()
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if has(m, labels) {
				switch {
				case m.GetCounter() != nil:
					return m.GetCounter().GetValue()
				case m.GetGauge() != nil:
					return m.GetGauge().GetValue()
				case m.GetHistogram() != nil:
					return float64(m.GetHistogram().GetSampleCount())
				}
			}
		}
	}
	return 0
}

// has reports whether m has each of labels.
func has(m *dto.Metric, labels map[string]string) bool {
	found := 0
	for _, l := range m.GetLabel() {
		if v, ok := labels[l.GetName()]; ok && v == l.GetValue() {
			found++
		}
	}
	return found == len(labels)
}
