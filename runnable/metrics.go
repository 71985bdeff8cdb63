package runnable

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/internal/claims"
)

// The metrics are process-wide, like controller-runtime's; the only label is the controller.
const controllerLabel = "controller"

var (
	callSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "quiesce_call_duration_seconds",
		Help: "How long tracked calls ran, by the controller given to reconcilers.Wrap " +
			`("" for calls outside a wrapped reconciler).`,
		Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
	}, []string{controllerLabel})

	drainSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "quiesce_drain_duration_seconds",
		Help:    "How long draining the executor took at shutdown.",
		Buckets: []float64{.001, .01, .1, .5, 1, 2.5, 5, 10, 20, 30, 60},
	})

	// statsDescs: quiesce_calls_in_flight, then 5 counters, then 2 gauges (see Collect).
	statsDescs = [...]*prometheus.Desc{
		prometheus.NewDesc("quiesce_calls_in_flight", "Tracked calls admitted and not yet returned.", nil, nil),
		prometheus.NewDesc("quiesce_calls_started_total", "Tracked calls started.", nil, nil),
		prometheus.NewDesc("quiesce_calls_refused_total", "Calls refused because the executor was draining.", nil, nil),
		prometheus.NewDesc("quiesce_calls_panicked_total", "Tracked calls that panicked.", nil, nil),
		prometheus.NewDesc("quiesce_calls_abandoned_total",
			"Tracked calls still running when the grace period ended.", nil, nil),
		prometheus.NewDesc("quiesce_calls_cancelled_total",
			"Tracked calls whose contexts the drain cancelled while they ran (CancelAfter, or a controller's "+
				"reconcilers.CancelAtStop).", nil, nil),
		prometheus.NewDesc("quiesce_oldest_call_age_seconds",
			"Age of the oldest tracked call still running; 0 when none runs.", nil, nil),
		prometheus.NewDesc("quiesce_calls_slow",
			"Tracked calls running for longer than their executor's SlowAfter.", nil, nil),
	}

	// The claims of reconcilers.HandOffAtStop (docs/design.md, "Handing over").
	claimWaits = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quiesce_claim_waits_total",
		Help: "Reconciles of HandOffAtStop controllers requeued because another replica claims their object.",
	}, []string{controllerLabel})
	claimRenewalsFailed = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quiesce_claim_renewals_failed_total",
		Help: "Renewals of this replica's claims that failed.",
	}, []string{controllerLabel})
	claimFences = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quiesce_claim_fences_total",
		Help: "Reconciles whose contexts were ended because their claim was not renewed within the renew deadline.",
	}, []string{controllerLabel})
	claimsHeldDesc = prometheus.NewDesc("quiesce_claims_held",
		"Claims this replica holds for reconciles it finishes after handing the lease over.", nil, nil)

	stats = &statsCollector{live: make(map[*Runnable]struct{})}
)

// claimMetrics counts the claims' events in the metrics above (claims.Options' On hooks).
func claimMetrics(o *claims.Options) {
	o.OnWaited = func(c string) { claimWaits.WithLabelValues(c).Inc() }
	o.OnRenewFailed = func(c string) { claimRenewalsFailed.WithLabelValues(c).Inc() }
	o.OnFenced = func(c string) { claimFences.WithLabelValues(c).Inc() }
}

// register puts the metrics in metrics.Registry once, at the first Setup: a program that
// imports quiesce without using it exports nothing.
var register = sync.OnceValue(func() error {
	for _, c := range []prometheus.Collector{
		callSeconds, drainSeconds, claimWaits, claimRenewalsFailed, claimFences, stats,
	} {
		if err := metrics.Registry.Register(c); err != nil && !errors.As(err, new(prometheus.AlreadyRegisteredError)) {
			return fmt.Errorf("failed to register quiesce metrics: %w", err)
		}
	}
	return nil
})

// observeCall records a call's duration (the AfterCall of Setup's executors), with each
// controller's observer looked up once: WithLabelValues per call costs about 1% of the loop.
func observeCall(controller string, took time.Duration, _ error) {
	o, ok := callObservers.Load(controller)
	if !ok {
		o, _ = callObservers.LoadOrStore(controller, callSeconds.WithLabelValues(controller))
	}
	o.(prometheus.Observer).Observe(took.Seconds())
}

var callObservers sync.Map // controller → callSeconds' prometheus.Observer; never reset

// statsCollector makes the executors' counters into metrics when scraped: a call touches no
// Prometheus code but its histogram. It holds each Runnable of Setup until its Start returns,
// then keeps only its counters (fold), so that a suite of many Runnables holds only those running.
type statsCollector struct {
	mu     sync.Mutex
	live   map[*Runnable]struct{}
	folded drain.Stats // totals of the Runnables that stopped; InFlight unused
}

func (c *statsCollector) track(r *Runnable) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.live[r] = struct{}{}
}

// fold adds the counters of r's executor to the totals and forgets r, if tracked.
func (c *statsCollector) fold(r *Runnable) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.live[r]; ok {
		delete(c.live, r)
		addCounters(&c.folded, r.ex.Stats())
	}
}

func addCounters(to *drain.Stats, s drain.Stats) {
	to.Started += s.Started
	to.Refused += s.Refused
	to.Panicked += s.Panicked
	to.Abandoned += s.Abandoned
	to.Cancelled += s.Cancelled
}

func (c *statsCollector) Describe(ch chan<- *prometheus.Desc) { prometheus.DescribeByCollect(c, ch) }

func (c *statsCollector) Collect(ch chan<- prometheus.Metric) {
	var oldest time.Duration
	var slow int64
	held := 0
	c.mu.Lock()
	sum := c.folded
	for r := range c.live {
		s := r.ex.Stats()
		addCounters(&sum, s)
		sum.InFlight += s.InFlight
		if !s.Oldest.IsZero() {
			oldest = max(oldest, r.clock.Since(s.Oldest))
		}
		slow += s.Slow
		if r.claims != nil {
			_, n := r.claims.Held(0)
			held += n
		}
	}
	c.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(claimsHeldDesc, prometheus.GaugeValue, float64(held))
	for i, v := range []float64{float64(sum.InFlight), float64(sum.Started), float64(sum.Refused),
		float64(sum.Panicked), float64(sum.Abandoned), float64(sum.Cancelled), oldest.Seconds(), float64(slow)} {
		typ := prometheus.CounterValue
		if i == 0 || i > 5 {
			typ = prometheus.GaugeValue
		}
		ch <- prometheus.MustNewConstMetric(statsDescs[i], typ, v)
	}
}
