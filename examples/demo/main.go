package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/quiesce-dev/quiesce/shutdowntest"
)

func main() {
	var cfg config
	flag.DurationVar(&cfg.GracePeriod, "grace-period", 6*time.Second,
		"The operator's grace period: how long after SIGTERM it waits for pending calls.")
	flag.IntVar(&cfg.Objects, "objects", 3, "How many ConfigMaps to create.")
	flag.IntVar(&cfg.Hanging, "hanging", 1, "How many of them get a handler that hangs (ignores its context).")
	flag.DurationVar(&cfg.Work, "work", 0,
		"How long the finishing handler works (default: a third of the grace period).")
	flag.DurationVar(&cfg.CancelAfter, "cancel-after", 0,
		"When after SIGTERM the operator cancels the calls' contexts (default: between --work and --grace-period).")
	flag.DurationVar(&cfg.ReportEvery, "report-every", 0,
		"The interval between the operator's reports (default: a third of the grace period).")
	flag.DurationVar(&cfg.SecondSignal, "second-sigterm-after", 0,
		"If > 0, send a second SIGTERM this long after the first: the operator exits at once.")
	flag.StringVar(&cfg.Operator, "operator", "",
		"A demo-operator binary to run instead of building examples/demo-operator.")
	flag.Parse()
	cfg.Out = os.Stdout
	// envtest logs through controller-runtime; its failures come back as errors anyway.
	ctrllog.SetLogger(logr.Discard())

	// Interrupted, the demo kills the operator and stops the control plane before it exits.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	res, err := run(ctx, cfg)
	if cleanupErr := shutdowntest.Cleanup(); cleanupErr != nil { // the binary run built
		fmt.Printf("==> %v\n", cleanupErr)
	}
	if err != nil {
		fmt.Printf("==> FAILED: %v\n", err)
		if ctx.Err() != nil {
			os.Exit(130) // interrupted
		}
		os.Exit(2)
	}
	if err := res.check(); err != nil {
		fmt.Printf("==> FAILED: %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("==> OK: %s\n", res.summary())
}
