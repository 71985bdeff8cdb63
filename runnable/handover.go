package runnable

import (
	"context"
	"sync"

	"golang.org/x/sync/errgroup"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/quiesce-dev/quiesce/internal/claims"
)

// newClaims returns the claims of reconcilers.HandOffAtStop, in the lease's namespace (the
// lock's, else ns) and cluster, held under the lock's identity and timed by its elector's
// timings, and gives them to the executor; nil, refusing the policy at Wrap, when the
// namespace or the cluster is unknown.
func newClaims(l *leaseObserver, ns string, r *Runnable) *claims.Registry {
	if ll, ok := l.inner.(*resourcelock.LeaseLock); ok {
		ns = ll.LeaseMeta.Namespace
	}
	if ns == "" || l.cfg == nil {
		return nil
	}
	cs, err := kubernetes.NewForConfig(l.cfg)
	if err != nil {
		return nil
	}
	o := claims.Options{Leases: cs.CoordinationV1().Leases(ns), Identity: l.inner.Identity(),
		RenewDeadline: l.renewDeadline, RetryPeriod: l.retryPeriod, Clock: r.clock, Logger: r.log}
	claimMetrics(&o)
	reg := claims.New(o)
	r.core().Settings().Claims = reg
	return reg
}

// maxClaimWrites bounds the claims handOver takes at once.
const maxClaimWrites = 64

// handOver runs beside the drain's first step, once the drain refuses new calls. If this
// replica leads, reconciles of HandOffAtStop controllers are in flight and no other
// reconcile is, it claims each one's object and, every claim taken, releases the lease
// through its lock (leaseObserver.handOver); it returns how many claims it holds then. Else,
// or when a claim fails (the claims taken are released) or the release does (they are kept),
// it returns 0 and the stop is FinishAtStop's: the lease is released when controller-runtime's
// stop ends.
func (r *Runnable) handOver() int {
	l := r.lease.Load()
	if l == nil {
		return 0
	}
	<-r.ex.Draining()
	calls := r.claims.InFlight()
	l.mu.Lock()
	leads := l.held && !l.lost
	l.mu.Unlock()
	if len(calls) == 0 || !leads || r.fenced.Load() {
		return 0
	}
	log := r.stopLog()
	ids := make(map[string]bool, len(calls))
	for _, c := range calls {
		ids[c.ReconcileID] = true
	}
	ents, _ := r.core().Entries(-1)
	for _, e := range ents { // a reconcile that would run beside the successor's
		if e.ReconcileID != "" && !ids[e.ReconcileID] {
			log.Info("Not handing the lease over: a reconcile of another stop policy is in flight",
				append(r.sinceStop(), "call", e.Name, "reconcileID", e.ReconcileID)...)
			return 0
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), l.renewDeadline)
	defer cancel()
	settings := r.core().Settings()
	var (
		mu    sync.Mutex
		taken []*claims.Call
	)
	giveUp := func(err error, msg string) int {
		for _, c := range taken {
			c.Release()
		}
		log.Error(err, msg, r.sinceStop()...)
		return 0
	}
	// Concurrently: one at a time, a loaded API server's round trips add up to seconds.
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(maxClaimWrites)
	for _, c := range calls {
		g.Go(func() error {
			ok, err := r.claims.Take(gctx, c, l.leaseDuration+settings.CleanupOf(c.Controller))
			if ok {
				mu.Lock()
				taken = append(taken, c)
				mu.Unlock()
			}
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return giveUp(err, "Not handing the lease over: a claim could not be taken")
	}
	if err := l.handOver(ctx); err != nil {
		// The claims are kept until their work returns: a release that failed may still
		// have been written, and a successor then honours them.
		log.Error(err, "Not handing the lease over", r.sinceStop()...)
		return 0
	}
	log.Info("Handed the lease over", append(r.sinceStop(), "claims", len(taken))...)
	return len(taken)
}
