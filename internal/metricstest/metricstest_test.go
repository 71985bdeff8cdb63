package metricstest_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/quiesce-dev/quiesce/internal/metricstest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const calls, ctrl, reason = "metricstest_calls_total", "controller", "reason"

func TestValue(t *testing.T) {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: calls, Help: "h"},
		[]string{ctrl, reason})
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "metricstest_seconds", Help: "h"})
	metrics.Registry.MustRegister(c, h)
	t.Cleanup(func() { metrics.Registry.Unregister(c); metrics.Registry.Unregister(h) })
	c.WithLabelValues("a", "x").Add(2)
	c.WithLabelValues("b", "y").Add(3)
	h.Observe(1)
	h.Observe(2)
	for _, tc := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{calls, map[string]string{ctrl: "b", reason: "y"}, 3},
		{calls, map[string]string{ctrl: "a"}, 2},
		{calls, map[string]string{ctrl: "a", reason: "y"}, 0},
		{calls, nil, 2},
		{"metricstest_seconds", nil, 2},
		{"metricstest_none", nil, 0},
	} {
		if got := metricstest.Value(t, tc.name, tc.labels); got != tc.want {
			t.Errorf("Value(%s, %v) = %v, want %v", tc.name, tc.labels, got, tc.want)
		}
	}
}
