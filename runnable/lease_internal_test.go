package runnable

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// leaseID is the LeaderElectionID of the tests that build controller-runtime's lock.
const leaseID = "x.example.com"

// fakeLock is a resourcelock.Interface in memory: the lease as the API server keeps it.
type fakeLock struct {
	mu     sync.Mutex
	id     string
	rec    *resourcelock.LeaderElectionRecord
	fail   bool // the API server refuses writes
	writes int  // writes that reached it
}

func (f *fakeLock) Get(context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.rec == nil {
		return nil, nil, apierrors.NewNotFound(schema.GroupResource{Resource: "leases"}, "lease")
	}
	rec := *f.rec
	return &rec, nil, nil
}

func (f *fakeLock) Create(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	return f.Update(ctx, ler)
}

func (f *fakeLock) Update(_ context.Context, ler resourcelock.LeaderElectionRecord) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.writes++
	if f.fail {
		return errors.New("the API server is away")
	}
	f.rec = &ler
	return nil
}

func (f *fakeLock) set(holder string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rec = &resourcelock.LeaderElectionRecord{HolderIdentity: holder}
}

func (f *fakeLock) failWrites() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail = true
}

func (f *fakeLock) RecordEvent(string) {}
func (f *fakeLock) Identity() string   { return f.id }
func (f *fakeLock) Describe() string   { return "ns/lease" }
func (f *fakeLock) writesSeen() int    { f.mu.Lock(); defer f.mu.Unlock(); return f.writes }

// heldBy is a lease record written by holder.
func heldBy(holder string) resourcelock.LeaderElectionRecord {
	return resourcelock.LeaderElectionRecord{HolderIdentity: holder}
}

// leased is a Runnable whose lease an observer watches, connected as Add connects it.
type leased struct {
	r    *Runnable
	l    *leaseObserver
	lock *fakeLock
	logs *lines
}

func newLeased(t *testing.T, opts Options, renewDeadline time.Duration) *leased {
	t.Helper()
	logs := &lines{}
	opts.Logger = logs.logger()
	r := newRunnable(withDefaults(opts), false)
	lock := &fakeLock{id: "me"}
	l := &leaseObserver{inner: lock, renewDeadline: renewDeadline}
	l.r = r
	r.lease.Store(l)
	return &leased{r: r, l: l, lock: lock, logs: logs}
}

// renew is one renewal by the elector.
func (x *leased) renew() error { return x.l.Update(context.Background(), heldBy("me")) }

// call starts a tracked call that waits for its context, and reports when and why it ended;
// it returns once release is closed.
func (x *leased) call(t *testing.T, release <-chan struct{}) <-chan error {
	t.Helper()
	ended := make(chan error, 1)
	if err := x.r.ex.Go(context.Background(), "reconcile", func(ctx context.Context) error {
		<-ctx.Done()
		ended <- context.Cause(ctx)
		<-release
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return ended
}

// In steady state, with no renewal for RenewDeadline, every call's context ends at that
// very moment, with the cause, and one line says when the last renewal succeeded; the
// replica never writes the lease again, and the calls stay tracked until they return.
func TestLeaseFencesAtTheRenewDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		x := newLeased(t, Options{GracePeriod: 20 * time.Second}, 3*time.Second)
		release := make(chan struct{})
		ended := x.call(t, release)
		if err := x.renew(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		if err := x.renew(); err != nil {
			t.Fatal(err)
		}
		last := time.Now()
		cause := <-ended
		if took := time.Since(last); took != 3*time.Second || !errors.Is(cause, errLeadershipLost) {
			t.Fatalf("the call ended %v after the last renewal with %v, want 3s (RenewDeadline) and %v", took, cause, errLeadershipLost)
		}
		synctest.Wait()
		l := x.logs.line("Leadership lost: cancelling calls")
		for _, want := range []string{`"reason"="no renewal within the renew deadline"`, `"sinceLastRenewal"="3s"`,
			`"fenceAfter"="3s"`, `"cancelled"=1`, `"lastRenewal"="` + last.UTC().Format(time.RFC3339Nano)} {
			if !strings.Contains(l, want) {
				t.Errorf("fence line = %q, want %s", l, want)
			}
		}
		if p := x.r.Executor().Pending(); len(p) != 1 {
			t.Errorf("Pending after the fence = %+v, want the call still tracked", p)
		}
		if err := x.renew(); !errors.Is(err, errLeaseLost) {
			t.Errorf("a renewal after the fence = %v, want %v", err, errLeaseLost)
		}
		if n := x.lock.writesSeen(); n != 2 {
			t.Errorf("the lease was written %d times, want 2 (nothing after the fence)", n)
		}
		close(release)
		<-x.r.Done()
		if err := x.r.Err(); err != nil {
			t.Errorf("Err = %v", err)
		}
	})
}

// Renewals that keep succeeding never fence, however long it runs.
func TestRenewedLeaseNeverFences(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		x := newLeased(t, Options{}, 3*time.Second)
		release := make(chan struct{})
		ended := x.call(t, release)
		for range 30 {
			if err := x.renew(); err != nil {
				t.Fatal(err)
			}
			time.Sleep(2 * time.Second) // client-go's default RetryPeriod
		}
		select {
		case err := <-ended:
			t.Fatalf("the call ended with %v while the lease was renewed", err)
		default:
		}
		if m := x.logs.messages(); len(m) != 0 {
			t.Errorf("log = %q, want nothing", m)
		}
		// A planned stop: released, then drained (the call ends at CancelAfter).
		if err := x.l.Update(context.Background(), heldBy("")); err != nil {
			t.Fatal(err)
		}
		close(release)
		ctx, stop := context.WithCancel(context.Background())
		stop()
		if err := x.r.Start(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// A read that shows another holder of a lease this replica held fences at once.
func TestLeaseTakenFencesAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		x := newLeased(t, Options{}, 10*time.Second)
		release := make(chan struct{})
		defer close(release)
		ended := x.call(t, release)
		if err := x.renew(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		x.lock.set("thief")
		begin := time.Now()
		if _, _, err := x.l.Get(context.Background()); err != nil {
			t.Fatal(err)
		}
		if cause := <-ended; time.Since(begin) != 0 || !errors.Is(cause, errLeadershipLost) {
			t.Fatalf("the call ended %v after the read with %v, want at once", time.Since(begin), cause)
		}
		synctest.Wait()
		if l := x.logs.line("Leadership lost: cancelling calls"); !strings.Contains(l, `"reason"="another replica holds the lease"`) ||
			!strings.Contains(l, `"sinceLastRenewal"="1s"`) {
			t.Errorf("fence line = %q", l)
		}
	})
}

// A replica whose stop began never acquires a lease it does not hold; the holder renews
// it through its stop and releases it, and a release is no loss.
func TestNoCampaigningOnceTheStopBegan(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		standby := newLeased(t, Options{}, 3*time.Second)
		standby.lock.set("") // released by the old leader: free to take
		standby.r.beginStop()
		ctx := context.Background()
		if err := standby.l.Update(ctx, heldBy("me")); !errors.Is(err, errNotCampaigning) {
			t.Errorf("Update to acquire during the stop = %v, want %v", err, errNotCampaigning)
		}
		if err := standby.l.Create(ctx, heldBy("me")); !errors.Is(err, errNotCampaigning) {
			t.Errorf("Create to acquire during the stop = %v, want %v", err, errNotCampaigning)
		}
		if n := standby.lock.writesSeen(); n != 0 {
			t.Errorf("the standby wrote the lease %d times during its stop", n)
		}

		leader := newLeased(t, Options{}, 3*time.Second)
		if err := leader.renew(); err != nil {
			t.Fatal(err)
		}
		leader.r.beginStop()
		for range 5 {
			time.Sleep(time.Second)
			if err := leader.renew(); err != nil {
				t.Fatalf("the leader's renewal during its stop = %v", err)
			}
		}
		// LeaderElectionReleaseOnCancel: the elector writes an empty holder.
		if err := leader.l.Update(ctx, heldBy("")); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Minute)
		if l := leader.logs.line("Leadership lost: cancelling calls"); l != "" {
			t.Errorf("a released lease fenced: %s", l)
		}
		// A read after the release shows another holder: no loss either.
		leader.lock.set("next")
		if _, _, err := leader.l.Get(ctx); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if l := leader.logs.line("Leadership lost: cancelling calls"); l != "" {
			t.Errorf("a read after the release fenced: %s", l)
		}
	})
}

// A lease lost during the drain fences at the renew deadline, long before CancelAfter.
func TestLeaseLostDuringTheDrainFences(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		x := newLeased(t, Options{GracePeriod: 20 * time.Second}, 3*time.Second) // CancelAfter 16s
		release := make(chan struct{})
		ended := x.call(t, release)
		ctx, stop := context.WithCancel(context.Background())
		started := make(chan error, 1)
		go func() { started <- x.r.Start(ctx) }()
		if err := x.renew(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		stop() // the manager's stop: the drain begins, the leader keeps renewing
		synctest.Wait()
		if err := x.renew(); err != nil {
			t.Fatal(err)
		}
		last := time.Now()
		x.lock.failWrites() // from now on the API server refuses the renewals
		for range 5 {
			time.Sleep(500 * time.Millisecond)
			if err := x.renew(); err == nil {
				t.Fatal("a refused renewal succeeded")
			}
		}
		cause := <-ended
		if took := time.Since(last); took != 3*time.Second || !errors.Is(cause, errLeadershipLost) {
			t.Errorf("the call ended %v after the last renewal with %v, want 3s and %v", took, cause, errLeadershipLost)
		}
		close(release)
		if err := <-started; err != nil {
			t.Errorf("Start = %v", err)
		}
	})
}

func TestObserveLease(t *testing.T) {
	cfg := &rest.Config{Host: noServer}
	own := &fakeLock{id: "mine"}
	l, err := observeLease(cfg, &manager.Options{LeaderElection: true, LeaderElectionResourceLockInterface: own,
		RenewDeadline: ptr.To(7 * time.Second)})
	if err != nil || l.inner != own || l.renewDeadline != 7*time.Second || l.Identity() != "mine" {
		t.Fatalf("observeLease = %+v, %v; want the user's lock with RenewDeadline 7s", l, err)
	}
	l, err = observeLease(cfg, &manager.Options{LeaderElection: true, LeaderElectionID: leaseID, LeaderElectionNamespace: "ns"})
	if err != nil || l.renewDeadline != defaultRenewDeadline || !strings.Contains(l.Describe(), "ns/x.example.com") || l.Identity() == "" {
		t.Fatalf("observeLease = %+v, %v; want controller-runtime's lease lock for ns/x.example.com", l, err)
	}
	// A typed-nil lock is nil (quiesce's rule for plug-ins): controller-runtime's own lock.
	l, err = observeLease(cfg, &manager.Options{LeaderElection: true, LeaderElectionID: leaseID, LeaderElectionNamespace: "ns",
		LeaderElectionResourceLockInterface: (*fakeLock)(nil)})
	if err != nil || !strings.Contains(l.Describe(), "ns/x.example.com") {
		t.Fatalf("observeLease of a typed-nil lock = %+v, %v; want controller-runtime's lease lock", l, err)
	}
	if _, err := observeLease(cfg, &manager.Options{LeaderElection: true, LeaderElectionNamespace: "ns"}); err == nil ||
		!strings.Contains(err.Error(), "failed to observe the lease: LeaderElectionID must be configured") {
		t.Errorf("observeLease without LeaderElectionID = %v, want controller-runtime's error", err)
	}
	// Outside a cluster (make run), controller-runtime's lock needs a namespace: the error
	// says where to set it.
	if _, err := observeLease(cfg, &manager.Options{LeaderElection: true, LeaderElectionID: leaseID}); err == nil ||
		!strings.Contains(err.Error(), "set LeaderElectionNamespace") {
		t.Errorf("observeLease outside a cluster without LeaderElectionNamespace = %v, want an error naming it", err)
	}
	if _, err := observeLease(nil, &manager.Options{LeaderElection: true, LeaderElectionID: "x"}); err == nil {
		t.Error("observeLease with no rest.Config = nil, want an error")
	}
}

// The lock's Events go to the manager's recorder once Add connected it, and are dropped before.
func TestLockEventsForwarded(t *testing.T) {
	var events lockEvents
	rec := events.GetEventRecorderFor("id")
	pod := &corev1.Pod{}
	rec.Eventf(pod, corev1.EventTypeNormal, "LeaderElection", "dropped %d", 1)
	fake := record.NewFakeRecorder(2)
	events.connect(stubManager{events: fake})
	rec.Eventf(pod, corev1.EventTypeNormal, "LeaderElection", "id %s", "became leader")
	rec.Event(pod, corev1.EventTypeNormal, "LeaderElection", "plain")
	if got := []string{<-fake.Events, <-fake.Events}; got[0] != "Normal LeaderElection id became leader" || got[1] != "Normal LeaderElection plain" {
		t.Errorf("events = %q", got)
	}
	if len(fake.Events) != 0 {
		t.Error("an Event recorded before Add connected the recorder was kept")
	}
}

// A manager that leads without the lock of Setup (made before Setup, or from a copy of the
// Options with another lock) makes Start return an error naming the fix, once it says it
// leads (Elected); a manager that acquired the lease through the lock of Setup does not.
func TestLeadingWithoutTheLockOfSetupFails(t *testing.T) {
	for _, tc := range []struct {
		name     string
		acquired bool
	}{{"another lock", false}, {"the lock of Setup", true}} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				x := newLeased(t, Options{}, 3*time.Second)
				elected := make(chan struct{})
				x.r.elected = elected
				if tc.acquired {
					if err := x.renew(); err != nil {
						t.Fatal(err)
					}
				}
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				done := make(chan error, 1)
				go func() { done <- x.r.Start(ctx) }()
				synctest.Wait()
				select {
				case err := <-done:
					t.Fatalf("Start returned %v before the manager led", err)
				default:
				}
				close(elected)
				synctest.Wait()
				if tc.acquired {
					cancel()
				}
				err := <-done
				if got := err != nil; got == tc.acquired || (got && !strings.Contains(err.Error(), "before ctrl.NewManager(cfg, mgrOpts), with the same mgrOpts")) {
					t.Errorf("Start = %v, want an error naming the fix: %t", err, !tc.acquired)
				}
			})
		})
	}
}
