package drain

import (
	"bytes"
	"reflect"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
)

// Locating a call: while fn runs, its goroutine carries the pprof label quiesce=<runner
// id> (see runner). The goroutine profile at debug level 1 is the one public view of
// other goroutines' stacks that includes their labels; it keeps GODEBUG profstackdepth
// frames (128 by default) from the innermost. Capturing it costs ~3 ms with 100
// goroutines and ~300 ms with 10,000: a report is logged every few seconds at most,
// and lists 20 calls, so locating stays off the call path entirely.

// Reasons why a location is unknown, each logged once per executor.
const (
	unknownNoProfile uint32 = 1 << iota
	unknownNoLabel
	unknownTooDeep
)

var unknownReasons = map[uint32]string{
	unknownNoProfile: "the goroutine profile could not be written",
	unknownNoLabel: "no goroutine carries the call's pprof label: fn replaced its goroutine's labels " +
		"(pprof.SetGoroutineLabels with a context not derived from fn's)",
	unknownTooDeep: "the call's stack is deeper than the goroutine profile keeps " +
		"(GODEBUG profstackdepth, 128 frames by default)",
}

// locate returns the Pending of each call, with Where and Handler filled.
func (e *Executor) locate(calls []*call) []Pending {
	out := make([]Pending, len(calls))
	index := make(map[*call]int, len(calls))
	byLabel := make(map[string]int, len(calls))
	ran := make([]*runner, len(calls))
	for i, c := range calls {
		out[i] = c.pending()
		index[c] = i
		if r := c.runner.Load(); r != nil {
			ran[i] = r
			byLabel[r.id] = i
		} else {
			out[i].Where, out[i].Handler = NotStarted, NotStarted
		}
	}
	if len(byLabel) == 0 {
		return out
	}
	stacks, ok := labelledStacks(byLabel)
	if !ok {
		e.unknownWhy(unknownNoProfile)
	}
	frames := make([][]runtime.Frame, len(calls))
	for i, c := range calls {
		if ran[i] == nil || !ok {
			continue
		}
		frames[i] = pickStack(stacks[ran[i].id])
		// A call that returned since the snapshot may have passed its runner on: only a
		// call still running on the same runner ran on the profiled goroutine all along.
		if c.runner.Load() != ran[i] {
			frames[i] = nil
		}
		if frames[i] != nil {
			out[i].Where, out[i].Handler = describe(frames[i], 0)
		}
	}
	// A Run inside fn, on fn's goroutine, relabels it for as long as it runs: the outer
	// call is on the inner call's stack, above the next exec frame.
	for i, c := range calls {
		if frames[i] == nil {
			continue
		}
		n := 0
		for a := c.outer(); a != nil; a = a.outer() {
			n++
			j, listed := index[a]
			if listed && frames[j] == nil && ran[j] != nil && a.runner.Load() == ran[j] {
				out[j].Where, out[j].Handler = describe(frames[i], n)
			}
		}
	}
	for i := range out {
		if ran[i] == nil {
			continue
		}
		switch {
		case !ok:
			out[i].Where, out[i].Handler = Unknown, Unknown
		case out[i].Where == "":
			out[i].Where, out[i].Handler = Unknown, Unknown
			e.unknownWhy(unknownNoLabel)
		case out[i].Handler == "":
			out[i].Handler = Unknown
			e.unknownWhy(unknownTooDeep)
		}
	}
	return out
}

// outer returns the tracked call whose fn's context c's caller passed, if any.
func (c *call) outer() *call {
	a, _ := c.parent.Value(callKey{}).(*call)
	return a
}

// unknownWhy logs, once per executor and reason, why a location is unknown.
func (e *Executor) unknownWhy(reason uint32) {
	if e.unknown.Or(reason)&reason != 0 {
		return
	}
	go e.safely(func() {
		e.log.Info("Cannot locate pending calls", "reason", unknownReasons[reason])
	})
}

// labelledStacks returns the stacks of the goroutines labelled with one of want's keys,
// from the goroutine profile. Several goroutines carry the same label when fn started
// goroutines of its own: they inherit its labels.
func labelledStacks(want map[string]int) (map[string][][]uintptr, bool) {
	var buf bytes.Buffer
	if err := pprof.Lookup("goroutine").WriteTo(&buf, 1); err != nil {
		return nil, false
	}
	// Records are "<count> @ <pc> <pc> ...", then "# labels: {...}" if the goroutines have
	// labels, then one "#\t<pc>\t<func>\t<file:line>" line per frame.
	const labelPrefix = "# labels: "
	labelKeyQuoted := strconv.Quote(labelKey) + ":"
	stacks := make(map[string][][]uintptr, len(want))
	var pcs []byte
	for data := buf.Bytes(); len(data) > 0; {
		line := data
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line, data = data[:i], data[i+1:]
		} else {
			data = nil
		}
		if len(line) > 0 && line[0] >= '0' && line[0] <= '9' {
			_, pcs, _ = bytes.Cut(line, []byte(" @ "))
			continue
		}
		labels, ok := bytes.CutPrefix(line, []byte(labelPrefix))
		if !ok || pcs == nil {
			continue
		}
		id, ok := labelValue(string(labels), labelKeyQuoted)
		if _, wanted := want[id]; ok && wanted {
			stacks[id] = append(stacks[id], parsePCs(pcs))
		}
		pcs = nil
	}
	return stacks, true
}

// labelValue finds key's value in a label set printed as {"k1":"v1", "k2":"v2"}, where
// quotedKey is strconv.Quote(key)+":".
func labelValue(labels, quotedKey string) (string, bool) {
	i := strings.Index(labels, quotedKey)
	if i != 1 && (i < 2 || labels[i-2:i] != ", ") { // a key starts the set or follows ", "
		return "", false
	}
	value, err := strconv.QuotedPrefix(labels[i+len(quotedKey):])
	if err != nil {
		return "", false
	}
	v, err := strconv.Unquote(value)
	return v, err == nil
}

func parsePCs(field []byte) []uintptr {
	var pcs []uintptr
	for _, f := range bytes.Fields(field) {
		pc, err := strconv.ParseUint(strings.TrimPrefix(string(f), "0x"), 16, 64)
		if err == nil {
			pcs = append(pcs, uintptr(pc))
		}
	}
	return pcs
}

// pickStack returns the frames of the call's own goroutine among those that carry its
// label: the one running exec (the others are goroutines fn started); if no stack shows
// exec (too deep to be kept whole), the only one.
func pickStack(stacks [][]uintptr) []runtime.Frame {
	var only []runtime.Frame
	for _, pcs := range stacks {
		frames := symbolize(pcs)
		for _, f := range frames {
			if f.Function == execFunc {
				return frames
			}
		}
		only = frames
	}
	if len(stacks) == 1 {
		return only
	}
	return nil
}

func symbolize(pcs []uintptr) []runtime.Frame {
	frames := make([]runtime.Frame, 0, len(pcs))
	it := runtime.CallersFrames(pcs)
	for {
		f, more := it.Next()
		frames = append(frames, f)
		if !more {
			return frames
		}
	}
}

// describe returns where the goroutine of frames (innermost first) is blocked, and the
// handler line of the call whose fn runs above its nth exec frame from the innermost.
// Handler is "" when that exec frame is not in frames.
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
	var fallback string
	for _, f := range frames[:top] {
		if f.Function == "" {
			continue
		}
		pkg := packagePath(f.Function)
		if !isStd(pkg) && !isOwn(pkg, f.File) {
			where = formatFrame(f)
			break
		}
		if fallback == "" && pkg != "runtime" && !strings.HasPrefix(pkg, "runtime/") && !strings.HasPrefix(pkg, "internal/") {
			fallback = formatFrame(f)
		}
	}
	if where == "" {
		where = fallback
	}
	if top == len(frames) {
		return where, ""
	}
	for i := top - 1; i >= 0; i-- {
		if f := frames[i]; f.Function != "" && !isOwn(packagePath(f.Function), f.File) && !isAdapter(f) {
			return where, formatFrame(f)
		}
	}
	return where, ""
}

// reconcilePkg holds controller-runtime's adapters to reconcile.Reconciler (reconcile.Func,
// AsReconciler's), which stand between reconcilers.Wrap and the user's function.
const reconcilePkg = "sigs.k8s.io/controller-runtime/pkg/reconcile"

// isAdapter reports whether f only passes the call on to the user's function: a compiler
// generated wrapper (a method value's), or one of controller-runtime's reconcile adapters.
func isAdapter(f runtime.Frame) bool {
	return f.File == "<autogenerated>" || packagePath(f.Function) == reconcilePkg
}

func formatFrame(f runtime.Frame) string {
	fn := f.Function
	if i := strings.LastIndexByte(fn, '/'); i >= 0 {
		fn = fn[i+1:]
	}
	file := f.File
	if i := strings.LastIndexByte(file, '/'); i >= 0 {
		file = file[i+1:]
	}
	return fn + " (" + file + ":" + strconv.Itoa(f.Line) + ")"
}

// packagePath returns the import path of a function's package, from its full name
// ("example.com/a/b.(*T).M" → "example.com/a/b").
func packagePath(function string) string {
	slash := strings.LastIndexByte(function, '/')
	dot := strings.IndexByte(function[slash+1:], '.')
	if dot < 0 {
		return function
	}
	return function[:slash+1+dot]
}

var (
	// drainPkg is this package's import path, execFunc the function that calls fn.
	drainPkg = packagePath(runtime.FuncForPC(reflect.ValueOf(New).Pointer()).Name())
	execFunc = drainPkg + ".(*call).exec"

	// ownPackages are quiesce's packages whose non-test code runs fn: a location skips
	// their frames to show the handler's own.
	ownPackages = func() []string {
		module := strings.TrimSuffix(drainPkg, "/drain")
		return []string{drainPkg, module + "/reconcilers", module + "/runnable", module + "/internal"}
	}()

	// modules are the paths of the program's modules, its own and its dependencies: a
	// package in none of them is the standard library's. A module path need not have a
	// dot ("module myoperator").
	modules = sync.OnceValue(func() []string {
		info, ok := debug.ReadBuildInfo()
		if !ok {
			return nil
		}
		mods := make([]string, 0, 1+len(info.Deps))
		if info.Main.Path != "" {
			mods = append(mods, info.Main.Path)
		}
		for _, d := range info.Deps {
			mods = append(mods, d.Path)
		}
		return mods
	})
)

// isStd reports whether pkg is in the standard library (or the runtime).
func isStd(pkg string) bool {
	if pkg == "main" || pkg == "command-line-arguments" {
		return false
	}
	first, _, _ := strings.Cut(pkg, "/")
	if strings.Contains(first, ".") {
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
	if strings.HasSuffix(file, "_test.go") {
		return false
	}
	for _, own := range ownPackages {
		if pkg == own {
			return true
		}
	}
	return false
}
