package reconcilers_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/quiesce-dev/quiesce/reconcilers"
	"github.com/quiesce-dev/quiesce/runnable"
)

// BenchmarkStopPolicy measures, on the real clock, what each stop policy costs a stop:
// 4 reconciles in flight, each 2s of work in 20ms steps that honour their context (an
// idempotent apply), and a runnable.Runnable (GracePeriod 10s) stopped 200ms after they
// began. stop-ms is from the stop to Start's return (then controller-runtime stops the
// leader-election group and releases the lease); cut is the reconciles that did not finish,
// work-lost-ms the work they had done (redone by the next leader). docs/stop-policy.md.
func BenchmarkStopPolicy(b *testing.B) {
	for _, p := range []struct {
		name string
		stop reconcilers.StopPolicy
	}{{"FinishAtStop", reconcilers.FinishAtStop}, {"CancelAtStop", reconcilers.CancelAtStop}} {
		b.Run(p.name, func(b *testing.B) {
			var stopMS, cut, lostMS float64
			for b.Loop() {
				s, c, l := stopWithPolicy(b, p.stop)
				stopMS += float64(s) / float64(time.Millisecond)
				cut += float64(c)
				lostMS += float64(l) / float64(time.Millisecond)
			}
			b.ReportMetric(stopMS/float64(b.N), "stop-ms")
			b.ReportMetric(cut/float64(b.N), "cut")
			b.ReportMetric(lostMS/float64(b.N), "work-lost-ms")
		})
	}
}

func stopWithPolicy(b *testing.B, stop reconcilers.StopPolicy) (took time.Duration, cut int, lost time.Duration) {
	const (
		inFlight = 4
		steps    = 100
		step     = 20 * time.Millisecond
	)
	q := runnable.New(runnable.Options{GracePeriod: 10 * time.Second})
	var cutN, lostSteps atomic.Int64
	began := make(chan struct{}, inFlight)
	r := reconcilers.Wrap(q.Executor(), "apply", reconcile.Func(func(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
		began <- struct{}{}
		for i := range steps {
			select {
			case <-ctx.Done():
				cutN.Add(1)
				lostSteps.Add(int64(i))
				return reconcile.Result{}, fmt.Errorf("failed to apply: %w", ctx.Err())
			case <-time.After(step):
			}
		}
		return reconcile.Result{}, nil
	}), reconcilers.WrapOptions{Stop: stop})
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan error, 1)
	go func() { started <- q.Run(ctx) }()
	done := make(chan struct{}, inFlight)
	for i := range inFlight {
		go func() {
			_, _ = r.Reconcile(context.Background(), request("ns", fmt.Sprint(i)))
			done <- struct{}{}
		}()
	}
	for range inFlight {
		<-began
	}
	time.Sleep(200 * time.Millisecond) // the reconciles' work goes on: no state is waited for
	begin := time.Now()
	cancel()
	if err := <-started; err != nil {
		b.Fatal(err)
	}
	took = time.Since(begin)
	for range inFlight {
		<-done
	}
	return took, int(cutN.Load()), time.Duration(lostSteps.Load()) * step
}
