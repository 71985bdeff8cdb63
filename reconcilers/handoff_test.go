package reconcilers_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/internal"
	"github.com/quiesce-dev/quiesce/reconcilers"
)

// fakeClaims holds the claims of other replicas by object name, and records what Wrap asks.
type fakeClaims struct {
	mu      sync.Mutex
	held    map[string]time.Duration // object name: time left
	waits   []string
	begun   []string
	ended   []string
	fence   error // Bind ends its context with it at once when set, and calls its onFence
	readErr error
	told    map[string]bool // objects whose claim Wait reported First
}

// Wait reports a claim held by "other-replica", First the first time for each object.
func (f *fakeClaims) Wait(_ context.Context, controller, namespace, name string) (internal.ClaimWait, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.waits = append(f.waits, controller+"/"+namespace+"/"+name)
	if f.held[name] == 0 {
		return internal.ClaimWait{}, f.readErr
	}
	first := !f.told[name]
	if f.told == nil {
		f.told = map[string]bool{}
	}
	f.told[name] = true
	return internal.ClaimWait{Left: f.held[name], Holder: "other-replica", First: first}, f.readErr
}

func (f *fakeClaims) Begin(_, _, name, _ string) internal.Claimed {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.begun = append(f.begun, name)
	return &fakeClaimed{f: f, name: name}
}

type fakeClaimed struct {
	f    *fakeClaims
	name string
	once sync.Once
}

func (c *fakeClaimed) Bind(ctx context.Context, onFence func()) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	if c.f.fence != nil {
		cancel(c.f.fence)
		if onFence != nil {
			onFence()
		}
	}
	return ctx, func() { cancel(nil) }
}

func (c *fakeClaimed) End() {
	c.once.Do(func() {
		c.f.mu.Lock()
		defer c.f.mu.Unlock()
		c.f.ended = append(c.f.ended, c.name)
	})
}

// free is the object no other replica claims.
const free = "free"

func handOffExecutor(claims *fakeClaims) *drain.Executor {
	ex := drain.New(drain.Options{})
	internal.Of(ex).Settings().Claims = claims
	return ex
}

// A reconcile of a HandOffAtStop controller reads its object's claim first: claimed by
// another replica, it is requeued after the time left, at most MaxClaimRecheck, without
// running; free, it runs, registered in flight until it returned.
func TestHandOffAtStopHonoursClaims(t *testing.T) {
	claims := &fakeClaims{held: map[string]time.Duration{"short": 700 * time.Millisecond, "long": time.Minute}}
	var ran []string
	w := reconcilers.Wrap(handOffExecutor(claims), "ctl", reconcile.Func(
		func(_ context.Context, req reconcile.Request) (reconcile.Result, error) {
			ran = append(ran, req.Name)
			return reconcile.Result{}, nil
		}), reconcilers.WrapOptions{Stop: reconcilers.HandOffAtStop})
	for name, want := range map[string]time.Duration{"short": 700 * time.Millisecond, "long": reconcilers.MaxClaimRecheck} {
		res, err := w.Reconcile(context.Background(), request("ns", name))
		if err != nil || res.RequeueAfter != want {
			t.Errorf("Reconcile(%s) = %+v, %v; want RequeueAfter %v, no error", name, res, err, want)
		}
	}
	if _, err := w.Reconcile(context.Background(), request("ns", free)); err != nil {
		t.Fatal(err)
	}
	if strings.Join(ran, ",") != free {
		t.Errorf("ran %q, want only the unclaimed object", ran)
	}
	if got := strings.Join(claims.waits, ","); got != "ctl/ns/short,ctl/ns/long,ctl/ns/"+free &&
		got != "ctl/ns/long,ctl/ns/short,ctl/ns/"+free {
		t.Errorf("claims read: %q, want each object's, once per reconcile", got)
	}
	if strings.Join(claims.begun, ",") != free || strings.Join(claims.ended, ",") != free {
		t.Errorf("begun %q, ended %q: want the run registered, and ended", claims.begun, claims.ended)
	}

	claims.readErr = errors.New("the API server is away")
	if _, err := w.Reconcile(context.Background(), request("ns", free)); !errors.Is(err, claims.readErr) {
		t.Errorf("Reconcile with the claim unreadable = %v, want its error", err)
	}
}

// A claim not renewed ends the reconcile's context, with the claim's cause.
func TestHandOffAtStopFencedByItsClaim(t *testing.T) {
	claims := &fakeClaims{fence: errors.New("claim claim-ctl-x not renewed")}
	var cause error
	w := reconcilers.Wrap(handOffExecutor(claims), "ctl", reconcile.Func(
		func(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
			<-ctx.Done()
			cause = context.Cause(ctx)
			return reconcile.Result{}, nil
		}), reconcilers.WrapOptions{Stop: reconcilers.HandOffAtStop})
	if _, err := w.Reconcile(context.Background(), request("ns", "x")); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(cause, claims.fence) {
		t.Errorf("the reconcile's context ended with %v, want the claim's cause", cause)
	}
}

// HandOffAtStop needs claims (a Runnable of runnable.Setup with leader election) and
// reconcile.Request requests: Wrap panics at setup otherwise; other policies read no claim.
func TestHandOffAtStopSetup(t *testing.T) {
	r := reconcile.Func(func(context.Context, reconcile.Request) (reconcile.Result, error) { return reconcile.Result{}, nil })
	for name, wrap := range map[string]func(){
		"no claims": func() {
			reconcilers.Wrap(drain.New(drain.Options{}), "ctl", r, reconcilers.WrapOptions{Stop: reconcilers.HandOffAtStop})
		},
		"nil executor": func() { reconcilers.Wrap(nil, "ctl", r, reconcilers.WrapOptions{Stop: reconcilers.HandOffAtStop}) },
		"typed": func() {
			reconcilers.WrapTyped(handOffExecutor(&fakeClaims{}), "ctl", reconcile.TypedFunc[string](
				func(context.Context, string) (reconcile.Result, error) { return reconcile.Result{}, nil }),
				reconcilers.WrapOptions{Stop: reconcilers.HandOffAtStop})
		},
	} {
		func() {
			defer func() {
				if p, _ := recover().(string); !strings.Contains(p, "HandOffAtStop") {
					t.Errorf("%s: panic %q, want one naming HandOffAtStop", name, p)
				}
			}()
			wrap()
		}()
	}
	claims := &fakeClaims{held: map[string]time.Duration{"x": time.Minute}}
	w := reconcilers.Wrap(handOffExecutor(claims), "ctl", r, reconcilers.WrapOptions{})
	if res, err := w.Reconcile(context.Background(), request("ns", "x")); err != nil || res.RequeueAfter != 0 || len(claims.waits) != 0 {
		t.Errorf("FinishAtStop: %+v, %v, claims read %q; want it run, no claim read", res, err, claims.waits)
	}
}

// With a Recorder, a reconcile requeued on another replica's claim records one Normal
// ClaimWaited Event per holder (Wait's First), not one per requeue; a reconcile whose claim
// was not renewed records a Warning ClaimNotRenewed Event.
func TestHandOffAtStopEvents(t *testing.T) {
	claims := &fakeClaims{held: map[string]time.Duration{"a": time.Minute}}
	rec := &recorder{}
	opts := eventOptions(rec, eventsClient(interceptor.Funcs{}))
	opts.Stop = reconcilers.HandOffAtStop
	ex := handOffExecutor(claims)
	w := reconcilers.Wrap(ex, "cms", reconcile.Func(
		func(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
			<-ctx.Done() // with claims.fence set, ended at once
			return reconcile.Result{}, nil
		}), opts)
	for range 3 {
		if res, err := w.Reconcile(context.Background(), request("ns", "a")); err != nil || res.RequeueAfter == 0 {
			t.Fatalf("Reconcile(a) = %+v, %v; want requeued", res, err)
		}
	}
	evs := rec.all()
	if reasons(evs) != "a:"+reconcilers.ReasonClaimWaited {
		t.Fatalf("Events after 3 requeues: %q, want one ClaimWaited on a", reasons(evs))
	}
	if e := evs[0]; e.typ != corev1.EventTypeNormal || !strings.Contains(e.note, "other-replica") || !strings.Contains(e.note, "1m0s") {
		t.Errorf("ClaimWaited Event: %s %q, want Normal, naming the holder and the time left", e.typ, e.note)
	}

	claims.fence = errors.New("claim claim-cms-b not renewed")
	if _, err := w.Reconcile(context.Background(), request("ns", "b")); err != nil {
		t.Fatal(err)
	}
	evs = rec.all()
	if reasons(evs) != "a:"+reconcilers.ReasonClaimWaited+",b:"+reconcilers.ReasonClaimNotRenewed {
		t.Fatalf("Events: %q, want ClaimNotRenewed on b after ClaimWaited on a", reasons(evs))
	}
	if e := evs[1]; e.typ != corev1.EventTypeWarning || !strings.Contains(e.note, "Claim not renewed") {
		t.Errorf("ClaimNotRenewed Event: %s %q, want a Warning saying the claim was not renewed", e.typ, e.note)
	}

	// Without a Recorder: the same reconciles record nothing and run as before.
	claims2 := &fakeClaims{held: map[string]time.Duration{"a": time.Minute}, fence: claims.fence}
	plain := reconcilers.Wrap(handOffExecutor(claims2), "cms", reconcile.Func(
		func(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
			<-ctx.Done()
			return reconcile.Result{}, nil
		}), reconcilers.WrapOptions{Stop: reconcilers.HandOffAtStop})
	for _, name := range []string{"a", "b"} {
		if _, err := plain.Reconcile(context.Background(), request("ns", name)); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(rec.all()); n != 2 {
		t.Errorf("%d Events, want still 2: a Wrap without a Recorder records none", n)
	}
}
