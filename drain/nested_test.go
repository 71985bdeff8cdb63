package drain_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/quiesce-dev/quiesce/drain"
)

// A call nested in a call admitted before the drain (Call, Go and Run with its fn's
// context, or one derived from it) is admitted while the executor drains: in-flight work
// finishes. The drain waits for it too.
func TestDrainAdmitsCallsNestedInCallsInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ex := drain.New(drain.Options{CancelAfter: -1})
		inside := make(chan context.Context)
		release := make(chan struct{})
		outer := make(chan error, 1)
		go func() {
			outer <- ex.Run(context.Background(), "reconcile", func(ctx context.Context) error {
				inside <- ctx
				<-release
				// After the drain began: each of them runs.
				ran := 0
				count := func(context.Context) error { ran++; return nil }
				if err := errors.Join(
					ex.Call(ctx, "call", count),
					ex.Run(ctx, "run", count),
					ex.Call(context.WithoutCancel(ctx), "derived", count),
				); err != nil {
					return err
				}
				goDone := make(chan struct{})
				if err := ex.Go(ctx, "go", func(context.Context) error { <-release; close(goDone); return nil }); err != nil {
					return err
				}
				if ran != 3 {
					return errors.New("a nested call did not run")
				}
				return nil
			})
		}()
		<-inside
		drained := make(chan error, 1)
		go func() { drained <- ex.Drain(context.Background()) }()
		<-ex.Draining()

		// New work is refused meanwhile.
		if err := ex.Call(context.Background(), "new", func(context.Context) error { return nil }); !errors.Is(err, drain.ErrDraining) {
			t.Fatalf("a new call while draining = %v, want ErrDraining", err)
		}
		release <- struct{}{}
		if err := <-outer; err != nil {
			t.Fatalf("the reconcile = %v, want its nested calls admitted and run", err)
		}
		synctest.Wait()
		select {
		case err := <-drained:
			t.Fatalf("Drain returned %v while the nested Go still ran", err)
		default:
		}
		close(release)
		if err := <-drained; err != nil {
			t.Fatal(err)
		}
		if s := ex.Stats(); s.Started != 5 || s.Finished != 5 || s.Refused != 1 {
			t.Fatalf("Stats = %+v, want 5 started and finished (the reconcile and 4 nested), 1 refused", s)
		}
	})
}

// A call whose outer call already returned (a goroutine outliving its reconcile) is new
// work: refused once the executor drains, with ErrDraining, whether it kept the outer
// call's context (ended when the call returned) or one made with context.WithoutCancel.
func TestDrainRefusesCallsOfAnOuterCallThatReturned(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ex := drain.New(drain.Options{})
		var kept, ended context.Context
		blocked := make(chan struct{})
		if err := ex.Go(context.Background(), "other", func(context.Context) error { <-blocked; return nil }); err != nil {
			t.Fatal(err)
		}
		if err := ex.Run(context.Background(), "reconcile", func(ctx context.Context) error {
			kept, ended = context.WithoutCancel(ctx), ctx
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		drained := make(chan error, 1)
		go func() { drained <- ex.Drain(context.Background()) }()
		<-ex.Draining()
		ran := false
		fn := func(context.Context) error { ran = true; return nil }
		for _, err := range []error{
			ex.Call(kept, "late", fn), ex.Go(kept, "late", fn), ex.Run(kept, "late", fn),
			ex.Call(ended, "late", fn), ex.Go(ended, "late", fn), ex.Run(ended, "late", fn),
		} {
			if !errors.Is(err, drain.ErrDraining) {
				t.Errorf("a call of a returned reconcile while draining = %v, want ErrDraining", err)
			}
		}
		if ran {
			t.Error("a refused call ran")
		}
		close(blocked)
		if err := <-drained; err != nil {
			t.Fatal(err)
		}
	})
}

// A nested call admitted after the drain cancelled the calls (CancelAfter) starts with its
// context ended by the drain, even when its caller's context ignores the outer call's
// cancellation; the drain still waits for it and reports it.
func TestNestedCallAdmittedAfterCancelAfterStartsCancelled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ex := drain.New(drain.Options{CancelAfter: time.Second})
		inside := make(chan context.Context)
		outerDone := make(chan error, 1)
		finish := make(chan struct{})
		go func() {
			outerDone <- ex.Run(context.Background(), "reconcile", func(ctx context.Context) error {
				inside <- ctx
				<-finish // cleaning up after the drain cancelled it
				return nil
			})
		}()
		ctx := <-inside
		first := make(chan error, 1)
		dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		go func() { first <- ex.Drain(dctx) }()
		<-ex.Draining()
		time.Sleep(time.Second) // fake time: CancelAfter fires
		synctest.Wait()
		if ctx.Err() == nil {
			t.Fatal("the reconcile's context is live after CancelAfter")
		}

		started := make(chan error, 1)
		release := make(chan struct{})
		err := ex.Go(context.WithoutCancel(ctx), "late", func(ctx context.Context) error {
			started <- context.Cause(ctx)
			<-release
			return nil
		})
		if err != nil {
			t.Fatalf("a nested Go of a reconcile in flight = %v, want it admitted", err)
		}
		if cause := <-started; cause == nil || cause.Error() != "cancelled by the drain" {
			t.Fatalf("the nested call's context cause = %v, want it cancelled by the drain", cause)
		}
		close(finish)
		if err := <-outerDone; err != nil {
			t.Fatal(err)
		}
		var pe *drain.PendingError
		if err := <-first; !errors.As(err, &pe) || len(pe.Pending) != 1 || pe.Pending[0].Name != "late" {
			t.Fatalf("Drain = %v, want a PendingError naming the nested call", err)
		}
		close(release)
		if err := ex.Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}
