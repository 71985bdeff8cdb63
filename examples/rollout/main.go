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
)

// timelineSteps are the messages of quiesce's timeline lines (key sinceStop) on the old
// leader, in order: the webhooks stop last, after the drain, as controller-runtime orders them.
var timelineSteps = []string{
	"Stop began", "Shutdown delay over", "Draining executor", "All calls returned", "Webhook server stopped",
}

func main() {
	var cfg config
	flag.DurationVar(&cfg.Grace, "grace-period", 5*time.Second, "The operators' grace period.")
	flag.DurationVar(&cfg.Delay, "shutdown-delay", 2*time.Second, "The quiesce run's shutdown delay.")
	flag.DurationVar(&cfg.Work, "work", 200*time.Millisecond, "How long a reconcile works.")
	flag.DurationVar(&cfg.Interval, "interval", 25*time.Millisecond, "The interval between two creates.")
	flag.IntVar(&cfg.Burst, "burst", 1, "How many ConfigMaps to create at once, every --interval.")
	flag.DurationVar(&cfg.WebhookWork, "webhook-work", 20*time.Millisecond, "How long the webhook takes to validate.")
	flag.BoolVar(&cfg.HTTP2, "webhook-http2", false,
		"Let the webhook servers speak HTTP/2 (controller-runtime's default; kubebuilder scaffolds turn it off).")
	flag.IntVar(&cfg.Before, "before", 20, "How many reconciles the first leader finishes before its SIGTERM.")
	flag.DurationVar(&cfg.After, "after", time.Second,
		"How long the client keeps creating once the new leader reconciles.")
	flag.StringVar(&cfg.Operator, "operator", "",
		"An operator binary to run instead of building examples/rollout/operator.")
	flag.BoolVar(&cfg.ShowLogs, "logs", false, "Show the replicas' logs (JSON).")
	flag.Parse()
	cfg.Out = os.Stdout
	ctrllog.SetLogger(logr.Discard()) // envtest's; its failures come back as errors

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	runs, err := run(ctx, cfg)
	if err != nil {
		fmt.Printf("==> FAILED: %v\n", err)
		os.Exit(2)
	}
	fmt.Printf("==> the rollouts side by side:\n%s", table(runs))
	for _, r := range runs {
		if len(r.Errors) > 0 {
			fmt.Printf("==> %s run: failed creates said: %q\n", r.Mode, r.Errors)
		}
	}
	if err := runs[0].check(); err != nil {
		fmt.Printf("==> FAILED: the quiesce run: %v\n", err)
		os.Exit(1)
	}
	fmt.Println("==> OK: with quiesce, no create failed, every object was reconciled, the leaders never " +
		"overlapped, the timeline is in order and the old leader exited 0")
}
