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
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/quiesce-dev/quiesce/drain"
)

// remembered returns how many daemons d holds (running or stopping), and how many marks of
// daemons that returned nil.
func (d *Daemons) remembered() (daemons, marks int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.daemons), len(d.finished)
}

// Thousands of objects cost one goroutine each while their daemon runs; a daemon that
// returned nil leaves only its mark; once their objects go (Stop), nothing of them is left,
// and once the executor drains, only the marks of the objects left.
func TestDaemonsForgetReturnedDaemons(t *testing.T) {
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
				fn = done // returns nil: forgotten, its mark stays until Stop
			}
			if err := d.Ensure(context.Background(), obj, "d", fn); err != nil {
				t.Fatal(err)
			}
		}
		synctest.Wait()
		if got := d.Stats().Running; got != n/2 {
			t.Fatalf("%d running, want %d", got, n/2)
		}
		if daemons, marks := d.remembered(); daemons != n/2 || marks != n/2 {
			t.Fatalf("%d daemons and %d marks remembered, want %d and %d", daemons, marks, n/2, n/2)
		}
		for i := range n / 2 { // the first half of the objects go
			stopped, err := d.Stop(context.Background(), client.ObjectKey{Namespace: "ns", Name: "obj-" + strconv.Itoa(i)}, "d")
			if !stopped || err != nil {
				t.Fatalf("Stop = %v, %v", stopped, err)
			}
		}
		if daemons, marks := d.remembered(); daemons != n/4 || marks != n/4 {
			t.Fatalf("%d daemons and %d marks after stopping half, want %d and %d", daemons, marks, n/4, n/4)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := ex.Drain(ctx); err != nil {
			t.Fatal(err)
		}
		if daemons, marks := d.remembered(); daemons != 0 || marks != n/4 {
			t.Errorf("%d daemons and %d marks after the drain, want none and the %d of the objects left", daemons, marks, n/4)
		}
		if got := d.Stats().Running; got != 0 {
			t.Errorf("%d running after the drain", got)
		}
	})
}

// A daemon that returned nil is not started again for its object (same UID) and
// generation; it is for a recreated object (a new UID), whose start replaces the mark.
func TestDaemonsReturnedNilMarkIsPerUID(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ex := drain.New(drain.Options{})
		d := NewDaemons(ex, "cm", DaemonsOptions{})
		runs := 0
		fn := func(ctx context.Context) error { runs++; return ctx.Err() } // nil: its context is alive
		ensure := func(uid string) {
			t.Helper()
			obj := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a", UID: types.UID(uid), Generation: 1}}
			if err := d.Ensure(context.Background(), obj, "once", fn); err != nil {
				t.Fatal(err)
			}
			synctest.Wait()
		}
		ensure("uid-1")
		ensure("uid-1")
		if runs != 1 {
			t.Fatalf("ran %d times for one object, want 1", runs)
		}
		if daemons, marks := d.remembered(); daemons != 0 || marks != 1 {
			t.Fatalf("%d daemons and %d marks, want the mark only", daemons, marks)
		}
		ensure("uid-2") // recreated under the same name
		ensure("uid-2")
		if runs != 2 {
			t.Fatalf("ran %d times after the object was recreated, want 2", runs)
		}
		if daemons, marks := d.remembered(); daemons != 0 || marks != 1 {
			t.Fatalf("%d daemons and %d marks, want the new object's mark only", daemons, marks)
		}
		if err := ex.Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}

// The restart metric is registered in controller-runtime's registry by NewDaemons, once;
// a counter of the same name registered already is used, not a second one.
func TestDaemonRestartsRegisteredAtUse(t *testing.T) {
	ex := drain.New(drain.Options{})
	NewDaemons(ex, "registered", DaemonsOptions{})
	mfs, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, mf := range mfs {
		if mf.GetName() == "quiesce_daemon_restarts_total" {
			found = true
		}
	}
	if !found {
		t.Fatal("quiesce_daemon_restarts_total not in metrics.Registry after NewDaemons")
	}

	// Another copy of the package registering its own counter of the same name.
	if got := registerDaemonRestarts(); got != daemonRestarts() {
		t.Fatal("registerDaemonRestarts did not use the counter registered already")
	}
}
