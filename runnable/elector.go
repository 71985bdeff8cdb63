package runnable

import (
	"cmp"
	"errors"
	"fmt"
	"time"

	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/quiesce-dev/quiesce/internal"
)

// LockOptions are the timings of the elector that uses a lock given to WrapLock: set each
// to the field of the same name of its leaderelection.LeaderElectionConfig. Zero values
// mean 15s, 10s and 2s, the defaults of controller-runtime and kube-controller-manager.
type LockOptions struct {
	LeaseDuration time.Duration
	RenewDeadline time.Duration
	RetryPeriod   time.Duration
}

// WrapLock returns lock wrapped for a leader elector of the operator's own, such as client-go's
// leaderelection.RunOrDie, with the manager's leader election off. The Runnable then fences
// (see LeaseLost) when the lease is lost: no successful renewal within RetryPeriod +
// RenewDeadline after the last one (at most LeaseDuration), or another holder seen; from
// then on the wrapped lock writes the lease no more. Once the stop began it does not acquire
// a lease it does not hold. Call it once, before the elector runs; it does not block.
//
// It panics on misuse, found at setup: a nil lock, a lock wrapped already (by WrapLock or
// by Setup), a second WrapLock, a Runnable of Setup with the manager's leader election on
// (Setup fences that lock already), or timings client-go's elector refuses.
func (r *Runnable) WrapLock(lock resourcelock.Interface, opts LockOptions) resourcelock.Interface {
	l, err := r.wrapLock(lock, opts)
	if err != nil {
		panic("runnable.WrapLock: " + err.Error())
	}
	return l
}

func (r *Runnable) wrapLock(lock resourcelock.Interface, opts LockOptions) (*leaseObserver, error) {
	_, observed := lock.(*leaseObserver)
	_, off := lock.(*electionOff)
	switch {
	case internal.IsNil(lock):
		return nil, errors.New("nil lock")
	case observed || off:
		return nil, errors.New("the lock is quiesce's already: wrap the lock the elector would use without quiesce")
	case r.setup != nil && (r.setup.lease != nil || r.setup.mgrOpts.LeaderElection):
		return nil, errors.New("the manager's leader election is on, and runnable.Setup fences its lock " +
			"already: turn it off to use an elector of your own")
	}
	l := &leaseObserver{inner: lock, r: r,
		leaseDuration: cmp.Or(opts.LeaseDuration, defaultLeaseDuration),
		renewDeadline: cmp.Or(opts.RenewDeadline, defaultRenewDeadline),
		retryPeriod:   cmp.Or(opts.RetryPeriod, defaultRetryPeriod)}
	switch {
	case opts.LeaseDuration < 0 || opts.RenewDeadline < 0 || opts.RetryPeriod < 0:
		return nil, fmt.Errorf("negative LockOptions %+v: set the elector's timings, or 0 for the defaults", opts)
	case l.leaseDuration <= l.renewDeadline:
		return nil, fmt.Errorf("LockOptions.LeaseDuration (%v) must be greater than RenewDeadline (%v)",
			l.leaseDuration, l.renewDeadline)
	case l.renewDeadline <= time.Duration(leaderelection.JitterFactor*float64(l.retryPeriod)):
		return nil, fmt.Errorf("LockOptions.RenewDeadline (%v) must be greater than %v times RetryPeriod (%v)",
			l.renewDeadline, leaderelection.JitterFactor, l.retryPeriod)
	}
	if !r.lease.CompareAndSwap(nil, l) {
		return nil, errors.New("called twice: wrap one lock per Runnable")
	}
	return l, nil
}

// LeaseLost fences at once, for an elector without a client-go lock: call it when this
// replica stops leading (its OnStoppedLeading), with why; cause is logged. The stop and the
// drain begin, whatever ShutdownDelay; the context of every tracked call ends with the cause
// "leader election lost", cleanup time included (the calls stay tracked and reported);
// locks of WrapLock and Setup write the lease no more; and the context of StopContext ends,
// unless the manager's own leader election is on (its elector stops the manager). It
// returns once those contexts ended. Safe from any goroutine; calls after the first do
// nothing.
func (r *Runnable) LeaseLost(cause error) {
	reason := "LeaseLost called"
	if !internal.IsNil(cause) {
		reason = internal.Cut(cause.Error())
	}
	r.fence(reason)
}
