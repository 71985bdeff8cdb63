package drain_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"strings"
	"time"

	"github.com/quiesce-dev/quiesce/drain"
)

func ExampleExecutor_Call() {
	ex := drain.New(drain.Options{})
	// With no deadline, Drain waits for every call and returns nil.
	defer func() { _ = ex.Drain(context.Background()) }()

	err := ex.Call(context.Background(), "greet", func(context.Context) error {
		fmt.Println("hello from a tracked goroutine")
		return nil
	})
	fmt.Println("err:", err)
	// Output:
	// hello from a tracked goroutine
	// err: <nil>
}

func ExampleExecutor_Drain() {
	ex := drain.New(drain.Options{CancelAfter: -1})

	release := make(chan struct{})
	started := make(chan struct{})
	err := ex.Go(context.Background(), "slow-handler", func(context.Context) error {
		close(started)
		<-release
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	<-started

	// A drain that runs out of time names what it still waits for.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	err = ex.Drain(ctx)
	var pe *drain.PendingError
	if errors.As(err, &pe) {
		fmt.Println("still pending:", pe.Pending[0].Name, errors.Is(err, context.DeadlineExceeded))
	}

	// New calls are refused while it drains.
	err = ex.Call(context.Background(), "late", func(context.Context) error { return nil })
	fmt.Println("refused:", errors.Is(err, drain.ErrDraining))

	// Once the call returns, Drain returns nil at once.
	close(release)
	fmt.Println("drained:", ex.Drain(context.Background()))
	// Output:
	// still pending: slow-handler true
	// refused: true
	// drained: <nil>
}

func ExampleExecutor_Run() {
	ex := drain.New(drain.Options{})
	// With no deadline, Drain waits for every call and returns nil.
	defer func() { _ = ex.Drain(context.Background()) }()

	// fn runs on this goroutine, tracked like a Call: Drain waits for it and reports it.
	err := ex.Run(context.Background(), "reconcile", func(ctx context.Context) error {
		_, name, _ := drain.FromContext(ctx)
		fmt.Println("running", name)
		return nil
	})
	fmt.Println("err:", err)
	// Output:
	// running reconcile
	// err: <nil>
}

func ExampleExecutor_Locate() {
	ex := drain.New(drain.Options{})
	defer func() { _ = ex.Drain(context.Background()) }()

	release := make(chan struct{})
	waiting := make(chan struct{})
	if err := ex.Go(context.Background(), "export", func(context.Context) error {
		close(waiting)
		<-release // a call that waits, and ignores its context
		return nil
	}); err != nil {
		log.Fatal(err)
	}
	<-waiting
	calls, _ := ex.Locate(-1)
	close(release)
	// Where is "<function> (<file>:<line>)", the line where the goroutine was at the
	// moment of the capture: here, on its way to, or blocked on, release.
	function, _, _ := strings.Cut(calls[0].Where, " (")
	fmt.Println(calls[0].Name, "waits in", function)
	// Output:
	// export waits in drain_test.ExampleExecutor_Locate.func2
}

// New makes an executor; Options' zero values are the documented defaults.
func ExampleNew() {
	ex := drain.New(drain.Options{
		MaxConcurrent: 2,                // at most two calls run at once
		CancelAfter:   20 * time.Second, // a drain lets calls run 20s before cancelling them
	})
	err := ex.Run(context.Background(), "job", func(ctx context.Context) error {
		_, name, ok := drain.FromContext(ctx)
		fmt.Println("tracked:", ok, name)
		return nil
	})
	fmt.Println("err:", err, "drained:", ex.Drain(context.Background()))
	// Output:
	// tracked: true job
	// err: <nil> drained: <nil>
}
