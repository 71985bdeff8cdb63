package reconcilers_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/go-logr/logr/funcr"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/internal"
	"github.com/quiesce-dev/quiesce/reconcilers"
)

// Two controllers on one executor: the idempotent one (CancelAtStop) has its reconcile's
// context cancelled as the drain begins, with a cause naming the policy, and is requeued
// quietly; the other (the default, FinishAtStop) keeps its context until CancelAfter. The
// drain names the calls it cancels, each time.
func TestStopPolicies(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var lines []string
		ex := drain.New(drain.Options{
			CancelAfter: 10 * time.Second,
			Logger: funcr.NewJSON(func(obj string) {
				mu.Lock()
				defer mu.Unlock()
				lines = append(lines, obj)
			}, funcr.Options{}),
		})
		internal.Of(ex).Settings().Owned = true
		type ended struct {
			after time.Duration
			cause error
		}
		begin := time.Now()
		wrap := func(name string, stop reconcilers.StopPolicy, ends chan<- ended) reconcile.Reconciler {
			return reconcilers.Wrap(ex, name, reconcile.Func(func(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
				<-ctx.Done()
				ends <- ended{time.Since(begin), context.Cause(ctx)}
				return reconcile.Result{}, fmt.Errorf("failed to apply: %w", ctx.Err())
			}), reconcilers.WrapOptions{Stop: stop})
		}
		idemEnds, otherEnds := make(chan ended, 1), make(chan ended, 1)
		idem := wrap("idempotent", reconcilers.CancelAtStop, idemEnds)
		other := wrap("other", reconcilers.FinishAtStop, otherEnds)
		type result struct {
			res reconcile.Result
			err error
		}
		idemRes, otherRes := make(chan result, 1), make(chan result, 1)
		go func() {
			res, err := idem.Reconcile(context.Background(), request("ns", "a"))
			idemRes <- result{res, err}
		}()
		go func() {
			res, err := other.Reconcile(context.Background(), request("ns", "b"))
			otherRes <- result{res, err}
		}()
		synctest.Wait()
		time.Sleep(2 * time.Second) // the drain begins at 2s
		if err := ex.Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
		if e := <-idemEnds; e.after != 2*time.Second || !errors.Is(e.cause, internal.ErrCancelAtStop) ||
			!strings.Contains(e.cause.Error(), "CancelAtStop") {
			t.Errorf("the CancelAtStop reconcile's context ended after %v with %v; want at the drain's start, 2s, naming the policy", e.after, e.cause)
		}
		if e := <-otherEnds; e.after != 12*time.Second {
			t.Errorf("the FinishAtStop reconcile's context ended after %v (%v); want at CancelAfter, 12s", e.after, e.cause)
		}
		if r := <-idemRes; r.err != nil || r.res.RequeueAfter != reconcilers.DefaultRequeueAfter {
			t.Errorf("the cut CancelAtStop reconcile = %+v, %v; want a quiet requeue", r.res, r.err)
		}
		if r := <-otherRes; !errors.Is(r.err, context.Canceled) {
			t.Errorf("the FinishAtStop reconcile = %+v, %v; want its own error, context.Canceled", r.res, r.err)
		}
		var cancelling []string
		mu.Lock()
		defer mu.Unlock()
		for _, l := range lines {
			if strings.Contains(l, `"msg":"Cancelling calls still running"`) {
				cancelling = append(cancelling, l)
			}
		}
		if len(cancelling) != 2 || !strings.Contains(cancelling[0], `"name":"idempotent/ns/a"`) ||
			!strings.Contains(cancelling[1], `"name":"other/ns/b"`) || strings.Contains(cancelling[1], "idempotent") {
			t.Errorf("cancel lines %q; want idempotent/ns/a at the start, then other/ns/b alone", cancelling)
		}
		if s := ex.Stats(); s.Cancelled != 2 {
			t.Errorf("Stats.Cancelled = %d, want 2", s.Cancelled)
		}
	})
}

func TestUnknownStopPolicyPanicsAtSetup(t *testing.T) {
	defer func() {
		if v := recover(); v == nil || !strings.Contains(fmt.Sprint(v), "WrapOptions.Stop") {
			t.Errorf("recovered %v, want a panic naming WrapOptions.Stop", v)
		}
	}()
	reconcilers.Wrap(drain.New(drain.Options{}), "cm", reconcile.Func(func(context.Context, reconcile.Request) (reconcile.Result, error) {
		return reconcile.Result{}, nil
	}), reconcilers.WrapOptions{Stop: 7})
}
