package drain_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/quiesce-dev/quiesce/drain"
)

// notCreated is the panic of an Executor that drain.New did not create.
const notCreated = "drain: Executor not created by drain.New (use drain.New(drain.Options{}))"

// TestExecutorNotCreatedByNew: the methods that return an error return one wrapping
// ErrInvalidCall for an Executor that drain.New did not create; the others panic. Neither
// runs fn.
func TestExecutorNotCreatedByNew(t *testing.T) {
	var zero drain.Executor
	executors := map[string]*drain.Executor{
		"var e drain.Executor": &zero,
		"&drain.Executor{}":    {},
		"nil":                  nil,
	}
	ran := false
	fn := func(ctx context.Context) error { ran = true; return ctx.Err() }
	ctx := context.Background()
	errs := map[string]func(e *drain.Executor) error{
		"Call":  func(e *drain.Executor) error { return e.Call(ctx, "c", fn) },
		"Go":    func(e *drain.Executor) error { return e.Go(ctx, "c", fn) },
		"Run":   func(e *drain.Executor) error { return e.Run(ctx, "c", fn) },
		"Drain": func(e *drain.Executor) error { return e.Drain(ctx) },
	}
	for ename, e := range executors {
		for mname, call := range errs {
			err := call(e)
			if !errors.Is(err, drain.ErrInvalidCall) || !strings.Contains(err.Error(), notCreated) {
				t.Errorf("%s/%s = %v, want ErrInvalidCall saying %q", ename, mname, err, notCreated)
			}
		}
	}
	methods := map[string]func(e *drain.Executor){
		"Pending":  func(e *drain.Executor) { _ = e.Pending() },
		"Locate":   func(e *drain.Executor) { _, _ = e.Locate(-1) },
		"Draining": func(e *drain.Executor) { _ = e.Draining() },
		"Stats":    func(e *drain.Executor) { _ = e.Stats() },
	}
	for ename, e := range executors {
		for mname, call := range methods {
			t.Run(ename+"/"+mname, func(t *testing.T) {
				defer func() {
					if v := recover(); v != notCreated {
						t.Fatalf("recover() = %v, want %q", v, notCreated)
					}
				}()
				call(e)
				t.Fatal("no panic")
			})
		}
	}
	if ran {
		t.Fatal("fn ran on an Executor that drain.New did not create")
	}
}
