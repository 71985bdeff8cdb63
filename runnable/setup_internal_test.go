package runnable

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// noServer is the host of an API server nothing listens on.
const noServer = "http://127.0.0.1:1"

// restartableServer is a webhook.Server that any number of Starts may run, one after another.
type restartableServer struct {
	mux     *http.ServeMux
	started chan struct{}
}

func (s *restartableServer) NeedLeaderElection() bool             { return false }
func (s *restartableServer) Register(path string, h http.Handler) { s.mux.Handle(path, h) }
func (s *restartableServer) StartedChecker() healthz.Checker      { return healthz.Ping }
func (s *restartableServer) WebhookMux() *http.ServeMux           { return s.mux }
func (s *restartableServer) Start(ctx context.Context) error {
	s.started <- struct{}{}
	<-ctx.Done()
	return nil
}

// One mgrOpts given to Setup, then to ctrl.NewManager for two managers (an envtest suite
// making a manager per spec): the second manager does not start, and says why; before, it
// served its webhooks through the first manager's wrapper, tracked by a Runnable that
// drained already (issue 42). Fails on the code before: the second mgr.Start returns nil.
func TestOneSetupServesOneManager(t *testing.T) {
	cfg := &rest.Config{Host: noServer}
	inner := &restartableServer{mux: http.NewServeMux(), started: make(chan struct{}, 2)}
	mo := manager.Options{WebhookServer: inner, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0"}
	q, err := Setup(cfg, &mo, Options{})
	if err != nil {
		t.Fatal(err)
	}
	start := func(add bool) error {
		t.Helper()
		mgr, err := ctrl.NewManager(cfg, mo)
		if err != nil {
			t.Fatal(err)
		}
		if add {
			if err := q.Add(mgr); err != nil {
				t.Fatal(err)
			}
		}
		mgr.GetWebhookServer() // as a webhook builder does: the manager serves it
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- mgr.Start(q.StopContext(ctx)) }()
		select {
		case <-inner.started:
			cancel()
		case err := <-done:
			return err
		}
		return <-done
	}
	if err := start(true); err != nil {
		t.Fatalf("the first manager: %v", err)
	}
	if err := start(false); err == nil || !strings.Contains(err.Error(), "call runnable.Setup on each manager's own Options") {
		t.Fatalf("the second manager's Start = %v, want an error naming the fix", err)
	}
}

// With LeaderElectionConfig (the lease in another cluster), the elector's Events are
// recorded in that cluster, as controller-runtime records them; they were dropped before
// (issue 42). Fails on the code before: no Event reaches the lease's cluster.
func TestLeaseEventsInTheLeaseCluster(t *testing.T) {
	events := make(chan corev1.Event, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch {
		case req.Method == http.MethodGet && req.URL.Path == "/apis/coordination.k8s.io/v1/namespaces/ns/leases/x":
			_, _ = io.WriteString(w, `{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","metadata":{"name":"x","namespace":"ns"}}`)
		case req.Method == http.MethodPost && req.URL.Path == "/api/v1/namespaces/ns/events":
			body, _ := io.ReadAll(req.Body)
			var ev corev1.Event
			_ = json.Unmarshal(body, &ev)
			select {
			case events <- ev:
			default:
			}
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write(body)
		default:
			http.NotFound(w, req)
		}
	}))
	defer srv.Close()
	mo := manager.Options{LeaderElection: true, LeaderElectionID: "x", LeaderElectionNamespace: "ns",
		LeaderElectionConfig: &rest.Config{Host: srv.URL}}
	q, err := Setup(&rest.Config{Host: noServer}, &mo, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Add(stubManager{}); err != nil {
		t.Fatal(err)
	}
	lock := mo.LeaderElectionResourceLockInterface.(*leaseObserver)
	defer func() { lock.events.caster.Shutdown() }()
	if _, _, err := lock.Get(context.Background()); err != nil {
		t.Fatal(err)
	}
	lock.RecordEvent("became leader")
	select {
	case ev := <-events:
		if ev.Reason != "LeaderElection" || !strings.HasSuffix(ev.Message, " became leader") ||
			ev.InvolvedObject.Kind != "Lease" || ev.InvolvedObject.Name != "x" {
			t.Errorf("Event = %+v, want the elector's on Lease ns/x", ev)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no Event reached the lease's cluster")
	}
}

// TestListenDebugRefusesNonLoopback: the debug listener is refused unless its own address is
// loopback, whatever the host in DebugAddress resolved to (localhost may resolve elsewhere);
// before, attach listened wherever the name led and logged "on loopback".
func TestListenDebugRefusesNonLoopback(t *testing.T) {
	ln, err := listenDebug(Options{DebugAddress: "0.0.0.0:0"})
	if err == nil {
		_ = ln.Close()
		t.Fatalf("listenDebug(0.0.0.0:0) listens on %s, want it refused", ln.Addr())
	}
	if want := `"0.0.0.0:0" listens on `; !strings.Contains(err.Error(), want) ||
		!strings.Contains(err.Error(), "not loopback") {
		t.Fatalf("listenDebug(0.0.0.0:0) = %v, want an error with %q and not loopback", err, want)
	}
	ln, err = listenDebug(Options{DebugAddress: "127.0.0.1:0"})
	if err != nil {
		t.Fatalf("listenDebug(127.0.0.1:0) = %v, want a listener", err)
	}
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
}
