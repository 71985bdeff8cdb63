package runnable

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/quiesce-dev/quiesce/drain"
)

// stallingClient sends the head of a POST of an AdmissionReview to path on srv and part
// of its body, then stalls; response reads the server's answer.
func stallingClient(t *testing.T, srv *httptest.Server, path string) (response func() (*http.Response, error)) {
	t.Helper()
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	body := `{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{"uid":"u","namespace":"ns","name":"chosen"}}`
	if _, err := fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: webhook\r\nContent-Type: application/json\r\n"+
		"Content-Length: %d\r\n\r\n%s", path, len(body), body[:20]); err != nil {
		t.Fatal(err)
	}
	return func() (*http.Response, error) { return http.ReadResponse(bufio.NewReader(conn), nil) }
}

// A client that sends the head and stalls its body ends with the drain, named as a stalled
// request after the path, whether the drain found its request in flight or it came after;
// a whole body still arriving then gets minBodyWait.
func TestStalledBodyEndsWithTheDrain(t *testing.T) {
	defer func(d time.Duration) { minBodyWait = d }(minBodyWait)
	minBodyWait = 0 // with CancelAtOnce, the bodies still arriving stop being read as the drain begins
	logs := &lines{}
	r := newRunnable(withDefaults(Options{Logger: logs.logger(), CancelAfter: drain.CancelAtOnce}), false)
	ws := wrapServer(r, newFakeServer())
	reading := make(chan struct{}, 2)
	ws.Register("/v", &admission.Webhook{Handler: &callNames{}, WithContextFunc: func(ctx context.Context, _ *http.Request) context.Context {
		reading <- struct{}{} // the Webhook reads the body next
		return ctx
	}})
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error)
	go func() { served <- ws.Start(ctx) }()
	srv := httptest.NewServer(ws.WebhookMux())
	defer srv.Close()
	defer func() {
		stop()
		if err := <-served; err != nil {
			t.Error(err)
		}
	}()

	inFlight := stallingClient(t, srv, "/v")
	select {
	case <-reading:
	case <-time.After(time.Minute): // far above what it takes
		t.Fatal("the Webhook never began: the request's body is read before it")
	}
	if p := r.ex.Pending(); len(p) != 1 || p[0].Name != "webhook/v" {
		t.Fatalf("Pending = %+v, want the stalled request as webhook/v, not named after a body not read", p)
	}
	dctx, cancel := context.WithTimeout(context.Background(), time.Minute) // far above what it takes: at once
	defer cancel()
	if err := r.ex.Drain(dctx); err != nil {
		t.Fatalf("Drain = %v, want the stalled request ended as it began", err)
	}
	resp, err := inFlight()
	if err != nil || resp.StatusCode != http.StatusOK { // the Webhook's error, in the review
		t.Fatalf("the stalled client got %v, %v; want the Webhook's answer", resp, err)
	}
	_ = resp.Body.Close()

	later := stallingClient(t, srv, "/v") // served untracked, the drain begun
	<-reading
	if resp, err = later(); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("a stalled client after the drain began got %v, %v; want the Webhook's answer", resp, err)
	}
	_ = resp.Body.Close()
	n := 0
	logs.mu.Lock()
	defer logs.mu.Unlock()
	for _, l := range logs.all {
		if strings.Contains(l, `"msg"="Webhook request body stalled"`) && strings.Contains(l, `"name"="webhook/v"`) &&
			strings.Contains(l, `"received"=20`) && !strings.Contains(l, "chosen") {
			n++
		}
	}
	if n != 2 {
		t.Errorf("%d lines name a stalled request, want 2; log %q", n, logs.all)
	}
}
