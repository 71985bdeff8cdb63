package runnable

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	clocktesting "k8s.io/utils/clock/testing"
)

// flakyLock is a fakeLock whose writes fail while failing is set.
type flakyLock struct {
	fakeLock
	mu      sync.Mutex
	failing bool
}

func (f *flakyLock) setFailing(b bool) { f.mu.Lock(); f.failing = b; f.mu.Unlock() }

func (f *flakyLock) Update(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	f.mu.Lock()
	failing := f.failing
	f.mu.Unlock()
	if failing {
		return errors.New("the API server is away")
	}
	return f.fakeLock.Update(ctx, ler)
}

func (f *flakyLock) Create(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	return f.Update(ctx, ler)
}

// retryPeriod is the elector's in these tests: 3s, so that its attempts (3s, 6s, 9s, 12s after
// a renewal) fall between RenewDeadline (10s) and RetryPeriod + RenewDeadline (13s), never
// at the same instant as either.
const retryPeriod = 3 * time.Second

// elect runs client-go's own elector, with controller-runtime's default durations but
// retryPeriod, on an
// observer of lock connected to a Runnable; stopped is closed when the elector gives up.
func elect(ctx context.Context, t *testing.T, lock *flakyLock) (x *leased, leading, stopped <-chan struct{}) {
	t.Helper()
	x = newLeased(t, Options{}, defaultRenewDeadline)
	x.l.inner = lock
	x.l.retryPeriod, x.l.leaseDuration = retryPeriod, defaultLeaseDuration
	lead, stop := make(chan struct{}), make(chan struct{})
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: x.l, LeaseDuration: defaultLeaseDuration, RenewDeadline: defaultRenewDeadline,
		RetryPeriod: retryPeriod,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) { close(lead) },
			OnStoppedLeading: func() { close(stop) },
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	go le.Run(ctx)
	return x, lead, stop
}

// The fence stands against client-go's elector itself: a renewal the elector still makes
// after RenewDeadline (it waits RetryPeriod after a renewal, then retries for RenewDeadline)
// is not refused, and when the elector gives the lease up, quiesce has fenced already.
func TestFenceMatchesClientGosElector(t *testing.T) {
	t.Run("a late renewal the elector makes is accepted", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			lock := &flakyLock{fakeLock: fakeLock{id: "me"}}
			x, lead, stopped := elect(ctx, t, lock)
			<-lead
			synctest.Wait()
			renewed := time.Now()
			lock.setFailing(true)
			// 11s after the last renewal: past RenewDeadline (10s); the elector's attempt at
			// 12s is within RetryPeriod + RenewDeadline (13s).
			time.Sleep(11 * time.Second)
			lock.setFailing(false)
			time.Sleep(10 * time.Second)
			synctest.Wait()
			select {
			case <-stopped:
				t.Fatalf("client-go's elector gave the lease up (%v after the renewal): a renewal was refused", time.Since(renewed))
			default:
			}
			x.l.mu.Lock()
			lost := x.l.lost
			x.l.mu.Unlock()
			if lost {
				t.Fatal("quiesce fenced a lease the elector still renews")
			}
			cancel()
			<-stopped
		})
	})
	t.Run("the fence comes no later than the elector's give-up", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			lock := &flakyLock{fakeLock: fakeLock{id: "me"}}
			x, lead, stopped := elect(t.Context(), t, lock)
			release := make(chan struct{})
			ended := x.call(t, release)
			<-lead
			synctest.Wait()
			lock.setFailing(true)
			start := time.Now()
			var fenced, gaveUp time.Duration
			for fenced == 0 || gaveUp == 0 {
				select {
				case cause := <-ended:
					if !errors.Is(cause, errLeadershipLost) {
						t.Fatalf("the call ended with %v, want %v", cause, errLeadershipLost)
					}
					fenced = time.Since(start)
					ended = nil
				case <-stopped:
					gaveUp = time.Since(start)
					stopped = nil
				}
			}
			if fenced > gaveUp || gaveUp-fenced > retryPeriod {
				t.Fatalf("fenced %v and the elector gave up %v after writes began failing: want the fence first, within RetryPeriod", fenced, gaveUp)
			}
			close(release)
			<-x.r.Done()
		})
	})
}

// Under a fake clock, whose Step runs timer callbacks under its own lock, the fence's
// timer does not call the clock there: Step returns, and the fence happens.
func TestFenceUnderAFakeClock(t *testing.T) {
	fc := clocktesting.NewFakeClock(time.Now())
	x := newLeased(t, Options{Clock: fc}, 3*time.Second)
	release := make(chan struct{})
	ended := x.call(t, release)
	if err := x.renew(); err != nil {
		t.Fatal(err)
	}
	stepped := make(chan struct{})
	go func() { fc.Step(4 * time.Second); close(stepped) }()
	select {
	case <-stepped:
	case <-time.After(time.Minute): // a bound on a deadlock, not a wait for a state
		t.Fatal("FakeClock.Step deadlocked on the fence's timer")
	}
	if cause := <-ended; !errors.Is(cause, errLeadershipLost) {
		t.Fatalf("cause = %v, want %v", cause, errLeadershipLost)
	}
	close(release)
	<-x.r.Done()
}
