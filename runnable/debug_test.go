package runnable_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	testingclock "k8s.io/utils/clock/testing"

	"github.com/quiesce-dev/quiesce/internal"
	"github.com/quiesce-dev/quiesce/runnable"
)

type debugCall struct {
	Name     string `json:"name"`
	Age      string `json:"age"`
	Detached bool   `json:"detached"`
	Where    string `json:"where"`
	Handler  string `json:"handler"`
}

type debugBody struct {
	Draining  bool        `json:"draining"`
	Count     int         `json:"count"`
	Truncated bool        `json:"truncated"`
	Calls     []debugCall `json:"calls"`
}

// serve runs a request against r and returns the response; body is decoded on 200.
func serve(t *testing.T, r *runnable.Runnable, method, target string) (*http.Response, debugBody) {
	t.Helper()
	rec := httptest.NewRecorder()
	r.ServeHTTP(rec, httptest.NewRequest(method, target, nil))
	res := rec.Result()
	var body debugBody
	if res.StatusCode == http.StatusOK {
		if ct := res.Header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("Content-Type = %q, want application/json", ct)
		}
		if err := json.NewDecoder(res.Body).Decode(&body); err != nil {
			t.Fatalf("decoding the body: %v", err)
		}
	}
	return res, body
}

func names(calls []debugCall) []string {
	out := make([]string, len(calls))
	for i, c := range calls {
		out[i] = c.Name + " " + c.Age
	}
	return out
}

func TestServeHTTP(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := runnable.NewUnmanaged(runnable.Options{CancelAfter: -1})
		_, body := serve(t, r, http.MethodGet, "/debug/quiesce")
		if body.Draining || body.Count != 0 || body.Calls == nil || len(body.Calls) != 0 {
			t.Fatalf("with nothing pending: %+v, want not draining, count 0 and calls []", body)
		}

		release := make(chan struct{})
		hangAll(t, r, 3, release) // ages 3s, 2s, 1s
		_, body = serve(t, r, http.MethodGet, "/debug/quiesce")
		want := []string{"ctrl/ns/00/hang 3s", "ctrl/ns/01/hang 2s", "ctrl/ns/02/hang 1s"}
		if got := names(body.Calls); body.Draining || body.Count != 3 || !slices.Equal(got, want) {
			t.Fatalf("body = %+v, want not draining, count 3, calls %q oldest first", body, want)
		}
		for _, c := range body.Calls {
			const at = "runnable_test.hangAll.func1 (runnable_test.go:"
			if !c.Detached || !strings.HasPrefix(c.Where, at) || !strings.HasPrefix(c.Handler, at) {
				t.Errorf("call %+v, want detached (started with Go), where and handler in hangAll", c)
			}
		}

		_, body = serve(t, r, http.MethodGet, "/debug/quiesce?limit=2")
		if got := names(body.Calls); body.Count != 3 || !slices.Equal(got, want[:2]) {
			t.Fatalf("?limit=2: %+v, want count 3 and the 2 oldest calls", body)
		}
		_, body = serve(t, r, http.MethodGet, "/debug/quiesce?limit=0")
		if body.Count != 3 || len(body.Calls) != 0 {
			t.Fatalf("?limit=0: %+v, want count 3 and no call", body)
		}
		_, body = serve(t, r, http.MethodGet, "/debug/quiesce?limit=10")
		if len(body.Calls) != 3 {
			t.Fatalf("?limit=10: %+v, want the 3 calls", body)
		}
		_, body = serve(t, r, http.MethodGet, "/debug/quiesce?limit=99999999999999999999999")
		if len(body.Calls) != 3 {
			t.Fatalf("?limit beyond any int: %+v, want all 3 calls", body)
		}

		// Draining shows while the drain waits for the calls.
		drained := make(chan error, 1)
		go func() { drained <- r.Executor().Drain(context.Background()) }()
		synctest.Wait()
		_, body = serve(t, r, http.MethodGet, "/debug/quiesce")
		if !body.Draining || body.Count != 3 {
			t.Fatalf("while draining: %+v, want draining and count 3", body)
		}
		close(release)
		if err := <-drained; err != nil {
			t.Fatal(err)
		}
		_, body = serve(t, r, http.MethodGet, "/debug/quiesce")
		if !body.Draining || body.Count != 0 {
			t.Fatalf("drained: %+v, want draining and count 0", body)
		}
	})
}

func TestServeHTTPBadRequests(t *testing.T) {
	r := runnable.NewUnmanaged(runnable.Options{})
	for _, target := range []string{"/?limit=-1", "/?limit=x", "/?limit=", "/?limit=1.5"} {
		if res, _ := serve(t, r, http.MethodGet, target); res.StatusCode != http.StatusBadRequest {
			t.Errorf("GET %s: status %d, want 400", target, res.StatusCode)
		}
	}
	for _, method := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodHead} {
		res, _ := serve(t, r, method, "/")
		if res.StatusCode != http.StatusMethodNotAllowed || res.Header.Get("Allow") != http.MethodGet {
			t.Errorf("%s: status %d, Allow %q; want 405 and Allow: GET", method, res.StatusCode, res.Header.Get("Allow"))
		}
	}
}

func TestServeHTTPCutsLongNames(t *testing.T) {
	r := runnable.NewUnmanaged(runnable.Options{})
	release := make(chan struct{})
	huge := "line one\n" + strings.Repeat("x", 10<<20)
	if err := r.Executor().Go(context.Background(), huge, func(context.Context) error { <-release; return nil }); err != nil {
		t.Fatal(err)
	}
	_, body := serve(t, r, http.MethodGet, "/debug/quiesce")
	close(release)
	if err := r.Executor().Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(body.Calls) != 1 {
		t.Fatalf("calls = %d, want 1", len(body.Calls))
	}
	name := body.Calls[0].Name
	if len(name) > 300 || !strings.HasPrefix(name, "line one\n") || !strings.HasSuffix(name, fmt.Sprintf("(%d bytes)", len(huge))) {
		t.Fatalf("name = %.80q... (%d bytes), want it cut to 256 bytes and marked with its length", name, len(name))
	}
}

func TestServeHTTPDefaultLimitAndAll(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := runnable.NewUnmanaged(runnable.Options{CancelAfter: -1})
		release := make(chan struct{})
		hangAll(t, r, runnable.DebugLimitForTest+5, release)
		defer func() {
			close(release)
			if err := r.Executor().Drain(context.Background()); err != nil {
				t.Error(err)
			}
		}()
		_, body := serve(t, r, http.MethodGet, "/debug/quiesce")
		if body.Count != runnable.DebugLimitForTest+5 || len(body.Calls) != runnable.DebugLimitForTest ||
			body.Calls[0].Name != "ctrl/ns/00/hang" {
			t.Fatalf("without ?limit: count %d, %d calls from %q; want count %d and the %d oldest",
				body.Count, len(body.Calls), body.Calls[0].Name, runnable.DebugLimitForTest+5, runnable.DebugLimitForTest)
		}
		_, body = serve(t, r, http.MethodGet, "/debug/quiesce?limit=all")
		if len(body.Calls) != runnable.DebugLimitForTest+5 {
			t.Fatalf("?limit=all: %d calls, want %d", len(body.Calls), runnable.DebugLimitForTest+5)
		}
		if res, _ := serve(t, r, http.MethodGet, "/debug/quiesce?limit=ALL"); res.StatusCode != http.StatusBadRequest {
			t.Fatalf("?limit=ALL: status %d, want 400", res.StatusCode)
		}
	})
}

func TestServeHTTPSharesOneCaptureASecond(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := runnable.NewUnmanaged(runnable.Options{CancelAfter: -1})
		release := make(chan struct{})
		hangAll(t, r, 1, release)
		defer func() {
			close(release)
			if err := r.Executor().Drain(context.Background()); err != nil {
				t.Error(err)
			}
		}()
		caps := internal.Captures.Load()
		_, body := serve(t, r, http.MethodGet, "/debug/quiesce")
		if len(body.Calls) != 1 || body.Calls[0].Where == "" {
			t.Fatalf("first GET: %+v, want the call located", body.Calls)
		}
		// A call that begins after the capture is listed without a location for the rest
		// of the second, rather than paid for with a capture of its own.
		if err := r.Executor().Go(context.Background(), "late", func(context.Context) error { <-release; return nil }); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		for range 3 {
			_, body = serve(t, r, http.MethodGet, "/debug/quiesce")
			if len(body.Calls) != 2 || body.Calls[0].Where == "" || body.Calls[1].Name != "late" ||
				body.Calls[1].Where != "" || body.Calls[1].Handler != "" {
				t.Fatalf("GET within the second: %+v, want the first located and late listed without a location", body.Calls)
			}
		}
		if n := internal.Captures.Load() - caps; n != 1 {
			t.Fatalf("captures within the second: %d, want 1", n)
		}
		time.Sleep(time.Second) // the capture ages out
		_, body = serve(t, r, http.MethodGet, "/debug/quiesce")
		if len(body.Calls) != 2 || !strings.HasPrefix(body.Calls[1].Where, "runnable_test.") {
			t.Fatalf("GET a second later: %+v, want late located", body.Calls)
		}
		if n := internal.Captures.Load() - caps; n != 2 {
			t.Fatalf("captures after a second: %d, want 2", n)
		}
	})
}

// TestServeHTTPUnderStreamOfCalls asks every 250ms for 5s while calls begin all the time:
// each GET lists a call newer than the last capture, yet there is at most one capture a
// second.
func TestServeHTTPUnderStreamOfCalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := runnable.NewUnmanaged(runnable.Options{CancelAfter: -1})
		ex := r.Executor()
		stop := make(chan struct{})
		var streamed sync.WaitGroup
		streamed.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				_ = ex.Go(context.Background(), "stream", func(context.Context) error {
					time.Sleep(100 * time.Millisecond) // fake time: the call's work
					return nil
				})
				time.Sleep(10 * time.Millisecond)
			}
		})
		caps := internal.Captures.Load()
		const gets = 20
		for range gets {
			time.Sleep(250 * time.Millisecond)
			res, body := serve(t, r, http.MethodGet, "/debug/quiesce")
			if res.StatusCode != http.StatusOK || body.Count == 0 {
				t.Fatalf("GET: status %d, %+v; want 200 and the streamed calls", res.StatusCode, body)
			}
		}
		if n := internal.Captures.Load() - caps; n > gets/4+1 {
			t.Errorf("captures in %d GETs over 5s: %d, want at most one a second", gets, n)
		}
		close(stop)
		streamed.Wait()
		if err := ex.Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}

// TestServeHTTPCostIsBoundedByWhatItShows: without ?limit, a GET that shares the second's
// capture allocates as much with 2,000 calls pending as with 20.
func TestServeHTTPCostIsBoundedByWhatItShows(t *testing.T) {
	allocs := func(pending int) float64 {
		var out float64
		synctest.Test(t, func(t *testing.T) {
			r := runnable.NewUnmanaged(runnable.Options{CancelAfter: -1})
			release := make(chan struct{})
			for range pending {
				if err := r.Executor().Go(context.Background(), "wait", func(context.Context) error { <-release; return nil }); err != nil {
					t.Fatal(err)
				}
			}
			synctest.Wait()
			// A warm-up run and 9 more: within the burst, sharing the warm-up's capture.
			out = testing.AllocsPerRun(runnable.DebugBurstForTest-1, func() {
				rec := httptest.NewRecorder()
				r.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/debug/quiesce", nil))
				if rec.Code != http.StatusOK {
					t.Errorf("GET: status %d, want 200", rec.Code)
				}
			})
			close(release)
			if err := r.Executor().Drain(context.Background()); err != nil {
				t.Error(err)
			}
		})
		return out
	}
	few, many := allocs(runnable.DebugLimitForTest), allocs(100*runnable.DebugLimitForTest)
	if many > few*1.2+10 {
		t.Fatalf("allocations per GET: %.0f with %d pending, %.0f with %d; want them about equal",
			few, runnable.DebugLimitForTest, many, 100*runnable.DebugLimitForTest)
	}
}

func TestServeHTTPRateLimit(t *testing.T) {
	clk := testingclock.NewFakeClock(time.Unix(1, 0))
	r := runnable.NewUnmanaged(runnable.Options{Clock: clk})
	for i := range runnable.DebugBurstForTest {
		if res, _ := serve(t, r, http.MethodGet, "/debug/quiesce"); res.StatusCode != http.StatusOK {
			t.Fatalf("GET %d of a burst: status %d, want 200", i, res.StatusCode)
		}
	}
	res, _ := serve(t, r, http.MethodGet, "/debug/quiesce")
	if res.StatusCode != http.StatusTooManyRequests || res.Header.Get("Retry-After") != "1" {
		t.Fatalf("GET beyond the burst: status %d, Retry-After %q; want 429 and 1", res.StatusCode, res.Header.Get("Retry-After"))
	}
	clk.Step(time.Second)
	ok := 0
	for range 2 * runnable.DebugRateForTest {
		if res, _ := serve(t, r, http.MethodGet, "/debug/quiesce"); res.StatusCode == http.StatusOK {
			ok++
		}
	}
	if ok != runnable.DebugRateForTest {
		t.Fatalf("GETs answered a second later: %d, want %d", ok, runnable.DebugRateForTest)
	}
	// The count alone costs nothing: never limited.
	for range 3 * runnable.DebugBurstForTest {
		if res, _ := serve(t, r, http.MethodGet, "/debug/quiesce?limit=0"); res.StatusCode != http.StatusOK {
			t.Fatalf("GET ?limit=0 beyond the rate: status %d, want 200", res.StatusCode)
		}
	}
}

// Whatever ?limit asks, an answer lists at most 1,000 calls and 256 KiB of them, and says
// when it was cut short (issue 43: ?limit=all answered every pending call, 9 MB for 20,000).
// Fails on the code before: 1,500 calls listed, and no "truncated".
func TestServeHTTPAnswersAreBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, tc := range []struct {
			name      string
			nameBytes int
			limit     string
			calls     int // -1: fewer than 1,000, by the byte cap
			truncated bool
		}{
			{"short names, all", 10, "all", runnable.DebugMaxCallsForTest, true},
			{"short names, a large limit", 10, "100000", runnable.DebugMaxCallsForTest, true},
			{"short names, 5", 10, "5", 5, false},
			{"long names, all", 250, "all", -1, true},
		} {
			r := runnable.NewUnmanaged(runnable.Options{CancelAfter: -1})
			release := make(chan struct{})
			const pending = 1500
			for i := range pending {
				name := fmt.Sprintf("%0*d", tc.nameBytes, i)
				if err := r.Executor().Go(context.Background(), name, func(context.Context) error { <-release; return nil }); err != nil {
					t.Fatal(err)
				}
			}
			synctest.Wait()
			rec := httptest.NewRecorder()
			r.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/debug/quiesce?limit="+tc.limit, nil))
			size := rec.Body.Len()
			var body debugBody
			if err := json.NewDecoder(rec.Body).Decode(&body); err != nil {
				t.Fatal(err)
			}
			n := len(body.Calls)
			if body.Count != pending || body.Truncated != tc.truncated || (tc.calls >= 0 && n != tc.calls) ||
				(tc.calls < 0 && (n >= runnable.DebugMaxCallsForTest || n < 100)) || size > runnable.DebugMaxBytesForTest+1024 {
				t.Errorf("%s: count %d, %d calls, truncated %v, %d bytes; want count %d, %d calls (-1: cut by bytes), "+
					"truncated %v, at most %d bytes", tc.name, body.Count, n, body.Truncated, size, pending, tc.calls,
					tc.truncated, runnable.DebugMaxBytesForTest)
			}
			close(release)
			if err := r.Executor().Drain(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
	})
}
