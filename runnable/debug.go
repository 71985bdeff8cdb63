package runnable

import (
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"strconv"

	"github.com/quiesce-dev/quiesce/internal"
	"github.com/quiesce-dev/quiesce/internal/claims"
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
	Claims    *debugClaims     `json:"claims,omitempty"`
}

// debugClaims are the claims of reconcilers.HandOffAtStop, when the Runnable has them.
type debugClaims struct {
	HeldCount    int             `json:"heldCount"`
	Held         []claims.Held   `json:"held"`
	WaitingCount int             `json:"waitingCount"`
	Waiting      []claims.Waited `json:"waiting"`
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
// With reconcilers.HandOffAtStop available (leader election and a lease namespace), "claims"
// adds the claims this replica holds, oldest first, and those of other replicas it waits on,
// soonest to expire first, each list under the same limit and caps as calls, with counts:
//
//	"claims": {"heldCount": 1, "held": [{"object": "ns/a", "controller": "memcached",
//	  "claim": "claim-memcached-a-...", "since": "4s", "renewed": "1s"}], "waitingCount": 0,
//	  "waiting": [{"object": ..., "controller": ..., "claim": ..., "holder": "pod-1_...", "left": "12s"}]}
//
// since and renewed are how long ago the claim was taken and last renewed; left is how long
// the holder keeps the claim by this replica's own observation.
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
	state.Calls = capBytes(state.Calls, &size, &state.Truncated)
	if r.claims != nil {
		n := min(limit, maxDebugCalls)
		c := &debugClaims{}
		c.Held, c.HeldCount = r.claims.Held(n)
		c.Waiting, c.WaitingCount = r.claims.Waiting(n)
		state.Truncated = state.Truncated || len(c.Held) < min(limit, c.HeldCount) ||
			len(c.Waiting) < min(limit, c.WaitingCount)
		c.Held = capBytes(c.Held, &size, &state.Truncated)
		c.Waiting = capBytes(c.Waiting, &size, &state.Truncated)
		state.Claims = c
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(state) // an error here is the client's going away
}

// capBytes returns the first entries of s that keep *size, the bytes rendered so far, within
// maxDebugBytes, adding theirs; it sets *truncated when it drops any.
func capBytes[E any](s []E, size *int, truncated *bool) []E {
	for i, e := range s {
		b, _ := json.Marshal(e)
		if *size += len(b) + 1; *size > maxDebugBytes {
			*truncated = true
			return s[:i]
		}
	}
	return s
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
