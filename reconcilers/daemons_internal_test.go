package reconcilers

import (
	"context"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/quiesce-dev/quiesce/drain"
)

func (d *Daemons) remembered() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.daemons)
}

// Thousands of objects cost one goroutine each while their daemon runs; once their objects
// go (Stop) or the executor drains, nothing of them is left.
func TestDaemonsForgetStoppedDaemons(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ex := drain.New(drain.Options{})
		d := NewDaemons(ex, "cm", DaemonsOptions{})
		const n = 2000
		wait := func(ctx context.Context) error { <-ctx.Done(); return nil }
		done := func(context.Context) error { return nil }
		for i := range n {
			name := "obj-" + strconv.Itoa(i)
			obj := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID(name)}}
			fn := wait
			if i%2 == 1 {
				fn = done // returns nil: remembered until Stop
			}
			if err := d.Ensure(context.Background(), obj, "d", fn); err != nil {
				t.Fatal(err)
			}
		}
		synctest.Wait()
		if got := d.Stats().Running; got != n/2 {
			t.Fatalf("%d running, want %d", got, n/2)
		}
		if got := d.remembered(); got != n {
			t.Fatalf("%d remembered, want %d", got, n)
		}
		for i := range n / 2 { // the first half of the objects go
			stopped, err := d.Stop(context.Background(), client.ObjectKey{Namespace: "ns", Name: "obj-" + strconv.Itoa(i)}, "d")
			if !stopped || err != nil {
				t.Fatalf("Stop = %v, %v", stopped, err)
			}
		}
		if got := d.remembered(); got != n/2 {
			t.Fatalf("%d remembered after stopping half, want %d", got, n/2)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := ex.Drain(ctx); err != nil {
			t.Fatal(err)
		}
		if got := d.remembered(); got != n/4 {
			t.Errorf("%d remembered after the drain, want the %d done ones of the objects left", got, n/4)
		}
		if got := d.Stats().Running; got != 0 {
			t.Errorf("%d running after the drain", got)
		}
	})
}
