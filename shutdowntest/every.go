package shutdowntest

import (
	"context"
	"sync"
	"time"
)

// Every calls fn every interval, each call on a goroutine of its own with its number (0, 1,
// ...), until stop is called or ctx ends, e.g. to send admission requests throughout a
// rolling update:
//
//	stop := shutdowntest.Every(ctx, 20*time.Millisecond, func(ctx context.Context, i int) error {
//		return k8sClient.Create(ctx, newMemcached(fmt.Sprintf("m-%d", i)))
//	})
//	// ... the rollout ...
//	calls, errs := stop()
//	Expect(errs).To(BeEmpty())
//
// stop waits for the calls in flight, and returns how many were made and the errors they
// returned, in the order they returned. Call it once.
func Every(ctx context.Context, interval time.Duration, fn func(ctx context.Context, i int) error) (
	stop func() (calls int, errs []error),
) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	n := 0
	wg.Go(func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for i := 0; ; i++ {
			select {
			case <-t.C:
			case <-done:
				return
			case <-ctx.Done():
				return
			}
			n = i + 1
			wg.Go(func() {
				if err := fn(ctx, i); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			})
		}
	})
	return func() (int, []error) {
		close(done)
		wg.Wait()
		return n, errs
	}
}
