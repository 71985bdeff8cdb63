// Command neverready stands for an operator that never becomes ready: it takes the harness's
// flags, answers 503 on /readyz, and runs until a signal ends it.
package main

import (
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	probe := flag.String("health-probe-bind-address", "", "")
	flag.String("metrics-bind-address", "", "")
	flag.Bool("metrics-secure", true, "")
	flag.String("quiesce-debug-address", "", "") // runnable.Options.BindFlags binds it
	flag.Parse()
	go func() {
		// Never ready.
		h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) })
		_ = http.ListenAndServe(*probe, h)
	}()
	fmt.Printf("neverready: pid %d waits for a cache that never syncs\n", os.Getpid())
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGTERM, os.Interrupt)
	<-c
}
