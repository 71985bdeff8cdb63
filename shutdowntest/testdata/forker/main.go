// Command forker stands for an operator that starts a process of its own and writes a very
// long line: it takes the harness's flags, answers 200 on /readyz, starts `sleep` (which it
// never stops), writes one line of --long-line bytes when that is > 0, then "forker: ready",
// and exits 0 on SIGTERM, leaving its child running: only the harness can end it. It logs with
// log/slog's text handler, one of the formats the harness reads.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
)

func main() {
	probe := flag.String("health-probe-bind-address", "", "")
	flag.String("metrics-bind-address", "", "")
	flag.Bool("metrics-secure", true, "")
	flag.String("quiesce-debug-address", "", "") // runnable.Options.BindFlags binds it
	long := flag.Int("long-line", 0, "bytes of the long line")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stdout, nil))
	child := exec.Command("sleep", "3600")
	if err := child.Start(); err != nil {
		log.Error("forker: failed to start its child", "err", err)
		os.Exit(1)
	}
	log.Info(fmt.Sprintf("forker: pid %d child %d", os.Getpid(), child.Process.Pid))
	if *long > 0 {
		w := bufio.NewWriter(os.Stdout)
		_, _ = w.WriteString(strings.Repeat("x", *long) + "\n")
		_ = w.Flush()
	}
	log.Info("forker: ready")
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGTERM)
	go func() {
		h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
		_ = http.ListenAndServe(*probe, h)
	}()
	<-c
	log.Info("forker: exits, its child still running")
}
