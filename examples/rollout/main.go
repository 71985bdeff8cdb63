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

// The messages of quiesce's timeline lines (key sinceStop).
const (
	stepStopBegan      = "Stop began"
	stepDelayOver      = "Shutdown delay over"
	stepDraining       = "Draining executor"
	stepReport         = "Waiting for pending calls"
	stepReturned       = "All calls returned"
	stepWebhookStopped = "Webhook server stopped"
)

// timelineSteps are the timeline of the old leader, in order: the webhooks stop last, after
// the drain, as controller-runtime orders them.
var timelineSteps = []string{stepStopBegan, stepDelayOver, stepDraining, stepReturned, stepWebhookStopped}

// The runs' modes.
const (
	modeQuiesce = "quiesce"
	modePlain   = "plain"
)

func modeOf(quiesce bool) string {
	if quiesce {
		return modeQuiesce
	}
	return modePlain
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
	flag.IntVar(&cfg.SingleObjects, "single-objects", 10,
		"The single-replica case: how many ConfigMaps its reconciles work on at SIGTERM.")
	flag.DurationVar(&cfg.SingleWork, "single-work", time.Second, "The single-replica case: how long a reconcile works.")
	single := flag.Bool("single", true,
		"Also play the single-replica case: one replica, no shutdown delay, its webhook validating its own writes.")
	flag.StringVar(&cfg.Operator, "operator", "",
		"An operator binary to run instead of building examples/rollout/operator.")
	flag.BoolVar(&cfg.ShowLogs, "logs", false, "Show the replicas' logs (JSON).")
	flag.Parse()
	cfg.SkipSingle = !*single
	cfg.Out = os.Stdout
	ctrllog.SetLogger(logr.Discard()) // envtest's; its failures come back as errors

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := run(ctx, cfg)
	if cerr := shutdowntest.Cleanup(); cerr != nil {
		fmt.Printf("==> %v\n", cerr)
	}
	if err != nil {
		fmt.Printf("==> FAILED: %v\n", err)
		os.Exit(2)
	}
	runs := rep.Rollouts
	fmt.Printf("==> the rollouts side by side:\n%s", table(runs))
	for _, r := range runs {
		if len(r.Errors) > 0 {
			fmt.Printf("==> %s run: failed creates said: %q\n", r.Mode, r.Errors)
		}
	}
	if len(rep.Single) > 0 {
		fmt.Printf("==> one replica, no shutdown delay, its webhook validating its own writes, side by side:\n%s",
			singleTable(rep.Single))
	}
	failed := false
	if err := runs[0].check(); err != nil {
		fmt.Printf("==> FAILED: the quiesce run: %v\n", err)
		failed = true
	} else {
		fmt.Println("==> OK: with quiesce, no create failed, every object was reconciled, the leaders never " +
			"overlapped, the timeline is in order and the old leader exited 0")
	}
	if len(rep.Single) > 0 {
		if err := rep.Single[0].check(); err != nil {
			fmt.Printf("==> FAILED: the quiesce single-replica run: %v\n", err)
			failed = true
		} else {
			fmt.Println("==> OK: with quiesce and one replica, every reconcile in flight at SIGTERM finished, " +
				"its write admitted by the replica's own webhook during the drain, the timeline is in order " +
				"and the replica exited 0")
		}
	}
	if failed {
		os.Exit(1)
	}
}
