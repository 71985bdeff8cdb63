package runnable

import (
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"strconv"

	"github.com/quiesce-dev/quiesce/internal"
)

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
// count is the number of pending calls; calls lists them oldest first, all of them or the
// oldest N with the query ?limit=N (N >= 0, and N beyond any int means all; anything else
// gives 400). Names and locations longer than 256 bytes are cut, and say so. Finding where each
// call waits captures the goroutines' stacks, once per request, so the handler is meant for
// a person or an occasional probe, not a tight loop. Add serves it at DebugPath on the
// manager's metrics server, behind the server's FilterProvider (authentication and
// authorization when SecureServing is set) like /metrics.
func (r *Runnable) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		http.Error(w, "method not allowed: use GET", http.StatusMethodNotAllowed)
		return
	}
	limit := -1
	if q := req.URL.Query(); q.Has("limit") {
		n, err := strconv.ParseUint(q.Get("limit"), 10, 0)
		switch {
		case errors.Is(err, strconv.ErrRange) || n > math.MaxInt:
			// larger than any list: all of them
		case err != nil:
			http.Error(w, "invalid limit: want a non-negative integer", http.StatusBadRequest)
			return
		default:
			limit = int(n)
		}
	}
	state := debugState{Draining: r.draining()}
	state.Calls, state.Count = r.core().Entries(limit)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(state) // an error here is the client's going away
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
