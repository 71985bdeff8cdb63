package runnable

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	admissionv1 "k8s.io/api/admission/v1"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// configMap returns a ConfigMap ns/cm as JSON, of about size bytes.
func configMap(b *testing.B, size int) string {
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

// BenchmarkAdmission measures what the WebhookServer adds to a validating admission
// webhook: the same *admission.Webhook served unwrapped (as the inner server registers it)
// and wrapped (registered through a WebhookServer connected to a Runnable: a tracked call
// named after the request), for a create of a 4 KiB and a 1 MiB ConfigMap. The handler
// itself does next to nothing, so that the wrapper's share shows. Besides ns/op, it reports
// cpu-ns/op, the process's CPU time per request, steadier than ns/op on a busy machine.
func BenchmarkAdmission(b *testing.B) {
	logf.SetLogger(logr.Discard()) // controller-runtime warns on stderr after 30s without one
	handler := admission.HandlerFunc(func(_ context.Context, req admission.Request) admission.Response {
		if req.Operation != admissionv1.Create || req.Name == "" {
			return admission.Denied("not a named create")
		}
		return admission.Allowed("")
	})
	for _, size := range []struct {
		name string
		n    int
	}{{"4KiB", 4 << 10}, {"1MiB", 1 << 20}} {
		body := admissionReview(b, "ns", "cm", configMap(b, size.n))
		for _, wrapped := range []bool{false, true} {
			variant := "unwrapped"
			if wrapped {
				variant = "wrapped"
			}
			b.Run(size.name+"/"+variant, func(b *testing.B) {
				mux := newFakeServer().WebhookMux()
				wh := &admission.Webhook{Handler: handler}
				if wrapped {
					r, ws := connectedWebhookServer(&lines{})
					defer func() {
						if s := r.ex.Stats(); s.Started != s.Finished || s.Started == 0 {
							b.Errorf("Stats = %+v, want every request a tracked call", s)
						}
					}()
					ws.Register("/validate", wh)
					mux = ws.WebhookMux()
				} else {
					mux.Handle("/validate", wh) // as the inner server registers it
				}
				req := httptest.NewRequest(http.MethodPost, "/validate", nil)
				req.Header.Set("Content-Type", jsonType)
				h, _ := mux.Handler(req)
				rb := &reusableBody{}
				b.SetBytes(int64(len(body)))
				b.ReportAllocs()
				n, cpu0, cpuOK := 0, time.Duration(0), false
				for b.Loop() {
					if n == 0 {
						cpu0, cpuOK = processCPU()
					}
					n++
					rb.Reset(body)
					req.Body = rb // whatever a wrapper did with it
					rec := httptest.NewRecorder()
					h.ServeHTTP(rec, req)
					if rec.Code != http.StatusOK || !bytes.Contains(rec.Body.Bytes(), []byte(`"allowed":true`)) {
						b.Fatalf("response %d %q, want allowed", rec.Code, rec.Body)
					}
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
