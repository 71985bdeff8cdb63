package lifecycle

import (
	"go/parser"
	"go/token"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestSelectionFunctionsUseTheStandardLibraryOnly: the lifecycles are plain functions that a
// user may read and copy without Kubernetes; Handlers, in other files, is not.
func TestSelectionFunctionsUseTheStandardLibraryOnly(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "lifecycle.go", nil, parser.ImportsOnly)
	if err != nil {
		t.Fatal(err)
	}
	for _, imp := range f.Imports {
		path := strings.Trim(imp.Path.Value, `"`)
		if first, _, _ := strings.Cut(path, "/"); strings.Contains(first, ".") {
			t.Errorf("lifecycle.go imports %s, want the standard library only", path)
		}
	}
}

// withIntN replaces the random source of Randomized for the rest of the test.
// Tests that use it must not run in parallel.
func withIntN(t *testing.T, f func(n int) int) {
	t.Helper()
	old := intN
	intN = f
	t.Cleanup(func() { intN = old })
}

// withShuffle replaces the random source of Shuffled for the rest of the test.
// Tests that use it must not run in parallel.
func withShuffle(t *testing.T, f func(n int, swap func(i, j int))) {
	t.Helper()
	old := shuffle
	shuffle = f
	t.Cleanup(func() { shuffle = old })
}

// reverse is a deterministic stand-in for rand.Shuffle.
func reverse(n int, swap func(i, j int)) {
	for i, j := 0, n-1; i < j; i, j = i+1, j-1 {
		swap(i, j)
	}
}

type selectCase struct {
	name     string
	pending  []string
	progress map[string]Progress
	want     []string
}

// edgeCases are the same for every Func: nothing picked from nothing, the only name from one.
var edgeCases = []selectCase{
	{name: "nil", pending: nil, want: nil},
	{name: "empty", pending: []string{}, want: nil},
	{name: "one", pending: []string{"a"}, want: []string{"a"}},
}

// check runs fn on each case and verifies the result, that the arguments are left as they
// were, and that the result does not share memory with pending.
func check(t *testing.T, fn Func, cases []selectCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pending := slices.Clone(tc.pending)
			progress := maps.Clone(tc.progress)

			got := fn(pending, progress)

			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %#v, want %#v", got, tc.want)
			}
			if !slices.Equal(pending, tc.pending) {
				t.Errorf("pending modified: %q, was %q", pending, tc.pending)
			}
			if !maps.Equal(progress, tc.progress) {
				t.Errorf("progress modified: %v, was %v", progress, tc.progress)
			}
			for i := range got {
				got[i] = "overwritten"
			}
			if !slices.Equal(pending, tc.pending) {
				t.Errorf("result aliases pending: writing to it changed pending to %q", pending)
			}
		})
	}
}

func TestAllAtOnce(t *testing.T) {
	check(t, AllAtOnce, slices.Concat(edgeCases, []selectCase{
		{name: "all in order", pending: []string{"c", "a", "b"}, want: []string{"c", "a", "b"}},
		{
			name:     "ignores retries",
			pending:  []string{"a", "b"},
			progress: map[string]Progress{"a": {Retries: 5}},
			want:     []string{"a", "b"},
		},
		{
			name:     "does not filter done",
			pending:  []string{"a", "b"},
			progress: map[string]Progress{"a": {Done: true}},
			want:     []string{"a", "b"},
		},
	}))
}

func TestOneByOne(t *testing.T) {
	check(t, OneByOne, slices.Concat(edgeCases, []selectCase{
		{name: "first of many", pending: []string{"c", "a", "b"}, want: []string{"c"}},
		{
			name:     "ignores retries",
			pending:  []string{"a", "b"},
			progress: map[string]Progress{"a": {Retries: 5}},
			want:     []string{"a"},
		},
		{
			name:     "does not filter done",
			pending:  []string{"a", "b"},
			progress: map[string]Progress{"a": {Done: true}},
			want:     []string{"a"},
		},
	}))
}

func TestASAP(t *testing.T) {
	check(t, ASAP, slices.Concat(edgeCases, []selectCase{
		{name: "nil progress: first", pending: []string{"a", "b", "c"}, want: []string{"a"}},
		{
			name:     "fewest retries",
			pending:  []string{"a", "b", "c"},
			progress: map[string]Progress{"a": {Retries: 3}, "b": {Retries: 1}, "c": {Retries: 2}},
			want:     []string{"b"},
		},
		{
			name:     "fewest retries last",
			pending:  []string{"a", "b", "c"},
			progress: map[string]Progress{"a": {Retries: 3}, "b": {Retries: 1}, "c": {Retries: 0}},
			want:     []string{"c"},
		},
		{
			name:     "tie: registration order",
			pending:  []string{"a", "b", "c"},
			progress: map[string]Progress{"a": {Retries: 2}, "b": {Retries: 1}, "c": {Retries: 1}},
			want:     []string{"b"},
		},
		{
			name:     "tie: order of pending, not of names",
			pending:  []string{"c", "b", "a"},
			progress: map[string]Progress{"a": {Retries: 1}, "b": {Retries: 1}, "c": {Retries: 1}},
			want:     []string{"c"},
		},
		{
			name:     "missing entry means zero retries",
			pending:  []string{"a", "b", "c"},
			progress: map[string]Progress{"a": {Retries: 1}, "c": {Retries: 1}},
			want:     []string{"b"},
		},
		{
			name:     "entries of other handlers are ignored",
			pending:  []string{"b", "c"},
			progress: map[string]Progress{"a": {Retries: 0, Done: true}, "b": {Retries: 4}, "c": {Retries: 2}},
			want:     []string{"c"},
		},
		{
			name:     "does not filter done: done with fewer retries first",
			pending:  []string{"a", "b"},
			progress: map[string]Progress{"a": {Done: true}, "b": {Retries: 1}},
			want:     []string{"a"},
		},
	}))
}

func TestRandomized(t *testing.T) {
	type randomCase struct {
		name    string
		pending []string
		pick    int
		want    []string
	}
	cases := make([]randomCase, 0, len(edgeCases)+3)
	for _, ec := range edgeCases {
		cases = append(cases, randomCase{name: ec.name, pending: ec.pending, pick: 0, want: ec.want})
	}
	cases = append(cases,
		randomCase{name: "first", pending: []string{"a", "b", "c"}, pick: 0, want: []string{"a"}},
		randomCase{name: "middle", pending: []string{"a", "b", "c"}, pick: 1, want: []string{"b"}},
		randomCase{name: "last", pending: []string{"a", "b", "c"}, pick: 2, want: []string{"c"}},
	)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var calls []int
			withIntN(t, func(n int) int {
				calls = append(calls, n)
				return tc.pick
			})
			check(t, Randomized, []selectCase{{name: "check", pending: tc.pending, want: tc.want}})

			var wantCalls []int
			if len(tc.pending) > 0 {
				wantCalls = []int{len(tc.pending)}
			}
			if !slices.Equal(calls, wantCalls) {
				t.Errorf("intN called with %v, want %v", calls, wantCalls)
			}
		})
	}
}

func TestShuffled(t *testing.T) {
	for _, tc := range slices.Concat(edgeCases, []selectCase{
		{name: "many", pending: []string{"a", "b", "c", "d"}, want: []string{"d", "c", "b", "a"}},
	}) {
		t.Run(tc.name, func(t *testing.T) {
			var calls []int
			withShuffle(t, func(n int, swap func(i, j int)) {
				calls = append(calls, n)
				reverse(n, swap)
			})
			check(t, Shuffled, []selectCase{{name: "check", pending: tc.pending, want: tc.want}})

			var wantCalls []int
			if len(tc.pending) > 0 {
				wantCalls = []int{len(tc.pending)}
			}
			if !slices.Equal(calls, wantCalls) {
				t.Errorf("shuffle called with %v, want %v", calls, wantCalls)
			}
		})
	}
}

// The distribution tests use the real random source. The tolerances are about seven standard
// deviations wide: a correct implementation fails them far less than once in a billion runs,
// while one that favours or never picks a handler fails them every time.

func TestRandomizedDistribution(t *testing.T) {
	const runs = 10_000
	pending := []string{"a", "b", "c", "d"}
	counts := map[string]int{}
	for range runs {
		got := Randomized(pending, nil)
		if len(got) != 1 || !slices.Contains(pending, got[0]) {
			t.Fatalf("Randomized(%q) = %q, want one of them", pending, got)
		}
		counts[got[0]]++
	}
	// Each count is binomial(10000, 1/4): mean 2500, standard deviation about 43.
	const want, tolerance = runs / 4, 300
	for _, h := range pending {
		if c := counts[h]; c < want-tolerance || c > want+tolerance {
			t.Errorf("%q picked %d times in %d runs, want %d±%d (all counts: %v)", h, c, runs, want, tolerance, counts)
		}
	}
}

func TestShuffledDistribution(t *testing.T) {
	const runs = 6_000
	pending := []string{"a", "b", "c"}
	counts := map[string]int{}
	for range runs {
		got := Shuffled(pending, nil)
		if !slices.Equal(slices.Sorted(slices.Values(got)), pending) {
			t.Fatalf("Shuffled(%q) = %q, want a permutation", pending, got)
		}
		counts[strings.Join(got, "")]++
	}
	// 3! = 6 permutations, each count binomial(6000, 1/6): mean 1000, standard deviation about 29.
	const want, tolerance = runs / 6, 250
	for _, p := range []string{"abc", "acb", "bac", "bca", "cab", "cba"} {
		if c := counts[p]; c < want-tolerance || c > want+tolerance {
			t.Errorf("permutation %q seen %d times in %d runs, want %d±%d (all counts: %v)", p, c, runs, want, tolerance, counts)
		}
	}
}

func TestNamed(t *testing.T) {
	pending := []string{"a", "b", "c"}
	progress := map[string]Progress{"a": {Retries: 1}}
	withIntN(t, func(n int) int { return n - 1 })
	withShuffle(t, reverse)

	for _, tc := range []struct {
		names []string
		want  []string // the result of the named Func on pending and progress
	}{
		{names: []string{"ASAP", "asap", "Asap"}, want: []string{"b"}},
		{names: []string{"AllAtOnce", "all_at_once", "all-at-once", "ALLATONCE"}, want: []string{"a", "b", "c"}},
		{names: []string{"OneByOne", "one_by_one", "one-by-one"}, want: []string{"a"}},
		{names: []string{"Randomized", "randomized"}, want: []string{"c"}},
		{names: []string{"Shuffled", "shuffled"}, want: []string{"c", "b", "a"}},
	} {
		for _, name := range tc.names {
			fn, ok := Named(name)
			if !ok {
				t.Errorf("Named(%q) not found", name)
				continue
			}
			if got := fn(pending, progress); !slices.Equal(got, tc.want) {
				t.Errorf("Named(%q) picks %q, want %q", name, got, tc.want)
			}
		}
	}

	for _, name := range []string{"", "unknown", "as ap", "one_by_two"} {
		if fn, ok := Named(name); ok || fn != nil {
			t.Errorf("Named(%q) = %v, %v; want nil, false", name, fn, ok)
		}
	}
}

func TestNames(t *testing.T) {
	got := Names()
	want := []string{"ASAP", "AllAtOnce", "OneByOne", "Randomized", "Shuffled"}
	if !slices.Equal(got, want) {
		t.Fatalf("Names() = %q, want %q", got, want)
	}
	for _, name := range got {
		if _, ok := Named(name); !ok {
			t.Errorf("Named(%q) not found, though Names lists it", name)
		}
	}
	got[0] = "overwritten"
	if Names()[0] != want[0] {
		t.Error("Names returns shared memory")
	}
}

// TestConcurrentUse calls every lifecycle from many goroutines on shared arguments; with -race
// it proves the functions neither write to their arguments nor to shared state.
func TestConcurrentUse(t *testing.T) {
	pending := []string{"a", "b", "c", "d"}
	progress := map[string]Progress{"a": {Retries: 2}, "b": {Retries: 1}}
	wantPending, wantProgress := slices.Clone(pending), maps.Clone(progress)
	funcs := []Func{AllAtOnce, OneByOne, Randomized, Shuffled, ASAP}
	done := make(chan struct{})
	const goroutines = 8
	for range goroutines {
		go func() {
			defer func() { done <- struct{}{} }()
			for range 100 {
				for _, fn := range funcs {
					fn(pending, progress)
				}
			}
		}()
	}
	for range goroutines {
		<-done
	}
	if !slices.Equal(pending, wantPending) || !maps.Equal(progress, wantProgress) {
		t.Errorf("arguments modified: pending %q, progress %v; were %q, %v", pending, progress, wantPending, wantProgress)
	}
}

func BenchmarkASAP(b *testing.B) {
	pending := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	progress := map[string]Progress{"a": {Retries: 3}, "b": {Retries: 2}, "c": {Retries: 2}, "h": {Retries: 1}}
	b.ReportAllocs()
	for b.Loop() {
		ASAP(pending, progress)
	}
}
