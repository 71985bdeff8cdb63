package drain_test

import (
	"bytes"
	"context"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"
	"weak"

	"github.com/google/pprof/profile"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/quiesce-dev/quiesce/drain"
)

// goroutineLabels returns the label sets of the goroutines carrying the label key=value.
func goroutineLabels(t *testing.T, key, value string) []map[string][]string {
	t.Helper()
	var buf bytes.Buffer
	if err := pprof.Lookup("goroutine").WriteTo(&buf, 0); err != nil {
		t.Fatal(err)
	}
	p, err := profile.Parse(&buf)
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string][]string
	for _, s := range p.Sample {
		if v := s.Label[key]; len(v) == 1 && v[0] == value {
			out = append(out, s.Label)
		}
	}
	return out
}

// TestLabelsBelongToTheCaller: fn's context and goroutine carry the caller's labels plus
// quiesce, and Run restores the caller's labels exactly.
func TestLabelsBelongToTheCaller(t *testing.T) {
	const span = "abc"
	ex := newExecutor(t, drain.Options{})
	for _, mode := range []string{modeCall, modeRun} {
		t.Run(mode, func(t *testing.T) {
			id := "labels-" + mode
			pprof.Do(context.Background(), pprof.Labels("test", id, "span", span), func(ctx context.Context) {
				run := ex.Call
				if mode == modeRun {
					run = ex.Run
				}
				err := run(ctx, "labelled", func(ctx context.Context) error {
					if v, _ := pprof.Label(ctx, "span"); v != span {
						t.Errorf("fn's context has span=%q, want the caller's abc", v)
					}
					if v, _ := pprof.Label(ctx, "quiesce"); v == "" {
						t.Error("fn's context has no quiesce label")
					}
					var fns []map[string][]string // Call's caller waits on a goroutine of its own
					for _, set := range goroutineLabels(t, "test", id) {
						if set["quiesce"] != nil {
							fns = append(fns, set)
						}
					}
					if len(fns) != 1 || len(fns[0]) != 3 || fns[0]["span"][0] != span {
						t.Errorf("fn's goroutine has labels %v, want the caller's plus quiesce", fns)
					}
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
				if mode != modeRun {
					return
				}
				sets := goroutineLabels(t, "test", id)
				if len(sets) != 1 || len(sets[0]) != 2 || sets[0]["span"][0] != span {
					t.Errorf("after Run the caller's goroutine has labels %v, want exactly its own", sets)
				}
			})
		})
	}
}

// TestLabelsOfACallerWithout: a caller without labels gets fn's context and goroutine
// labelled quiesce alone (the call answers pprof's key itself); fn's children keep it, a
// pprof.Do inside fn merges its own with it, and a nested call's replaces it.
func TestLabelsOfACallerWithout(t *testing.T) {
	ex := newExecutor(t, drain.Options{})
	for _, mode := range []string{modeCall, modeRun} {
		t.Run(mode, func(t *testing.T) {
			run := ex.Call
			if mode == modeRun {
				run = ex.Run
			}
			err := run(context.Background(), "bare", func(ctx context.Context) error {
				id, _ := pprof.Label(ctx, "quiesce")
				sets := goroutineLabels(t, "quiesce", id)
				if id == "" || len(sets) != 1 || len(sets[0]) != 1 {
					t.Errorf("fn's goroutine has labels %v (quiesce=%q), want quiesce alone", sets, id)
				}
				child, cancel := context.WithCancel(context.WithValue(ctx, labelsTestKey{}, 1))
				defer cancel()
				if v, _ := pprof.Label(child, "quiesce"); v != id {
					t.Errorf("fn's child has quiesce=%q, want %q", v, id)
				}
				pprof.Do(child, pprof.Labels("span", "abc"), func(ctx context.Context) {
					if v, _ := pprof.Label(ctx, "quiesce"); v != id {
						t.Errorf("pprof.Do inside fn has quiesce=%q, want %q", v, id)
					}
				})
				return ex.Run(child, "nested", func(ctx context.Context) error {
					if v, _ := pprof.Label(ctx, "quiesce"); v == id || v == "" {
						t.Errorf("the nested call has quiesce=%q, want its own, not %q", v, id)
					}
					return nil
				})
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}

type labelsTestKey struct{}

// TestLabelValuesAreBounded: the quiesce label takes as many values as calls run at once.
func TestLabelValuesAreBounded(t *testing.T) {
	ex := newExecutor(t, drain.Options{})
	seen := map[string]bool{}
	for range 300 {
		_ = ex.Call(context.Background(), "sequential", func(ctx context.Context) error {
			v, _ := pprof.Label(ctx, "quiesce")
			seen[v] = true
			return nil
		})
	}
	if len(seen) > 2 {
		t.Errorf("300 sequential calls carried %d label values, want at most 2", len(seen))
	}
	seen = map[string]bool{}
	for _, v := range labelsAtOnce(t, ex, 10) {
		seen[v] = true
	}
	if len(seen) != 10 {
		t.Errorf("10 concurrent calls carried %d label values, want 10", len(seen))
	}
}

// TestReusedLabelNeverMislocates: a goroutine that a finished call started keeps that
// call's label; a later call given the same label is still located on its own goroutine.
func TestReusedLabelNeverMislocates(t *testing.T) {
	ex := newExecutor(t, drain.Options{})
	leaked := make(chan struct{})
	defer close(leaked)
	first := leaveChild(t, ex, leaked)
	release := make(chan struct{})
	at := make(chan string, 1)
	var second string
	if err := ex.Go(context.Background(), "second", func(ctx context.Context) error {
		second, _ = pprof.Label(ctx, "quiesce")
		blockAt(0, at, release)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	where := <-at
	calls := locateAt(ex, where)
	close(release)
	if first != second {
		t.Fatalf("the second call got label %q, not the first's %q: nothing to test", second, first)
	}
	if len(calls) != 1 || calls[0].Where != where {
		t.Errorf("Locate = %+v, want second at %q, not at the first call's goroutine", calls, where)
	}
}

// TestHostileLabelsHideNothing: the caller's label keys and values, whatever they hold,
// never hide a call.
func TestHostileLabelsHideNothing(t *testing.T) {
	ex := newExecutor(t, drain.Options{})
	for _, kv := range [][2]string{
		{`"quiesce":`, `"1"`},
		{`a"b:c, "quiesce":"x"`, "v"},
		{"k", `{"quiesce":"7"}`},
		{"quiesce ", "x\ny"},
	} {
		pprof.Do(context.Background(), pprof.Labels(kv[0], kv[1]), func(ctx context.Context) {
			release := make(chan struct{})
			at := make(chan string, 1)
			if err := ex.Go(ctx, "hostile", func(context.Context) error { blockAt(0, at, release); return nil }); err != nil {
				t.Fatal(err)
			}
			where := <-at
			calls := locateAt(ex, where)
			close(release)
			if len(calls) != 1 || calls[0].Where != where {
				t.Errorf("with the caller's label %q=%q, Locate = %+v, want at %q", kv[0], kv[1], calls, where)
			}
			for len(ex.Pending()) > 0 {
				drain.ForgetCapture() // the call returns
				_, _ = ex.Locate(-1)
			}
		})
	}
}

// TestLocateTooDeepWithChildren: a call deeper than the profile keeps, whose goroutine
// started goroutines (which carry its label), is located on its own goroutine, and the
// reason logged for its unknown handler is the depth.
func TestLocateTooDeepWithChildren(t *testing.T) {
	lines := &logs{lines: make(chan logLine, 10)}
	ex := newExecutor(t, drain.Options{Logger: lines.logger(t)})
	release := make(chan struct{})
	at := make(chan string, 1)
	children := make(chan struct{}, 2)
	if err := ex.Go(context.Background(), "deep with children", func(context.Context) error {
		for range 2 {
			go func() { children <- struct{}{}; <-release }()
		}
		<-children
		<-children
		blockAt(300, at, release)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	where := <-at
	calls := locateAt(ex, where)
	close(release)
	if len(calls) != 1 || calls[0].Where != where || calls[0].Handler != drain.Unknown {
		t.Fatalf("Locate = %+v, want where %q and an unknown handler", calls, where)
	}
	line := <-lines.lines
	if line.Msg != "Cannot locate pending calls" || !strings.Contains(line.raw, "deeper than the goroutine profile keeps") {
		t.Errorf("logged %s, want the depth as the reason", line.raw)
	}
}

// TestLocateNestedRunOfAnotherExecutor: a Run of a second executor on a call's goroutine
// relabels it; the outer call is still located, at the line of fn that runs the inner one.
func TestLocateNestedRunOfAnotherExecutor(t *testing.T) {
	outer := newExecutor(t, drain.Options{})
	inner := newExecutor(t, drain.Options{})
	release := make(chan struct{})
	at := make(chan string, 1)
	outerAt := make(chan string, 1)
	if err := outer.Go(context.Background(), "outer", func(ctx context.Context) error {
		outerAt <- lineBelow()
		return inner.Run(ctx, "inner", func(context.Context) error { blockAt(0, at, release); return nil })
	}); err != nil {
		t.Fatal(err)
	}
	where, wantOuter := <-at, <-outerAt
	innerCalls := locateAt(inner, where)
	drain.ForgetCapture()
	outerCalls, _ := outer.Locate(-1)
	close(release)
	if len(innerCalls) != 1 || innerCalls[0].Where != where {
		t.Errorf("inner Locate = %+v, want at %q", innerCalls, where)
	}
	if len(outerCalls) != 1 || outerCalls[0].Where != where || outerCalls[0].Handler != wantOuter {
		t.Errorf("outer Locate = %+v, want at %q (its goroutine is blocked there) and in %q", outerCalls, where, wantOuter)
	}
}

// TestLabelsOfTwoExecutors: the calls of two executors running at once never carry the
// same label value, on their context or on their goroutine; each executor still reuses
// its own values.
func TestLabelsOfTwoExecutors(t *testing.T) {
	exs := []*drain.Executor{newExecutor(t, drain.Options{}), newExecutor(t, drain.Options{})}
	const perExecutor = 10
	var mu sync.Mutex
	seen := map[string]int{} // value → calls carrying it
	release := make(chan struct{})
	var started, wg sync.WaitGroup
	started.Add(2 * perExecutor)
	for _, ex := range exs {
		for range perExecutor {
			wg.Go(func() {
				_ = ex.Call(context.Background(), "concurrent", func(ctx context.Context) error {
					v, _ := pprof.Label(ctx, "quiesce")
					mu.Lock()
					seen[v]++
					mu.Unlock()
					started.Done()
					<-release
					return nil
				})
			})
		}
	}
	started.Wait()
	for v, n := range seen {
		if n != 1 {
			t.Errorf("label %q is carried by %d calls running at once, want 1", v, n)
		}
		if gs := goroutineLabels(t, "quiesce", v); len(gs) != 1 {
			t.Errorf("label %q is on %d goroutines, want 1 (the call's own)", v, len(gs))
		}
	}
	if len(seen) != 2*perExecutor {
		t.Errorf("%d calls running at once carried %d label values, want %d", 2*perExecutor, len(seen), 2*perExecutor)
	}
	close(release)
	wg.Wait()

	// Sequential calls alternating between the executors: each reuses its own value.
	values := []map[string]bool{{}, {}}
	for range 100 {
		for i, ex := range exs {
			_ = ex.Call(context.Background(), "sequential", func(ctx context.Context) error {
				v, _ := pprof.Label(ctx, "quiesce")
				values[i][v] = true
				return nil
			})
		}
	}
	for i := range values {
		if len(values[i]) > 2 {
			t.Errorf("executor %d: 100 sequential calls carried %d label values, want at most 2", i, len(values[i]))
		}
		for v := range values[i] {
			if values[1-i][v] {
				t.Errorf("label %q was carried by calls of both executors", v)
			}
		}
	}
}

// TestReusedLabelOfEachExecutor: in each of two executors, a finished call left a
// goroutine behind with its label; the next call of each executor takes that label again
// and is located on its own goroutine, not on the leftover one nor on the other executor's.
func TestReusedLabelOfEachExecutor(t *testing.T) {
	exs := []*drain.Executor{newExecutor(t, drain.Options{}), newExecutor(t, drain.Options{})}
	leaked := make(chan struct{})
	defer close(leaked)
	first := make([]string, len(exs))
	for i, ex := range exs {
		first[i] = leaveChild(t, ex, leaked)
	}
	if first[0] == first[1] {
		t.Fatalf("the first calls of two executors both carried label %q", first[0])
	}
	release := make(chan struct{})
	defer close(release)
	second := make([]string, len(exs))
	wheres := make([]string, len(exs))
	for i, ex := range exs {
		at := make(chan string, 1)
		block := []func(){ // a line of its own for each executor's call
			func() { blockAt(0, at, release) },
			func() { _ = blocking(at, release)(context.Background()) },
		}[i]
		if err := ex.Go(context.Background(), "second", func(ctx context.Context) error {
			second[i], _ = pprof.Label(ctx, "quiesce")
			block()
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		wheres[i] = <-at
	}
	if wheres[0] == wheres[1] {
		t.Fatalf("both calls block at %q: nothing to test", wheres[0])
	}
	for i, ex := range exs {
		if second[i] != first[i] {
			t.Fatalf("executor %d: the second call got label %q, not the first's %q: nothing to test", i, second[i], first[i])
		}
		calls := locateAt(ex, wheres[i])
		if len(calls) != 1 || calls[0].Where != wheres[i] {
			t.Errorf("executor %d: Locate = %+v, want second at %q", i, calls, wheres[i])
		}
	}
}

// TestLabelsKeepNoExecutorAlive: an executor that ran calls, once unreachable, is garbage
// collected (the registry that resolves label ids to executors holds none). Run and a fake
// clock: the test checks the registry alone, not when the runtime lets go of an exiting
// goroutine's stack (Call's) or of a stopped timer's func (a real clock's timers hold the
// executor; the test failed in 2 of 15 full runs of the package with Call and a real clock).
func TestLabelsKeepNoExecutorAlive(t *testing.T) {
	ex := drain.New(drain.Options{Clock: clocktesting.NewFakeClock(time.Now())})
	if err := ex.Run(context.Background(), "one", func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if err := ex.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	w := weak.Make(ex)
	ex = nil
	for range 10 {
		runtime.GC()
		if w.Value() == nil {
			return
		}
	}
	t.Error("an executor no longer used is still alive after 10 collections")
}

// TestDrainedExecutorsHandTheirLabelsOn: an executor whose drain is over hands its number
// and label ids to the next executor New makes, so that short-lived executors, one after
// another, make no new number (nor ids) and a profiler sees a bounded set of values.
func TestDrainedExecutorsHandTheirLabelsOn(t *testing.T) {
	lifetime := func() []string {
		ex := drain.New(drain.Options{})
		values := labelsAtOnce(t, ex, 3)
		if err := ex.Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
		return values
	}
	// Meanwhile captures resolve the ids of the calls of every executor (-race checks the
	// hand-over against them).
	watcher := newExecutor(t, drain.Options{})
	stop := make(chan struct{})
	var watching sync.WaitGroup
	watching.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
				drain.ForgetCapture()
				_, _ = watcher.Locate(-1)
			}
		}
	})
	defer func() {
		close(stop)
		watching.Wait()
	}()
	lifetime() // a released table exists from here on: later ones only add to them
	numbers := drain.ExecutorNumbers()
	for range 50 {
		if values := lifetime(); len(values) != 3 || values[0] == values[1] || values[1] == values[2] || values[0] == values[2] {
			t.Fatalf("three calls at once carried %q, want three distinct label values", values)
		}
	}
	if made := drain.ExecutorNumbers() - numbers; made != 0 {
		t.Errorf("50 executors made one after another, each drained: %d new executor numbers, want 0 (each takes a drained one's)", made)
	}
}

// TestCollectedExecutorHandsItsLabelsOn: an executor never drained hands its number and
// label ids on once it is garbage collected (SlowAfter off: its timer, armed while a call
// runs, would keep it alive until it fires).
func TestCollectedExecutorHandsItsLabelsOn(t *testing.T) {
	ex := drain.New(drain.Options{SlowAfter: -1})
	if err := ex.Call(context.Background(), "one", func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
	before := drain.ReleasedLabelTables()
	ex = nil
	for range 100 {
		runtime.GC()
		runtime.Gosched() // cleanups run on a goroutine of their own
		if drain.ReleasedLabelTables() > before {
			return
		}
	}
	t.Error("an executor collected without a drain: its label table was not released")
}

// TestLabelReusedAcrossExecutors: an executor drained with a goroutine left behind carrying
// the label of its call; the next executor takes that label, and its call is located on its
// own goroutine, not on the leftover one; the drained executor locates nothing.
func TestLabelReusedAcrossExecutors(t *testing.T) {
	leaked := make(chan struct{})
	defer close(leaked)
	release := make(chan struct{})
	defer close(release)
	// The next executor takes the table released last, unless a collected executor's was
	// released in between (a garbage collection's cleanup): then it is tried again.
	for range 20 {
		first := drain.New(drain.Options{})
		firstLabel := leaveChild(t, first, leaked)
		if err := first.Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
		next := newExecutor(t, drain.Options{})
		at, labelled := make(chan string, 1), make(chan string, 1)
		mustGo(t, next, "next", func(ctx context.Context) error {
			v, _ := pprof.Label(ctx, "quiesce")
			labelled <- v
			return blocking(at, release)(ctx)
		})
		where := <-at
		if <-labelled != firstLabel {
			continue
		}
		calls := locateAt(next, where)
		if len(calls) != 1 || calls[0].Name != "next" || calls[0].Where != where {
			t.Errorf("Locate = %+v, want next at %q", calls, where)
		}
		if calls, total := first.Locate(-1); len(calls) != 0 || total != 0 {
			t.Errorf("the drained executor locates %+v (%d), want none", calls, total)
		}
		return
	}
	t.Fatal("in 20 tries, no executor took the label of the one drained just before it")
}

// leaveChild runs a call of ex named "first" whose fn starts a goroutine that inherits its
// labels and outlives it, until leaked is closed; it returns the call's label value once that
// goroutine runs.
func leaveChild(t *testing.T, ex *drain.Executor, leaked <-chan struct{}) (label string) {
	t.Helper()
	running := make(chan struct{})
	if err := ex.Call(context.Background(), "first", func(ctx context.Context) error {
		label, _ = pprof.Label(ctx, "quiesce")
		go func() { // left behind by fn, with fn's labels
			close(running)
			<-leaked
		}()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	<-running
	return label
}

// labelsAtOnce runs n calls of ex at once and returns the label value each one carried.
func labelsAtOnce(t *testing.T, ex *drain.Executor, n int) []string {
	t.Helper()
	values := make([]string, n)
	var started, done sync.WaitGroup
	started.Add(n)
	done.Add(n)
	release := make(chan struct{})
	for i := range n {
		mustGo(t, ex, "at once", func(ctx context.Context) error {
			defer done.Done()
			values[i], _ = pprof.Label(ctx, "quiesce")
			started.Done()
			<-release
			return nil
		})
	}
	started.Wait()
	close(release)
	done.Wait()
	return values
}
