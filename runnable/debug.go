package runnable

import (
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"strconv"

	"github.com/quiesce-dev/quiesce/internal"
)

// The bounds of ServeHTTP (see there).
const (
	defaultDebugLimit = internal.MaxListed
	maxDebugCalls     = 1000
	maxDebugBytes     = 256 << 10
	debugRate         = 5
	debugBurst        = 10
)

type debugState struct {
	Draining  bool             `json:"draining"`
	Count     int              `json:"count"`
	Truncated bool             `json:"truncated"`
	Calls     []internal.Entry `json:"calls"`
}

// ServeHTTP serves the executor's pending calls as JSON, for GET only (405 otherwise):
//
//	{"draining": false, "count": 2, "truncated": false, "calls": [{"name": "memcached/ns/a",
//	  "age": "3s", "detached": false, "where": "...", "handler": "..."}, ...]}
//
// count is the number of pending calls; calls lists the oldest 20, or the oldest N with
// ?limit=N, or all with ?limit=all (anything else: 400), but never more than 1,000 calls
// nor 256 KiB of them: truncated says when the caps cut the list short of what was asked.
// Names and locations longer than 256 bytes are cut, and say so.
//
// A request's cost is bounded: the calls are copied under the executor's lock and rendered
// outside it; one capture of the stacks a second serves every asker (newer calls are listed
// without "where" and "handler"); beyond 10 requests at once and 5 a second: 429. ?limit=0,
// the count alone, is free and not limited. See docs/security.md for who should read it.
func (r *Runnable) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		http.Error(w, "method not allowed: use GET", http.StatusMethodNotAllowed)
		return
	}
	limit, ok := debugLimit(req)
	if !ok {
		http.Error(w, "invalid limit: want a non-negative integer or all", http.StatusBadRequest)
		return
	}
	if limit != 0 && !r.debug.TryAccept() {
		w.Header().Set("Retry-After", "1")
		http.Error(w, "too many requests: at most "+strconv.Itoa(debugRate)+" a second", http.StatusTooManyRequests)
		return
	}
	state := debugState{Draining: r.draining()}
	state.Calls, state.Count = r.core().Listing(min(limit, maxDebugCalls))
	state.Truncated = len(state.Calls) < min(limit, state.Count)
	size := 0
	for i, c := range state.Calls {
		b, _ := json.Marshal(c)
		if size += len(b) + 1; size > maxDebugBytes {
			state.Calls, state.Truncated = state.Calls[:i], true
			break
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(state) // an error here is the client's going away
}

// debugLimit returns how many calls req asks for (all: math.MaxInt), and false for a bad ?limit.
func debugLimit(req *http.Request) (int, bool) {
	q := req.URL.Query()
	if !q.Has("limit") {
		return defaultDebugLimit, true
	}
	s := q.Get("limit")
	n, err := strconv.ParseUint(s, 10, 0)
	if s == "all" || errors.Is(err, strconv.ErrRange) || n > math.MaxInt {
		return math.MaxInt, true
	}
	return int(n), err == nil
}
