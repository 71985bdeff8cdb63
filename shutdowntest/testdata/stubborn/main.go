// Command stubborn stands for an operator that never exits on SIGTERM: it takes the harness's
// flags, answers 200 on /readyz, and ignores SIGTERM and SIGINT (it logs each, with log/slog's
// text handler); only SIGKILL ends it.
package main

import (
	"flag"
	"fmt"
	"log/slog"
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
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGTERM, os.Interrupt)
	log := slog.New(slog.NewTextHandler(os.Stdout, nil))
	log.Info(fmt.Sprintf("stubborn: pid %d ignores SIGTERM", os.Getpid()))
	go func() {
		h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
		_ = http.ListenAndServe(*probe, h)
	}()
	for sig := range c {
		log.Info("stubborn: ignored " + sig.String())
	}
}
