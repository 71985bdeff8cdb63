package runnable

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	admissionv1 "k8s.io/api/admission/v1"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/quiesce-dev/quiesce/internal/benchpair"
)

// configMap returns a ConfigMap ns/cm as JSON, of about size bytes.
func configMap(b testing.TB, size int) string {
	b.Helper()
	data, err := json.Marshal(map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": "cm", "namespace": "ns", "labels": map[string]string{"app": "bench"}},
		"data":     map[string]string{"payload": strings.Repeat("x", size)},
	})
	if err != nil {
		b.Fatal(err)
	}
	return string(data)
}

// reusableBody is a request body that Reset rewinds, so that each iteration serves the
// same bytes without allocating a reader.
type reusableBody struct{ bytes.Reader }

func (*reusableBody) Close() error { return nil }

// admissionSizes are the objects the admission benchmarks create: a 4 KiB and a 1 MiB ConfigMap.
var admissionSizes = []struct {
	name string
	n    int
}{{"4KiB", 4 << 10}, {"1MiB", 1 << 20}}

// admissionServer returns a function that serves one validating admission request for a
// create of body's object through the same *admission.Webhook, served unwrapped (as the
// inner server registers it) or wrapped (registered through a WebhookServer connected to a
// Runnable: a tracked call named after the request). The handler itself does next to
// nothing, so that the wrapper's share shows.
func admissionServer(b testing.TB, body []byte, wrapped bool) func() {
	b.Helper()
	logf.SetLogger(logr.Discard()) // controller-runtime warns on stderr after 30s without one
	handler := admission.HandlerFunc(func(_ context.Context, req admission.Request) admission.Response {
		if req.Operation != admissionv1.Create || req.Name == "" {
			return admission.Denied("not a named create")
		}
		return admission.Allowed("")
	})
	mux := newFakeServer().WebhookMux()
	wh := &admission.Webhook{Handler: handler}
	if wrapped {
		r, ws := connectedWebhookServer(&lines{})
		b.Cleanup(func() {
			if s := r.ex.Stats(); s.Started != s.Finished || s.Started == 0 {
				b.Errorf("Stats = %+v, want every request a tracked call", s)
			}
		})
		ws.Register("/validate", wh)
		mux = ws.WebhookMux()
	} else {
		mux.Handle("/validate", wh) // as the inner server registers it
	}
	req := httptest.NewRequest(http.MethodPost, "/validate", nil)
	req.Header.Set("Content-Type", jsonType)
	h, _ := mux.Handler(req)
	rb := &reusableBody{}
	return func() {
		rb.Reset(body)
		req.Body = rb // whatever a wrapper did with it
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK || !bytes.Contains(rec.Body.Bytes(), []byte(`"allowed":true`)) {
			b.Fatalf("response %d %q, want allowed", rec.Code, rec.Body)
		}
	}
}

// BenchmarkAdmission measures what the WebhookServer adds to a validating admission
// webhook (see admissionServer), for a create of a 4 KiB and a 1 MiB ConfigMap. Besides
// ns/op, it reports cpu-ns/op, the process's CPU time per request, steadier than ns/op on a
// busy machine.
func BenchmarkAdmission(b *testing.B) {
	for _, size := range admissionSizes {
		body := admissionReview(b, "ns", "cm", configMap(b, size.n))
		for _, wrapped := range []bool{false, true} {
			variant := "unwrapped"
			if wrapped {
				variant = "wrapped"
			}
			b.Run(size.name+"/"+variant, func(b *testing.B) {
				serve := admissionServer(b, body, wrapped)
				b.SetBytes(int64(len(body)))
				b.ReportAllocs()
				n, cpu0, cpuOK := 0, time.Duration(0), false
				for b.Loop() {
					if n == 0 {
						cpu0, cpuOK = processCPU()
					}
					n++
					serve()
				}
				// The CPU time per request: unlike ns/op, it does not grow while other
				// processes hold the CPUs.
				if cpu1, ok := processCPU(); ok && cpuOK {
					b.ReportMetric(float64(cpu1-cpu0)/float64(n), "cpu-ns/op")
				}
			})
		}
	}
}

// BenchmarkAdmissionInterleaved is BenchmarkAdmission with both variants in one process,
// alternating in blocks of about 5 ms, for the budget of issue 50: wrapped ≤ 1.10× unwrapped
// in time at 4 KiB and 1 MiB, and in bytes allocated per request. It reports the median
// ratio of their times over the blocks (wrapped/unwrapped) and the ratio of the bytes each
// allocates per request (wrapped/unwrapped-B), with each one's B/op and allocs/op.
func BenchmarkAdmissionInterleaved(b *testing.B) {
	for _, size := range admissionSizes {
		body := admissionReview(b, "ns", "cm", configMap(b, size.n))
		b.Run(size.name, func(b *testing.B) {
			wrapped, unwrapped := admissionServer(b, body, true), admissionServer(b, body, false)
			loop := func(serve func()) func(n int) {
				return func(n int) {
					for range n {
						serve()
					}
				}
			}
			block := max(1, (5<<20)/len(body)/20) // ~5 ms of requests
			_, _, ratio := benchpair.Interleaved(b, block, "wrapped", loop(wrapped), "unwrapped", loop(unwrapped))
			b.ReportMetric(ratio, "wrapped/unwrapped")
			runs := max(4, (40<<20)/len(body)/20)
			wb, wa := memPerRun(runs, wrapped)
			ub, ua := memPerRun(runs, unwrapped)
			b.ReportMetric(wb/ub, "wrapped/unwrapped-B")
			b.ReportMetric(wb, "wrapped-B/op")
			b.ReportMetric(ub, "unwrapped-B/op")
			b.ReportMetric(wa, "wrapped-allocs/op")
			b.ReportMetric(ua, "unwrapped-allocs/op")
		})
	}
}

// memPerRun returns the mean bytes and allocations of runs calls of f, after one call.
func memPerRun(runs int, f func()) (allocated, allocs float64) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1)) // as testing.AllocsPerRun: no other goroutine's
	f()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range runs {
		f()
	}
	runtime.ReadMemStats(&after)
	return float64(after.TotalAlloc-before.TotalAlloc) / float64(runs),
		float64(after.Mallocs-before.Mallocs) / float64(runs)
}
