package reconcilers_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/reconcilers"
)

// A wrapped reconcile's request and result travel in a handler of its own: whatever ran
// before on any worker, each reconcile gets its
// own request and returns its own result, including after a panic, after a reconcile that
// returned context.Canceled itself, and after a refused one.
func TestEachReconcileGetsItsOwnRequestAndResult(t *testing.T) {
	ex := drain.New(drain.Options{})
	drained(t, ex)
	after := func(name string) time.Duration {
		n, _ := strconv.Atoi(name)
		return time.Duration(n+1) * time.Millisecond
	}
	r := reconcilers.Wrap(ex, "cm", reconcile.Func(func(_ context.Context, req reconcile.Request) (reconcile.Result, error) {
		switch req.Name {
		case "panics":
			panic("boom")
		case "cancelled":
			return reconcile.Result{}, context.Canceled
		}
		return reconcile.Result{RequeueAfter: after(req.Name)}, nil
	}), reconcilers.WrapOptions{})
	check := func(name string) error {
		res, err := r.Reconcile(context.Background(), request("ns", name))
		if err != nil || res.RequeueAfter != after(name) {
			return errors.New("reconcile of " + name + " = " + res.RequeueAfter.String() + ", " + errString(err))
		}
		return nil
	}

	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		wg.Go(func() {
			for i := range 200 {
				if err := check(strconv.Itoa(w*1000 + i)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	func() {
		defer func() { _ = recover() }()
		_, _ = r.Reconcile(context.Background(), request("ns", "panics"))
	}()
	if err := check("1"); err != nil {
		t.Errorf("after a panic: %v", err)
	}
	// A reconcile that ran and returned context.Canceled reports it: it is not taken
	// for one cancelled before it ran, which would be requeued quietly.
	if res, err := r.Reconcile(context.Background(), request("ns", "cancelled")); !errors.Is(err, context.Canceled) || !res.IsZero() {
		t.Errorf("reconcile returning context.Canceled = %+v, %v; want its own result and error", res, err)
	}
	if err := check("2"); err != nil {
		t.Errorf("after a reconcile returning context.Canceled: %v", err)
	}
	if err := ex.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	if res, err := r.Reconcile(context.Background(), request("ns", "3")); err != nil || res.RequeueAfter != reconcilers.DefaultRequeueAfter {
		t.Errorf("refused reconcile = %+v, %v; want requeued after the default", res, err)
	}
}

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}
