package drain

import (
	"bytes"
	"os"
	"reflect"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/pprof/profile"

	"github.com/quiesce-dev/quiesce/internal"
)

// The goroutine profile gives every goroutine's stack (its innermost GODEBUG profstackdepth
// frames) and labels. A capture serves all who ask within captureReuse if it saw their labels.
const captureReuse = time.Second

// Why a location is unknown, each logged once per executor.
const (
	unknownNoProfile = "the goroutine profile could not be written or read"
	unknownNoLabel   = "no goroutine running the call carries its pprof label: fn replaced its goroutine's labels " +
		"(pprof.SetGoroutineLabels with a context not derived from fn's)"
	unknownTooDeep = "the call's stack is deeper than the goroutine profile keeps " +
		"(GODEBUG profstackdepth, 128 frames by default)"
)

// stack is one goroutine's stack in a capture (or identical ones').
type stack struct {
	frames    []runtime.Frame // innermost first (inlined calls, then their caller)
	truncated bool            // the profile kept only its innermost frames
	execs     int             // how many exec frames it has: calls running on it
}

// capture holds the stacks of a goroutine profile labelled by quiesce.
type capture struct {
	at    time.Time
	epoch uint64           // it saw every label of a call whose since is up to this
	own   map[string]stack // by label id, the stack of the call's own goroutine (ownStack)
	ok    bool             // the profile was written and read
}

// captureEpoch counts the captures begun (see call.since).
var captureEpoch atomic.Uint64

// captureTaken is called after each capture: a seam for tests.
var captureTaken = func() {}

var captures struct {
	mu   sync.Mutex // held while a capture is taken: concurrent askers wait for it
	last *capture
}

// captureSince returns a capture that saw the labels of calls whose since is <= since.
func captureSince(since uint64) *capture {
	captures.mu.Lock()
	defer captures.mu.Unlock()
	if c := captures.last; c != nil && c.epoch >= since {
		// Reused while fresh; one of a later time is not (seen from inside a synctest bubble).
		if age := time.Since(c.at); age >= 0 && age < captureReuse {
			return c
		}
	}
	captures.last = takeCapture()
	captureTaken()
	return captures.last
}

// takeCapture writes the goroutine profile and keeps the stacks labelled by quiesce.
func takeCapture() *capture {
	c := &capture{at: time.Now(), epoch: captureEpoch.Add(1)}
	internal.Captures.Add(1)
	var buf bytes.Buffer
	if err := pprof.Lookup("goroutine").WriteTo(&buf, 0); err != nil {
		return c
	}
	p, err := profile.Parse(&buf)
	if err != nil {
		return c
	}
	c.ok = true
	stacks := make(map[string][]stack)
	depth := profStackDepth()
	for _, s := range p.Sample {
		ids := s.Label[labelKey]
		if len(ids) != 1 {
			continue
		}
		st := stack{truncated: len(s.Location) >= depth}
		for _, loc := range s.Location {
			for _, ln := range loc.Line {
				if ln.Function == nil || ln.Function.Name == "" {
					continue
				}
				f := runtime.Frame{Function: ln.Function.Name, File: ln.Function.Filename, Line: int(ln.Line)}
				st.frames = append(st.frames, f)
				if ln.Function.Name == execFunc {
					st.execs++
				}
			}
		}
		stacks[ids[0]] = append(stacks[ids[0]], st)
	}
	c.own = make(map[string]stack, len(stacks))
	for id, sts := range stacks {
		if st, ok := ownStack(sts); ok {
			c.own[id] = st
		}
	}
	return c
}

// profStackDepth returns GODEBUG profstackdepth (at most 1024), 128 by default.
func profStackDepth() int {
	depth := 128
	for _, kv := range strings.Split(os.Getenv("GODEBUG"), ",") { // the last one counts
		v, ok := strings.CutPrefix(strings.TrimSpace(kv), "profstackdepth=")
		if n, err := strconv.Atoi(v); ok && err == nil && n > 0 {
			depth = min(n, 1024)
		}
	}
	return depth
}

// ownStack returns, of the stacks labelled with a call's id, its own goroutine's: the one
// running exec (fn's goroutines inherit the label), else the only one cut at the depth.
func ownStack(stacks []stack) (own stack, ok bool) {
	cut := 0
	for _, st := range stacks {
		if st.execs > 0 {
			return st, true
		}
		if st.truncated {
			own, cut = st, cut+1
		}
	}
	return own, cut == 1
}

// locate returns the Pending of each call, with Where and Handler filled; shared takes any
// fresh capture, leaving calls it did not see without a location rather than paying for another.
func (e *Executor) locate(calls []*call, shared bool) []Pending {
	var latest uint64 // the latest since of the calls begun
	for _, c := range calls {
		if s := c.since.Load(); s != sinceLeft {
			latest = max(latest, s)
		}
	}
	cp := &capture{} // none is needed while no call has begun
	if latest > 0 {
		if shared {
			latest = 0 // any fresh capture will do
		}
		if cp = captureSince(latest); !cp.ok {
			e.unknownWhy(unknownNoProfile)
		}
	}
	out := pendings(calls)
	todo := make(map[*call]int, len(calls)) // the calls to locate from cp, and their index
	for i, c := range calls {
		switch s := c.since.Load(); {
		case s == sinceLeft: // fn returned a moment ago
			out[i].Where, out[i].Handler = Returning, Returning
		case s == 0, s > cp.epoch && !shared: // not begun when listed
			out[i].Where, out[i].Handler = NotStarted, NotStarted
		case s <= cp.epoch:
			todo[c] = i
		} // else (shared): begun after the capture, listed without a location
	}
	for c, i := range todo {
		if st, ok := cp.own[c.label.id]; ok {
			delete(todo, c)
			if out[i].Where, out[i].Handler = describe(st.frames, 0); out[i].Handler == "" {
				out[i].Handler = Unknown
				e.unknownWhy(unknownTooDeep)
			}
		}
	}
	// A Run inside fn relabels its goroutine: the outer calls are on the inner one's stack,
	// each above the next exec frame.
	for id, st := range cp.own {
		if st.execs < 2 {
			continue
		}
		for c, n := labelled(id, cp.epoch), 1; c != nil && c.onCaller && n < st.execs; n++ {
			c = c.outer()
			if i, ok := todo[c]; ok {
				delete(todo, c)
				out[i].Where, out[i].Handler = describe(st.frames, n)
			}
		}
	}
	for _, i := range todo {
		out[i].Where, out[i].Handler = Unknown, Unknown
		if cp.ok {
			e.unknownWhy(unknownNoLabel)
		}
	}
	return out
}

// unknownWhy logs, once per executor and reason, why a location is unknown.
func (e *Executor) unknownWhy(reason string) {
	if _, logged := e.unknown.LoadOrStore(reason, true); !logged {
		go internal.Safely(func() { e.opts.Logger.Info("Cannot locate pending calls", "reason", reason) })
	}
}

// describe returns where the goroutine of frames (innermost first) is blocked, and the
// handler line of the call whose fn runs above its nth exec frame ("" if not in frames).
func describe(frames []runtime.Frame, n int) (where, handler string) {
	top := len(frames) // frames[:top] run inside the call's fn
	for i, f := range frames {
		if f.Function == execFunc {
			if n == 0 {
				top = i
				break
			}
			n--
		}
	}
	for _, f := range frames[:top] {
		pkg := packagePath(f.Function)
		if !isStd(pkg) && !isOwn(pkg, f.File) {
			where = formatFrame(f)
			break
		}
		// Until one is found, the innermost frame outside the runtime.
		if where == "" && pkg != "runtime" && !strings.HasPrefix(pkg, "runtime/") && !strings.HasPrefix(pkg, "internal/") {
			where = formatFrame(f)
		}
	}
	if top < len(frames) { // else fn's frames were cut off
		// The handler is the outermost frame of fn that is not quiesce's nor only passes the
		// call on: generated, or controller-runtime's reconcile adapters (reconcile.Func, AsReconciler's).
		for i := top - 1; i >= 0; i-- {
			f := frames[i]
			pkg := packagePath(f.Function)
			if !isOwn(pkg, f.File) && f.File != "<autogenerated>" && pkg != "sigs.k8s.io/controller-runtime/pkg/reconcile" {
				return where, formatFrame(f)
			}
		}
	}
	return where, ""
}

// formatFrame says "pkg.Func (file.go:123)": the last elements of f's function and file.
func formatFrame(f runtime.Frame) string {
	base := func(s string) string { return s[strings.LastIndexByte(s, '/')+1:] }
	return base(f.Function) + " (" + base(f.File) + ":" + strconv.Itoa(f.Line) + ")"
}

// packagePath returns a function's package path (of "a.com/b.(*T[c.U]).M": "a.com/b").
func packagePath(function string) string {
	if i := strings.IndexByte(function, '['); i >= 0 {
		function = function[:i]
	}
	slash := strings.LastIndexByte(function, '/')
	dot := strings.IndexByte(function[slash+1:], '.')
	if dot < 0 {
		return function
	}
	return function[:slash+1+dot]
}

var (
	drainPkg = packagePath(runtime.FuncForPC(reflect.ValueOf(New).Pointer()).Name())
	execFunc = drainPkg + ".(*call).exec"

	// ownPackages run fn: a location skips their frames.
	ownModule   = strings.TrimSuffix(drainPkg, "/drain")
	ownPackages = []string{drainPkg, ownModule + "/reconcilers", ownModule + "/runnable", ownModule + "/internal"}

	// modules are the program's module paths: a package in none is the standard library's.
	modules = sync.OnceValue(func() []string {
		info, ok := debug.ReadBuildInfo()
		if !ok {
			return nil
		}
		mods := []string{info.Main.Path} // an empty one matches no package
		for _, d := range info.Deps {
			mods = append(mods, d.Path)
		}
		return mods
	})
)

func isStd(pkg string) bool {
	first, _, _ := strings.Cut(pkg, "/")
	if pkg == "main" || pkg == "command-line-arguments" || strings.Contains(first, ".") {
		return false // the standard library's paths have no dot in their first element
	}
	for _, m := range modules() {
		if pkg == m || strings.HasPrefix(pkg, m+"/") {
			return false
		}
	}
	return true
}

func isOwn(pkg, file string) bool {
	return !strings.HasSuffix(file, "_test.go") && slices.Contains(ownPackages, pkg)
}
