package runnable

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// timedLock is a flakyLock that records when its last successful write was sent.
type timedLock struct {
	flakyLock
	mu   sync.Mutex
	last time.Time
}

func (l *timedLock) Update(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	sent := time.Now()
	if err := l.flakyLock.Update(ctx, ler); err != nil {
		return err
	}
	l.mu.Lock()
	l.last = sent
	l.mu.Unlock()
	return nil
}

func (l *timedLock) Create(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	return l.Update(ctx, ler)
}

func (l *timedLock) lastWrite() time.Time { l.mu.Lock(); defer l.mu.Unlock(); return l.last }

// ownElector is an operator's main with an elector of its own: a Runnable of New (no
// manager) whose StopContext is the manager's context, and client-go's elector on the lock
// it wrapped, with controller-runtime's default durations but retryPeriod.
type ownElector struct {
	r       *Runnable
	logs    *lines
	lock    *timedLock
	mgrCtx  context.Context // what mgr.Start would get
	signal  context.CancelFunc
	leading chan struct{}
	gaveUp  chan struct{}
}

func newOwnElector(t *testing.T, opts Options) *ownElector {
	t.Helper()
	x := &ownElector{logs: &lines{}, lock: &timedLock{flakyLock: flakyLock{fakeLock: fakeLock{id: "me"}}},
		leading: make(chan struct{}), gaveUp: make(chan struct{})}
	opts.Logger = x.logs.logger()
	x.r = NewUnmanaged(opts)
	var signal context.Context
	signal, x.signal = context.WithCancel(context.Background())
	x.mgrCtx = x.r.StopContext(signal)
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:          x.r.WrapLock(x.lock, LockOptions{RetryPeriod: retryPeriod}),
		LeaseDuration: defaultLeaseDuration, RenewDeadline: defaultRenewDeadline, RetryPeriod: retryPeriod,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) { close(x.leading) },
			OnStoppedLeading: func() { close(x.gaveUp) },
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	go le.Run(t.Context())
	return x
}

// call starts a tracked call that waits for its context, and reports when and why it
// ended; it returns once release is closed.
func (x *ownElector) call(t *testing.T, release <-chan struct{}) <-chan error {
	t.Helper()
	return (&leased{r: x.r}).call(t, release)
}

// Under client-go's elector on a lock of WrapLock, when the renewals fail: every tracked
// context and the manager's context end at RetryPeriod + RenewDeadline after the last
// successful renewal, with the cause "leader election lost", no later than the elector gives
// up; in steady state and inside ShutdownDelay, whose rest is skipped. Fails on the code
// before: the elector gave up and quiesce never fenced.
func TestWrapLockFencesUnderTheOperatorsElector(t *testing.T) {
	for _, tc := range []struct {
		name string
		stop bool // SIGTERM a second before the renewals fail, in the delay
	}{{"steady state", false}, {"inside the shutdown delay", true}} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				x := newOwnElector(t, Options{ShutdownDelay: time.Minute, GracePeriod: 20 * time.Second})
				release := make(chan struct{})
				ended := x.call(t, release)
				<-x.leading
				synctest.Wait()
				mgrEnded := make(chan time.Time, 1)
				context.AfterFunc(x.mgrCtx, func() { mgrEnded <- time.Now() })
				if tc.stop {
					x.signal()
					time.Sleep(time.Second)
					if x.r.drainStarted.Load() {
						t.Fatal("the drain began inside the shutdown delay, before any loss")
					}
				}
				x.lock.setFailing(true)
				cause := <-ended
				fenced := time.Now()
				if took := fenced.Sub(x.lock.lastWrite()); took != retryPeriod+defaultRenewDeadline ||
					!errors.Is(cause, errLeadershipLost) {
					t.Fatalf("the call ended %v after the last renewal with %v, want %v and %v",
						took, cause, retryPeriod+defaultRenewDeadline, errLeadershipLost)
				}
				synctest.Wait()
				select {
				case at := <-mgrEnded:
					if !at.Equal(fenced) || !errors.Is(context.Cause(x.mgrCtx), errLeadershipLost) {
						t.Errorf("the manager's context ended at %v with %v, want at the fence (%v) with %v",
							at, context.Cause(x.mgrCtx), fenced, errLeadershipLost)
					}
				default:
					t.Errorf("the manager's context did not end at the fence")
				}
				<-x.gaveUp
				if gaveUp := time.Since(fenced); gaveUp > retryPeriod {
					t.Errorf("the elector gave up %v after the fence, want within RetryPeriod", gaveUp)
				}
				l := x.logs.line("Leadership lost: cancelling calls")
				for _, want := range []string{`"reason"="no renewal within the renew deadline"`, `"sinceLastRenewal"="13s"`,
					`"fenceAfter"="13s"`, `"cancelled"=1`} {
					if !strings.Contains(l, want) {
						t.Errorf("fence line = %q, want %s", l, want)
					}
				}
				close(release)
				<-x.r.Done()
				x.signal()
				time.Sleep(2 * time.Minute) // past the shutdown delay
				synctest.Wait()
				if l := x.logs.line("Shutdown delay over"); l != "" {
					t.Errorf("the shutdown delay ran on after the fence: %s", l)
				}
			})
		})
	}
}

// LeaseLost fences at once, from any number of goroutines, once: every tracked context and
// the manager's end with "leader election lost", one line gives the cause, and the lock of
// WrapLock writes the lease no more, so client-go's elector gives it up.
func TestLeaseLostFencesAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		x := newOwnElector(t, Options{ShutdownDelay: time.Minute})
		release := make(chan struct{})
		ended := x.call(t, release)
		<-x.leading
		synctest.Wait()
		writes := x.lock.writesSeen()
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() { x.r.LeaseLost(errors.New("the operator's elector stopped leading")) })
		}
		wg.Wait()
		// No time passes in the bubble: the call saw its context end at the instant of
		// LeaseLost (reading ended without this Wait raced the call's goroutine).
		synctest.Wait()
		select {
		case cause := <-ended:
			if !errors.Is(cause, errLeadershipLost) {
				t.Errorf("the call ended with %v, want %v", cause, errLeadershipLost)
			}
		default:
			t.Fatal("LeaseLost returned before the call's context ended")
		}
		if !errors.Is(context.Cause(x.mgrCtx), errLeadershipLost) {
			t.Errorf("the manager's context: %v, want it ended with %v", context.Cause(x.mgrCtx), errLeadershipLost)
		}
		<-x.gaveUp
		if n := x.lock.writesSeen(); n != writes {
			t.Errorf("the lease was written %d times after LeaseLost", n-writes)
		}
		synctest.Wait()
		var fences []string
		for _, m := range x.logs.messages() {
			if m == "Leadership lost: cancelling calls" {
				fences = append(fences, m)
			}
		}
		if l := x.logs.line("Leadership lost: cancelling calls"); len(fences) != 1 ||
			!strings.Contains(l, `"reason"="the operator's elector stopped leading"`) || !strings.Contains(l, `"cancelled"=1`) {
			t.Errorf("%d fence lines, the first %q; want one with the cause", len(fences), l)
		}
		x.r.LeaseLost(nil) // later calls do nothing
		close(release)
		<-x.r.Done()
		if err := x.r.Err(); err != nil {
			t.Errorf("Err = %v", err)
		}
	})
}

// LeaseLost before the manager starts: StopContext's context is over from the start.
func TestLeaseLostBeforeStopContext(t *testing.T) {
	r := NewUnmanaged(Options{Logger: (&lines{}).logger()})
	r.LeaseLost(nil)
	if ctx := r.StopContext(context.Background()); !errors.Is(context.Cause(ctx), errLeadershipLost) {
		t.Errorf("StopContext after LeaseLost: %v, want ended with %v", context.Cause(ctx), errLeadershipLost)
	}
	<-r.Done()
}

// With the manager's own leader election, controller-runtime's elector stops the manager
// (mgr.Start returns its error "leader election lost"): the fence leaves the manager's
// context alone.
func TestFenceOfTheManagersLockLeavesItsContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		x := newLeased(t, Options{}, 3*time.Second)
		x.r.setup = &setupState{lease: x.l}
		mgrCtx := x.r.StopContext(context.Background())
		if err := x.renew(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Minute)
		<-x.r.Done()
		if x.logs.line("Leadership lost: cancelling calls") == "" {
			t.Fatal("no fence")
		}
		if err := mgrCtx.Err(); err != nil {
			t.Errorf("the manager's context ended (%v): mgr.Start would return nil, not controller-runtime's error", err)
		}
	})
}

// A replica whose stop began does not acquire the lease through a lock of WrapLock.
func TestWrapLockNoCampaigningOnceTheStopBegan(t *testing.T) {
	r := NewUnmanaged(Options{Logger: (&lines{}).logger()})
	inner := &fakeLock{id: "me"}
	lock := r.WrapLock(inner, LockOptions{})
	ctx, stop := context.WithCancel(context.Background())
	r.StopContext(ctx)
	stop()
	<-r.stop.stopping
	if err := lock.Create(context.Background(), heldBy("me")); !errors.Is(err, errNotCampaigning) {
		t.Errorf("Create to acquire during the stop = %v, want %v", err, errNotCampaigning)
	}
	if n := inner.writesSeen(); n != 0 {
		t.Errorf("the lease was written %d times during the stop", n)
	}
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
}

// WrapLock defaults to controller-runtime's timings, and panics on every assembly but one
// lock per Runnable with the manager's leader election off.
func TestWrapLockMisuse(t *testing.T) {
	l := NewUnmanaged(Options{}).WrapLock(&fakeLock{id: "me"}, LockOptions{}).(*leaseObserver)
	if l.leaseDuration != defaultLeaseDuration || l.renewDeadline != defaultRenewDeadline ||
		l.retryPeriod != defaultRetryPeriod || l.fenceAfter() != 12*time.Second {
		t.Errorf("WrapLock with zero LockOptions: %v, %v, %v; want controller-runtime's defaults",
			l.leaseDuration, l.renewDeadline, l.retryPeriod)
	}
	setup := func(election bool) *Runnable {
		mo := manager.Options{LeaderElection: election, LeaderElectionResourceLockInterface: &fakeLock{id: "me"}}
		r, err := Setup(&rest.Config{Host: noServer}, &mo, Options{})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	off := setup(false)
	if got := off.WrapLock(&fakeLock{id: "me"}, LockOptions{}); got == nil {
		t.Error("WrapLock on a Runnable of Setup without leader election = nil")
	}
	for _, tc := range []struct {
		name string
		wrap func()
		want string
	}{
		{"nil", func() { NewUnmanaged(Options{}).WrapLock(nil, LockOptions{}) }, "nil lock"},
		{"typed nil", func() { NewUnmanaged(Options{}).WrapLock((*fakeLock)(nil), LockOptions{}) }, "nil lock"},
		{"twice", func() { off.WrapLock(&fakeLock{id: "me"}, LockOptions{}) }, "called twice"},
		{"a wrapped lock", func() { NewUnmanaged(Options{}).WrapLock(l, LockOptions{}) }, "quiesce's already"},
		{"Setup's lock with leader election off", func() {
			mo := manager.Options{}
			if _, err := Setup(&rest.Config{Host: noServer}, &mo, Options{}); err != nil {
				t.Fatal(err)
			}
			NewUnmanaged(Options{}).WrapLock(mo.LeaderElectionResourceLockInterface, LockOptions{})
		}, "quiesce's already"},
		{"the manager's leader election on", func() { setup(true).WrapLock(&fakeLock{id: "me"}, LockOptions{}) },
			"the manager's leader election is on"},
		{"leader election turned on after Setup", func() {
			mo := manager.Options{}
			r, err := Setup(&rest.Config{Host: noServer}, &mo, Options{})
			if err != nil {
				t.Fatal(err)
			}
			mo.LeaderElection = true
			r.WrapLock(&fakeLock{id: "me"}, LockOptions{})
		}, "the manager's leader election is on"},
		{"LeaseDuration not above RenewDeadline", func() {
			NewUnmanaged(Options{}).WrapLock(&fakeLock{id: "me"}, LockOptions{LeaseDuration: 10 * time.Second})
		}, "LockOptions.LeaseDuration (10s) must be greater than RenewDeadline (10s)"},
		{"RenewDeadline within the jittered RetryPeriod", func() {
			NewUnmanaged(Options{}).WrapLock(&fakeLock{id: "me"}, LockOptions{RetryPeriod: 9 * time.Second})
		}, "LockOptions.RenewDeadline (10s) must be greater than 1.2 times RetryPeriod (9s)"},
		{"negative", func() {
			NewUnmanaged(Options{}).WrapLock(&fakeLock{id: "me"}, LockOptions{RetryPeriod: -time.Second})
		}, "negative LockOptions"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				p, _ := recover().(string)
				if !strings.HasPrefix(p, "runnable.WrapLock: ") || !strings.Contains(p, tc.want) {
					t.Errorf("panic = %q, want runnable.WrapLock: ...%s", p, tc.want)
				}
			}()
			tc.wrap()
		})
	}
}
