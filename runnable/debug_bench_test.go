package runnable

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/util/flowcontrol"

	"github.com/quiesce-dev/quiesce/internal"
)

// BenchmarkServeHTTPUnderStream measures a GET of /debug/quiesce while a steady stream of
// short calls begins and ends, among 20,000 goroutines: "calls", 20,000 waiting calls;
// "goroutines", 20,000 goroutines that are no calls (the stream's calls are all there is to
// list, and each is newer than the last capture). ns/op is the GET's latency, allocs/op its
// allocations, captures/s the captures of the stacks per second of the benchmark (each costs
// about as much as the goroutines in the process), captures/op per GET. "default" asks
// without a limit, "all" for every call. The rate limit is lifted, so that every GET is
// answered: what is measured is the cost of an answer, not of a 429.
func BenchmarkServeHTTPUnderStream(b *testing.B) {
	const waiting = 20_000
	for _, scenario := range []string{"calls", "goroutines"} {
		b.Run(scenario, func(b *testing.B) {
			r := New(Options{CancelAfter: -1}).r
			r.debug = flowcontrol.NewFakeAlwaysRateLimiter()
			ex := r.Executor()
			release := make(chan struct{})
			var parked sync.WaitGroup
			for range waiting {
				if scenario == "goroutines" {
					parked.Go(func() { <-release })
				} else if err := ex.Go(context.Background(), "bench/wait", func(context.Context) error { <-release; return nil }); err != nil {
					b.Fatal(err)
				}
			}
			stop := make(chan struct{})
			var feeders sync.WaitGroup
			feeders.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					_ = ex.Call(context.Background(), "bench/stream", func(context.Context) error {
						time.Sleep(100 * time.Microsecond) // a benchmark, not a test: a call's work
						return nil
					})
				}
			})
			defer func() {
				close(stop)
				feeders.Wait()
				close(release)
				parked.Wait()
				if err := ex.Drain(context.Background()); err != nil {
					b.Error(err)
				}
			}()
			for _, tc := range []struct{ name, target string }{
				{"default", "/debug/quiesce"},
				{"all", "/debug/quiesce?limit=99999999999999999999"},
			} {
				b.Run(tc.name, func(b *testing.B) {
					b.ReportAllocs()
					caps, t0 := internal.Captures.Load(), time.Now()
					for b.Loop() {
						rec := httptest.NewRecorder()
						r.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, tc.target, nil))
						if rec.Code != http.StatusOK {
							b.Fatalf("status %d", rec.Code)
						}
					}
					taken := float64(internal.Captures.Load() - caps)
					b.ReportMetric(taken/time.Since(t0).Seconds(), "captures/s")
					b.ReportMetric(taken/float64(b.N), "captures/op")
				})
			}
		})
	}
}
