package runnable

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/quiesce-dev/quiesce/drain"
)

// The metrics are process-wide, like controller-runtime's own: one set in metrics.Registry,
// summed over every executor a Runnable owns (a process usually has one). Labels stay
// low-cardinality: the only label is the controller, the call name's first segment.
var (
	callSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "quiesce_call_duration_seconds",
		Help:    "How long tracked calls ran, by controller (the first segment of the call name).",
		Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
	}, []string{"controller"})

	drainSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "quiesce_drain_duration_seconds",
		Help:    "How long draining the executor took at shutdown.",
		Buckets: []float64{.001, .01, .1, .5, 1, 2.5, 5, 10, 20, 30, 60},
	})

	statsDescs = struct {
		inFlight, started, refused, panicked, abandoned *prometheus.Desc
	}{
		inFlight:  prometheus.NewDesc("quiesce_calls_in_flight", "Tracked calls admitted and not yet returned.", nil, nil),
		started:   prometheus.NewDesc("quiesce_calls_started_total", "Tracked calls started.", nil, nil),
		refused:   prometheus.NewDesc("quiesce_calls_refused_total", "Calls refused because the executor was draining.", nil, nil),
		panicked:  prometheus.NewDesc("quiesce_calls_panicked_total", "Tracked calls that panicked.", nil, nil),
		abandoned: prometheus.NewDesc("quiesce_calls_abandoned_total", "Tracked calls still running when the grace period ended.", nil, nil),
	}

	stats = &statsCollector{}
)

func init() {
	metrics.Registry.MustRegister(callSeconds, drainSeconds, stats)
}

// observeCall records a call's duration.
func observeCall(controller string, took time.Duration, _ error) {
	callSeconds.WithLabelValues(controller).Observe(took.Seconds())
}

// statsCollector turns the executors' counters into metrics when they are scraped, so that
// the hot path of a call touches no Prometheus code.
type statsCollector struct {
	mu        sync.Mutex
	executors []*drain.Executor // every executor ever owned: counters must not go down
}

func registerStats(ex *drain.Executor) {
	stats.mu.Lock()
	defer stats.mu.Unlock()
	stats.executors = append(stats.executors, ex)
}

func (c *statsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- statsDescs.inFlight
	ch <- statsDescs.started
	ch <- statsDescs.refused
	ch <- statsDescs.panicked
	ch <- statsDescs.abandoned
}

func (c *statsCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	var sum drain.Stats
	for _, ex := range c.executors {
		s := ex.Stats()
		sum.InFlight += s.InFlight
		sum.Started += s.Started
		sum.Refused += s.Refused
		sum.Panicked += s.Panicked
		sum.Abandoned += s.Abandoned
	}
	c.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(statsDescs.inFlight, prometheus.GaugeValue, float64(sum.InFlight))
	ch <- prometheus.MustNewConstMetric(statsDescs.started, prometheus.CounterValue, float64(sum.Started))
	ch <- prometheus.MustNewConstMetric(statsDescs.refused, prometheus.CounterValue, float64(sum.Refused))
	ch <- prometheus.MustNewConstMetric(statsDescs.panicked, prometheus.CounterValue, float64(sum.Panicked))
	ch <- prometheus.MustNewConstMetric(statsDescs.abandoned, prometheus.CounterValue, float64(sum.Abandoned))
}
