// Command readyafter is the work of the helm-operator example's Deployment on the real node
// (examples/helm-operator/chart, a version "<n>-ready<seconds>"): its /readyz answers 503 until
// --ready-after has passed since it started, then 200, so that a Helm upgrade or rollback that
// waits for the Deployment takes that long. It exits at once on SIGTERM.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	after := flag.Duration("ready-after", 0, "How long after the start /readyz fails.")
	addr := flag.String("addr", ":8080", "The address /readyz is served on.")
	flag.Parse()
	ready := time.Now().Add(*after)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()

	mux := http.NewServeMux()
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if time.Now().Before(ready) {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		_, _ = fmt.Fprintln(w, "ok")
	})
	srv := &http.Server{Addr: *addr, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	fmt.Println("ready after", *after)
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
