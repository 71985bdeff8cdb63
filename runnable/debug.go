package runnable

import (
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"strconv"
	"sync"

	"k8s.io/client-go/util/flowcontrol"

	"github.com/quiesce-dev/quiesce/internal"
)

// defaultDebugLimit is how many calls ServeHTTP lists without ?limit: the oldest ones.
const defaultDebugLimit = internal.MaxListed

// debugRate and debugBurst bound the requests ServeHTTP answers: debugBurst at once, then
// debugRate a second; the others are answered 429 Too Many Requests with Retry-After: 1.
const (
	debugRate  = 5
	debugBurst = 10
)

// debugView is the state of ServeHTTP: its rate limiter, made at the first request.
type debugView struct {
	once    sync.Once
	limiter flowcontrol.PassiveRateLimiter
}

// debugState is the body of ServeHTTP.
type debugState struct {
	Draining bool             `json:"draining"`
	Count    int              `json:"count"`
	Calls    []internal.Entry `json:"calls"`
}

// ServeHTTP serves the executor's pending calls as JSON, for GET only (405 otherwise):
//
//	{"draining": false, "count": 2, "calls": [{"name": "memcached/ns/a", "age": "3s",
//	  "detached": false, "where": "...", "handler": "..."}, ...]}
//
// count is the number of pending calls; calls lists the oldest 20 of them,
// oldest first, or the oldest N with the query ?limit=N (N >= 0; beyond any int: all), or
// all of them with ?limit=all; anything else gives 400. Names and locations longer than
// 256 bytes are cut, and say so.
//
// What a request costs is bounded, whoever sends it and however many calls begin meanwhile:
//   - The calls listed are copied under the executor's lock (for the default limit, 20
//     pointers) and rendered outside it, so a request delays admitting calls by no more
//     than that copy.
//   - Finding where each call waits captures every goroutine's stack; one capture serves
//     every request (and every other asker) for a second. Calls that began after it are
//     listed with an empty "where" and "handler" instead of paying for a capture of their
//     own: at most one capture a second, however many requests come.
//   - Beyond 10 requests at once and 5 a second, the answer is 429 Too
//     Many Requests with Retry-After: 1, before anything is listed. ?limit=0, the count
//     alone, lists nothing and captures nothing: it is not limited, so that a harness
//     (shutdowntest.Operator.PendingCount) may poll it.
//
// Add serves it at DebugPath on the manager's metrics server, behind the server's
// FilterProvider (authentication and authorization when SecureServing is set); see
// docs/security.md for who should be allowed to read it.
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
	r.debug.once.Do(func() {
		r.debug.limiter = flowcontrol.NewTokenBucketPassiveRateLimiterWithClock(debugRate, debugBurst, r.clock)
	})
	if limit != 0 && !r.debug.limiter.TryAccept() {
		w.Header().Set("Retry-After", "1")
		http.Error(w, "too many requests: at most "+strconv.Itoa(debugRate)+" a second", http.StatusTooManyRequests)
		return
	}
	state := debugState{Draining: r.draining()}
	state.Calls, state.Count = r.core().Listing(limit)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(state) // an error here is the client's going away
}

// debugLimit returns how many calls req asks for (-1: all), and false for a bad ?limit.
func debugLimit(req *http.Request) (int, bool) {
	q := req.URL.Query()
	if !q.Has("limit") {
		return defaultDebugLimit, true
	}
	s := q.Get("limit")
	if s == "all" {
		return -1, true
	}
	n, err := strconv.ParseUint(s, 10, 0)
	switch {
	case errors.Is(err, strconv.ErrRange) || n > math.MaxInt:
		return -1, true // larger than any list: all of them
	case err != nil:
		return 0, false
	default:
		return int(n), true
	}
}

// draining reports whether the executor's drain began.
func (r *Runnable) draining() bool {
	select {
	case <-r.ex.Draining():
		return true
	default:
		return false
	}
}
