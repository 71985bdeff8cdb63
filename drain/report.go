package drain

import (
	"cmp"
	"context"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// reportEntry is one call in a report's "calls" list.
type reportEntry struct {
	Name     string `json:"name"`
	Age      string `json:"age"`
	Detached bool   `json:"detached"`
	Where    string `json:"where"`
}

// report logs one line about the pending calls, if any.
func (e *Executor) report() {
	total, shown := e.oldest(maxReported)
	if total == 0 {
		return
	}
	e.fillWhere(shown)
	now := e.clock.Now()
	calls := make([]reportEntry, len(shown))
	for i, p := range shown {
		calls[i] = reportEntry{Name: p.Name, Age: age(now.Sub(p.Started)), Detached: p.Detached, Where: p.Where}
	}
	kv := []any{"pending", total, "calls", calls}
	if more := total - len(shown); more > 0 {
		kv = append(kv, "more", more)
	}
	e.log.Info("Waiting for pending calls", kv...)
}

// age rounds d for reading: whole seconds from 1s on, milliseconds below.
func age(d time.Duration) string {
	if d >= time.Second {
		return d.Round(time.Second).String()
	}
	return d.Round(time.Millisecond).String()
}

// fillWhere sets Where of each call that still runs, from one capture of all stacks.
// runtime.GoroutineProfile keeps the innermost 32 frames of each goroutine: a call whose fn
// is blocked more than about 28 frames deep loses the id digits and keeps Where empty.
func (e *Executor) fillWhere(pending []pendingCall) {
	if len(pending) == 0 {
		return
	}
	marks := calibrate()
	if !marks.ok {
		return
	}
	// pending's indexes by worker id, for a binary search per decoded id: no map to build.
	byID := make([]idIndex, len(pending))
	for i, p := range pending {
		byID[i] = idIndex{p.worker.id, i}
	}
	slices.SortFunc(byID, func(a, b idIndex) int { return cmp.Compare(a.id, b.id) })
	// Where is the same for every stack with the same frames above the id marks, when
	// it is found among them: 10,000 calls blocked at one line are formatted once.
	var wheres map[[maxStack]uintptr]string
	e.stackMu.Lock()
	defer e.stackMu.Unlock()
	records := e.captureStacks()
	for i := range records {
		stack := records[i].Stack() // by index: a copy of the record would escape
		// A stack spells more than one id when a call's fn made a Run on its own
		// goroutine: every call on it is blocked at the same line.
		var at string
		for rest := stack; ; {
			id, ok, below := marks.nextID(rest)
			if below == nil {
				break
			}
			rest = below
			if !ok {
				continue
			}
			j, ok := slices.BinarySearchFunc(byID, id, func(x idIndex, id uint32) int { return cmp.Compare(x.id, id) })
			if !ok {
				continue
			}
			p := &pending[byID[j].i]
			// The worker may have finished the call, exited and given its id to another
			// worker since the snapshot. A call runs once, so if it still runs now it ran
			// all along, on the worker that owns the id.
			if p.worker.cur.Load() != p.call {
				continue
			}
			if at == "" {
				if wheres == nil {
					wheres = make(map[[maxStack]uintptr]string)
				}
				at = cachedWhere(wheres, stack, marks)
			}
			p.Where = at
		}
	}
}

// maxStack is the depth of a runtime.StackRecord.
const maxStack = len(runtime.StackRecord{}.Stack0)

type idIndex struct {
	id uint32
	i  int
}

// cachedWhere returns where(stack), from cache when the frames above the first id mark
// gave it before.
func cachedWhere(cache map[[maxStack]uintptr]string, stack []uintptr, marks *idMarks) string {
	top := 0
	for top < len(stack) && marks.mark(stack[top]) == 0 {
		top++
	}
	var key [maxStack]uintptr
	copy(key[:], stack[:top])
	if at, ok := cache[key]; ok {
		return at
	}
	if at, found := scanWhere(stack[:top]); found {
		// Found above the marks: the frames below cannot change it.
		cache[key] = at
		return at
	}
	return where(stack)
}

// captureStacks returns the stacks of all goroutines, reusing e.stackBuf.
// The caller holds e.stackMu.
func (e *Executor) captureStacks() []runtime.StackRecord {
	for {
		n, ok := runtime.GoroutineProfile(e.stackBuf)
		if ok {
			return e.stackBuf[:n]
		}
		e.stackBuf = make([]runtime.StackRecord, n+n/8+16)
	}
}

// idMarks are the return addresses that spell writes on a call's stack, as a table
// indexed by address: one cheap lookup per frame while thousands of stacks are decoded.
type idMarks struct {
	ok    bool
	base  uintptr  // the lowest mark
	table []uint16 // by address - base: 0 for none, 1+d for a lowest digit d, 257+d for a higher one
}

const (
	lowMark  = 1   // table value of the lowest digit 0: spell's call of fn in case 0
	highMark = 257 // table value of a higher digit 0: spell's call of spell in case 0
)

var (
	marksOnce sync.Once
	marks     idMarks
)

// calibrate learns the return addresses of spell by running calls through it, on an
// executor of its own, whose fn records its caller's return addresses.
func calibrate() *idMarks {
	marksOnce.Do(func() {
		var low, high [256]uintptr
		ok := true
		e := New(Options{CancelAfter: -1})
		probe := func(id uint32, digits int) (pcs [2]uintptr) {
			c, err := e.admit(context.Background(), "calibrate", func(context.Context) error {
				runtime.Callers(2, pcs[:]) // skip Callers and this func: spell's frames
				return nil
			})
			if err != nil {
				ok = false
				return pcs
			}
			w := &worker{e: e, id: id, digits: digits} // a runner: one call
			w.spell(digits, c)
			return pcs
		}
		for d := range uint32(256) {
			low[d] = probe(d, 1)[0]
			pcs := probe(d<<8, 2)
			high[d] = pcs[1]
			if pcs[0] != low[0] {
				ok = false
			}
		}
		lo, hi := low[0], low[0]
		for _, pc := range append(low[:], high[:]...) {
			lo, hi = min(lo, pc), max(hi, pc)
		}
		if !ok || low[0] == 0 || hi-lo > 1<<20 {
			return
		}
		m := idMarks{ok: true, base: lo, table: make([]uint16, hi-lo+1)}
		for d := range 256 {
			for _, mark := range []struct {
				pc    uintptr
				value uint16
			}{{low[d], lowMark + uint16(d)}, {high[d], highMark + uint16(d)}} {
				if m.table[mark.pc-lo] != 0 {
					return // two digits share a return address: no id can be read
				}
				m.table[mark.pc-lo] = mark.value
			}
		}
		marks = m
	})
	return &marks
}

// mark returns the table value of pc: 0 unless spell wrote it.
func (m *idMarks) mark(pc uintptr) uint16 {
	if off := pc - m.base; off < uintptr(len(m.table)) {
		return m.table[off]
	}
	return 0
}

// decodeID reads the innermost worker id that spell wrote on stack (innermost frame
// first). It fails for goroutines that run no call, and for stacks cut off within the
// digits.
func (m *idMarks) decodeID(stack []uintptr) (uint32, bool) {
	id, ok, _ := m.nextID(stack)
	return id, ok
}

// nextID decodes the innermost worker id spelled on stack, and returns the frames below
// its digits, where more ids may be spelled (a Run inside a call's fn). below is nil when
// stack spells no further id, or its digits were cut off.
func (m *idMarks) nextID(stack []uintptr) (id uint32, ok bool, below []uintptr) {
	i := 0
	for ; i < len(stack); i++ {
		if v := m.mark(stack[i]); v != 0 && v < highMark {
			id = uint32(v - lowMark)
			break
		}
	}
	for i, n := i+1, 1; i < len(stack); i, n = i+1, n+1 {
		v := m.mark(stack[i])
		if v < highMark {
			// A frame below the digits (the goroutine's start, or Run) was recorded: no digit
			// was cut off.
			return id, true, stack[i:]
		}
		id |= uint32(v-highMark) << (8 * n)
	}
	return 0, false, nil
}

// where formats the first frame of stack that belongs to neither the Go runtime and
// standard library nor quiesce's own executor and wrappers: "pkg.Func (file.go:123)".
func where(stack []uintptr) string {
	at, _ := scanWhere(stack)
	return at
}

// scanWhere returns where's answer and whether it found such a frame; if not, it returns
// the first frame outside the runtime, if any.
func scanWhere(stack []uintptr) (at string, found bool) {
	if len(stack) == 0 {
		return "", false
	}
	var fallback string
	frames := runtime.CallersFrames(stack)
	for {
		f, more := frames.Next()
		if f.Function != "" {
			pkg := packagePath(f.Function)
			if !isStd(pkg) && !isOwn(pkg, f.File) {
				return formatFrame(f), true
			}
			if fallback == "" && pkg != "runtime" && !strings.HasPrefix(pkg, "runtime/") && !strings.HasPrefix(pkg, "internal/") {
				fallback = formatFrame(f)
			}
		}
		if !more {
			return fallback, false
		}
	}
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

// isStd reports whether pkg is in the standard library (or the runtime): its first path
// element has no dot. "main" is a program's own package.
func isStd(pkg string) bool {
	first, _, _ := strings.Cut(pkg, "/")
	return pkg != "main" && !strings.Contains(first, ".")
}

// ownPackages are quiesce's packages whose non-test code runs fn; a report skips their
// frames to show the handler's own.
var ownPackages = []string{
	"github.com/quiesce-dev/quiesce/drain",
	"github.com/quiesce-dev/quiesce/reconcilers",
	"github.com/quiesce-dev/quiesce/runnable",
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
