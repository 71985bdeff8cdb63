package draintest_test

import (
	"context"
	"fmt"
	"time"

	"github.com/onsi/gomega"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/drain/draintest"
)

// printT prints what a *testing.T would report.
type printT struct{}

func (printT) Helper()                           {}
func (printT) Errorf(format string, args ...any) { fmt.Printf(format+"\n", args...) }

func ExampleVerifyNone() {
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	ex := drain.New(drain.Options{Clock: clk})

	// A handler that ignores its context, started by the code under test.
	release := make(chan struct{})
	started := make(chan struct{})
	if err := ex.Go(context.Background(), "demo/default/a/export", func(context.Context) error {
		close(started)
		<-release // the handler blocks here
		return nil
	}); err != nil {
		fmt.Println(err)
		return
	}
	<-started
	clk.Step(3 * time.Second)

	// The test stops its manager: the runnable drains the executor and gives up on the
	// handler at the end of its grace period.
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	_ = ex.Drain(ctx) // a *drain.PendingError: the handler still runs

	// In a test: draintest.VerifyNone(t, ex).
	draintest.VerifyNone(printT{}, ex)

	close(release)
	if err := ex.Drain(context.Background()); err != nil {
		fmt.Println(err)
	}
	draintest.VerifyNone(printT{}, ex) // passes: prints nothing
	// Output:
	// 1 tracked call still pending:
	// 	"demo/default/a/export": age 3s, detached, at draintest_test.ExampleVerifyNone.func1 (example_test.go:30)
}

func ExampleHaveNoPendingCalls() {
	ex := drain.New(drain.Options{})
	release := make(chan struct{})
	if err := ex.Go(context.Background(), "demo/default/a/export", func(context.Context) error {
		<-release
		return nil
	}); err != nil {
		fmt.Println(err)
		return
	}

	// In a Ginkgo spec or with gomega.NewWithT(t):
	//	Eventually(q).Should(draintest.HaveNoPendingCalls())
	// where q is the *runnable.Runnable, or its executor.
	g := gomega.NewGomega(func(message string, _ ...int) { fmt.Println(message) })
	go close(release) // the call returns soon
	g.Eventually(ex).Should(draintest.HaveNoPendingCalls())
	fmt.Println("no call pending")

	if err := ex.Drain(context.Background()); err != nil {
		fmt.Println(err)
	}
	// Output:
	// no call pending
}
