package drain_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/internal"
)

// The conformance of a call's context with the standard library's: each scenario runs
// twice, once on a tracked call's context and once on a reference made independently
// (context.WithCancelCause of the caller's ctx; shielded, of context.Background with the
// caller's deadline and values), and every observation of the context and of its children
// of every kind must be the same.

type confKey struct{}

var (
	errFence  = errors.New("fenced")
	errParent = errors.New("caller cancelled")
)

// A subject is one side of a scenario: the context under test and its caller's.
type subject struct {
	ctx          context.Context
	cancelParent context.CancelCauseFunc
	cancelCall   func(error) // the drain's Fence, or the standard cancel func
	children     []child
	start        time.Time // deadlines are shown from it: the two runs begin at different times
}

type child struct {
	kind  string
	ctx   context.Context
	fired *atomic.Bool // AfterFunc's f ran
	stop  func()       // releases it, if it has a cancel func
}

func (s *subject) release() {
	for _, c := range s.children {
		if c.stop != nil {
			c.stop()
		}
	}
}

// childKinds makes one child of each kind.
var childKinds = []struct {
	kind string
	make func(context.Context) child
}{
	{"WithCancel", func(p context.Context) child { c, stop := context.WithCancel(p); return child{ctx: c, stop: stop} }},
	{"WithCancelCause", func(p context.Context) child {
		c, stop := context.WithCancelCause(p)
		return child{ctx: c, stop: func() { stop(nil) }}
	}},
	{"WithTimeout", func(p context.Context) child {
		c, stop := context.WithTimeout(p, time.Hour)
		return child{ctx: c, stop: stop}
	}},
	{"WithDeadlineSooner", func(p context.Context) child {
		c, stop := context.WithDeadline(p, time.Now().Add(30*time.Second))
		return child{ctx: c, stop: stop}
	}},
	{"WithValue", func(p context.Context) child { return child{ctx: context.WithValue(p, confKey{}, "child")} }},
	{"WithValueThenCancel", func(p context.Context) child {
		c, stop := context.WithCancel(context.WithValue(p, confKey{}, "child"))
		return child{ctx: c, stop: stop}
	}},
	{"WithoutCancel", func(p context.Context) child { return child{ctx: context.WithoutCancel(p)} }},
	{"AfterFunc", func(p context.Context) child {
		fired := &atomic.Bool{}
		context.AfterFunc(p, func() { fired.Store(true) })
		return child{ctx: p, fired: fired}
	}},
	{"AfterFuncStopped", func(p context.Context) child {
		fired := &atomic.Bool{}
		stop := context.AfterFunc(p, func() { fired.Store(true) })
		stop()
		return child{ctx: p, fired: fired}
	}},
}

func (s *subject) addChildren(when string) {
	for _, k := range childKinds {
		c := k.make(s.ctx)
		c.kind = when + "/" + k.kind
		s.children = append(s.children, c)
	}
}

// observe describes everything the context and its children tell.
func (s *subject) observe() []string {
	synctest.Wait() // AfterFunc's goroutines, timers
	out := make([]string, 0, 1+len(s.children))
	out = append(out, describe(s.ctx, s.start, "ctx", nil))
	for _, c := range s.children {
		out = append(out, describe(c.ctx, s.start, c.kind, c.fired))
	}
	return out
}

func describe(ctx context.Context, start time.Time, what string, fired *atomic.Bool) string {
	err := ctx.Err() // first: before Done or Cause asked
	d, hasD := ctx.Deadline()
	var deadline string
	if hasD {
		deadline = d.Sub(start).String()
	}
	done := "open"
	select {
	case <-ctx.Done():
		done = "closed"
	default:
	}
	if ctx.Done() == nil {
		done = "nil"
	}
	s := fmt.Sprintf("%s: err=%v cause=%v done=%s deadline=%q value=%v",
		what, err, context.Cause(ctx), done, deadline, ctx.Value(confKey{}))
	if fired != nil {
		s += fmt.Sprintf(" afterFunc=%t", fired.Load())
	}
	return s
}

type step func(s *subject)

var (
	addBefore    step = func(s *subject) { s.addChildren("before") }
	addAfter     step = func(s *subject) { s.addChildren("after") }
	fence        step = func(s *subject) { s.cancelCall(errFence) }
	cancelParent step = func(s *subject) { s.cancelParent(errParent) }
	sleep2s      step = func(*subject) { time.Sleep(2 * time.Second) }
	askDone      step = func(s *subject) { _ = s.ctx.Done() }
	// The first end wins, even when nothing looked in between.
	cancelParentThenFence step = func(s *subject) { s.cancelParent(errParent); s.cancelCall(errFence) }
	sleepThenFence        step = func(s *subject) { time.Sleep(2 * time.Second); s.cancelCall(errFence) }
)

func TestCallContextConformance(t *testing.T) {
	scenarios := []struct {
		name    string
		timeout time.Duration // the caller's deadline, 0 for none
		inFn    []step        // while fn runs
		afterFn []step        // once it returned (its context ended with it)
	}{
		{name: "fn returns, nothing asked before", afterFn: []step{addAfter}},
		{name: "fn returns, children before", inFn: []step{addBefore}, afterFn: []step{addAfter}},
		{name: "fenced, children before and after", inFn: []step{addBefore, fence, addAfter}},
		{name: "fenced before anything asked", inFn: []step{fence, addAfter}},
		{name: "fenced after Done asked", inFn: []step{askDone, fence, addAfter}},
		{name: "caller cancelled, children before", inFn: []step{addBefore, cancelParent, addAfter, fence}},
		{name: "caller cancelled before anything asked", inFn: []step{cancelParent, addAfter, fence}},
		{name: "deadline passes, children before", timeout: time.Second, inFn: []step{addBefore, sleep2s, addAfter, fence}},
		{name: "deadline passes before anything asked", timeout: time.Second, inFn: []step{sleep2s, addAfter}},
		{name: "deadline, fenced first", timeout: time.Second, inFn: []step{addBefore, fence, sleep2s, addAfter}},
		{name: "caller cancelled, then fenced, nothing asked between", inFn: []step{cancelParentThenFence, addAfter}},
		{name: "deadline passes, then fenced, nothing asked between", timeout: time.Second, inFn: []step{sleepThenFence, addAfter}},
		{name: "deadline, caller cancelled first", timeout: time.Minute, inFn: []step{addBefore, cancelParent, addAfter}},
	}
	for _, shield := range []bool{false, true} {
		for _, sc := range scenarios {
			t.Run(fmt.Sprintf("shield=%t/%s", shield, sc.name), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					run := func(tracked bool) [][]string {
						var seen [][]string
						parent, cancelParent := context.WithCancelCause(context.WithValue(context.Background(), confKey{}, "caller"))
						defer cancelParent(nil)
						if sc.timeout > 0 {
							var stop context.CancelFunc
							parent, stop = context.WithTimeout(parent, sc.timeout)
							defer stop()
						}
						s := &subject{cancelParent: cancelParent, start: time.Now()}
						fn := func(ctx context.Context) error {
							s.ctx = ctx
							for _, st := range sc.inFn {
								st(s)
								seen = append(seen, s.observe())
							}
							return nil
						}
						if tracked {
							ex := drain.New(drain.Options{CancelAfter: -1})
							core := internal.Of(ex)
							core.Settings().Owned = true
							s.cancelCall = func(cause error) { core.Fence(cause) }
							if err := core.Run(parent, internal.CallOptions{Name: "conformance", Shield: shield}, fn); err != nil {
								t.Fatal(err)
							}
							if err := ex.Drain(context.Background()); err != nil {
								t.Fatal(err)
							}
						} else {
							base := parent
							if shield {
								base = context.Background()
								if d, ok := parent.Deadline(); ok {
									var stop context.CancelFunc
									base, stop = context.WithDeadline(base, d)
									defer stop()
								}
								base = valuesOf{Context: base, values: parent}
							}
							ctx, cancel := context.WithCancelCause(base)
							s.cancelCall = cancel
							_ = fn(ctx)
							cancel(errors.New("call returned"))
						}
						for _, st := range sc.afterFn {
							st(s)
						}
						seen = append(seen, s.observe())
						s.release()
						return seen
					}
					want, got := run(false), run(true)
					if len(got) != len(want) {
						t.Fatalf("observed %d times, want %d", len(got), len(want))
					}
					for i := range want {
						if len(got[i]) != len(want[i]) {
							t.Fatalf("observation %d: %d lines, want %d", i, len(got[i]), len(want[i]))
						}
						for j := range want[i] {
							if got[i][j] != want[i][j] {
								t.Errorf("observation %d:\n got  %s\n want %s", i, got[i][j], want[i][j])
							}
						}
					}
				})
			})
		}
	}
}

// valuesOf is a shielded reference context: ctx's cancellation and deadline, values's values.
type valuesOf struct {
	context.Context
	values context.Context
}

func (v valuesOf) Value(key any) any {
	if x := v.Context.Value(key); x != nil {
		return x
	}
	return v.values.Value(key)
}

// TestCallContextNoGoroutinePerChild counts the goroutines that children of a call's
// context start: none, for every kind, whether the call is shielded or not (a context the
// context package does not know would need one per child).
func TestCallContextNoGoroutinePerChild(t *testing.T) {
	for _, shield := range []bool{false, true} {
		t.Run(fmt.Sprintf("shield=%t", shield), func(t *testing.T) {
			ex := drain.New(drain.Options{})
			core := internal.Of(ex)
			core.Settings().Owned = true
			parent, cancel := context.WithTimeout(context.Background(), time.Hour)
			defer cancel()
			const n = 50
			var before, after int
			fired := atomic.Int32{}
			err := core.Run(parent, internal.CallOptions{Name: "children", Shield: shield}, func(ctx context.Context) error {
				before = runtime.NumGoroutine()
				for range n {
					for _, k := range childKinds {
						if c := k.make(ctx); c.stop != nil {
							defer c.stop()
						}
					}
					context.AfterFunc(ctx, func() { fired.Add(1) })
				}
				after = runtime.NumGoroutine()
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			// A goroutine per child would be n per kind at least; other tests' goroutines
			// may still be ending (the count can drop) but none of this test's may be left.
			if after-before >= n {
				t.Errorf("goroutines: %d before %d children, %d after", before, n*(len(childKinds)+1), after)
			}
			if err := ex.Drain(context.Background()); err != nil {
				t.Fatal(err)
			}
			// AfterFunc's funcs run once the call ended (each on a goroutine of its own, then).
			for fired.Load() != n {
				runtime.Gosched()
			}
		})
	}
}

// TestCallContextAllocations: a Run costs the allocations docs/performance.md lists (the
// call record, which is also the context answering for the call and its labels, and
// context.WithCancelCause's two), and no more: 3, shielded or not,
// for a caller's ctx without deadline nor labels.
func TestCallContextAllocations(t *testing.T) {
	ex := drain.New(drain.Options{})
	core := internal.Of(ex)
	core.Settings().Owned = true
	parent, cancel := context.WithCancel(context.WithValue(context.Background(), confKey{}, "caller"))
	defer cancel()
	values := func(ctx context.Context) error {
		if ctx.Value(confKey{}) != "caller" || ctx.Err() != nil {
			return errors.New("lost the caller's value")
		}
		return nil
	}
	for _, tc := range []struct {
		shield bool
		want   float64
	}{{false, 3}, {true, 3}} {
		opts := internal.CallOptions{Name: "allocs", Shield: tc.shield}
		var err error
		if n := testing.AllocsPerRun(100, func() { err = core.Run(parent, opts, values) }); n > tc.want {
			t.Errorf("shield=%t: %v allocations per Run, want at most %v", tc.shield, n, tc.want)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestCallContextDrainedBeforeAsked: the drain cancels a call (CancelAfter) before its fn
// asked anything of its context; later the caller's deadline passes too. Whatever fn then
// asks, in any order, and whatever child it makes, the context ended first by the drain:
// Err is context.Canceled and the cause the drain's, shielded or not.
func TestCallContextDrainedBeforeAsked(t *testing.T) {
	for _, shield := range []bool{false, true} {
		t.Run(fmt.Sprintf("shield=%t", shield), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ex := drain.New(drain.Options{CancelAfter: time.Minute, ReportAfter: time.Hour})
				core := internal.Of(ex)
				core.Settings().Owned = true
				parent, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer cancel()
				look := make(chan struct{})
				seen := make(chan []string, 1)
				err := core.Go(parent, internal.CallOptions{Name: "drained", Shield: shield}, func(ctx context.Context) error {
					<-look
					var s []string
					see := func(what string, ctx context.Context) {
						s = append(s, fmt.Sprintf("%s: err=%v cause=%v", what, ctx.Err(), context.Cause(ctx)))
					}
					see("ctx", ctx)
					<-ctx.Done()
					see("ctx after Done", ctx)
					child, stop := context.WithCancel(ctx)
					defer stop()
					see("WithCancel", child)
					timeout, stopTimeout := context.WithTimeout(ctx, time.Minute)
					defer stopTimeout()
					see("WithTimeout", timeout)
					seen <- s
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
				drained := make(chan error, 1)
				go func() { drained <- ex.Drain(context.Background()) }()
				time.Sleep(3 * time.Minute) // the drain cancels at 1m, the caller's deadline passes at 2m
				synctest.Wait()
				close(look)
				for _, line := range <-seen {
					if !strings.HasSuffix(line, "err=context canceled cause=cancelled by the drain") {
						t.Errorf("%s, want err=context canceled cause=cancelled by the drain", line)
					}
				}
				if err := <-drained; err != nil {
					t.Fatal(err)
				}
			})
		})
	}
}

// TestCallContextPrintsNoName: fn's context, its children and what FromContext finds print
// as the context package prints its contexts, by kind: never the call's name nor its object.
func TestCallContextPrintsNoName(t *testing.T) {
	ex := drain.New(drain.Options{})
	core := internal.Of(ex)
	core.Settings().Owned = true
	for _, shield := range []bool{false, true} {
		opts := internal.CallOptions{Name: "secret-name", Namespace: "secret-ns", Object: "secret-object", Shield: shield}
		err := core.Run(context.Background(), opts, func(ctx context.Context) error {
			child, cancel := context.WithCancel(context.WithValue(ctx, confKey{}, 1))
			defer cancel()
			for _, s := range []string{fmt.Sprint(ctx), fmt.Sprintf("%v %+v %s", child, child, child)} {
				if strings.Contains(s, "secret") || !strings.Contains(s, "context.Background") {
					t.Errorf("shield=%t: a context prints as %q, want its kinds alone", shield, s)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := ex.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
}
