package shutdowntest_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	. "github.com/onsi/gomega"

	"github.com/quiesce-dev/quiesce/shutdowntest"
)

func TestEvery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		started := make(chan int, 10)
		stop := shutdowntest.Every(ctx, 10*time.Millisecond, func(_ context.Context, i int) error {
			started <- i
			time.Sleep(25 * time.Millisecond) // calls overlap: each on a goroutine of its own
			if i%2 == 1 {
				return fmt.Errorf("call %d", i)
			}
			return nil
		})
		time.Sleep(45 * time.Millisecond)
		synctest.Wait()
		g.Expect(started).To(HaveLen(4)) // at 10, 20, 30, 40ms
		calls, errs := stop()            // waits for the calls in flight
		g.Expect(calls).To(Equal(4))
		g.Expect(errs).To(ConsistOf(errors.New("call 1"), errors.New("call 3")))

		stop = shutdowntest.Every(ctx, 10*time.Millisecond, func(context.Context, int) error { return nil })
		time.Sleep(15 * time.Millisecond)
		cancel() // the end of ctx ends the calls too
		time.Sleep(time.Second)
		calls, errs = stop()
		g.Expect(calls).To(Equal(1))
		g.Expect(errs).To(BeEmpty())
	})
}
