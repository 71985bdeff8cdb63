// Command stubborn stands for an operator that never exits on SIGTERM: it takes the harness's
// flags, answers 200 on /readyz, and ignores SIGTERM and SIGINT (it logs each); only SIGKILL ends it.
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
	flag.Bool("quiesce-debug-without-filter", false, "") // runnable.Options.BindFlags binds it
	flag.Parse()
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGTERM, os.Interrupt)
	fmt.Printf("stubborn: pid %d ignores SIGTERM\n", os.Getpid())
	go func() {
		h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
		_ = http.ListenAndServe(*probe, h)
	}()
	for sig := range c {
		fmt.Printf("stubborn: ignored %s\n", sig)
	}
}
