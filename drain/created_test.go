package drain_test

import (
	"context"
	"testing"

	"github.com/quiesce-dev/quiesce/drain"
)

// notCreated is the panic of an Executor that drain.New did not create.
const notCreated = "drain: Executor not created by drain.New (use drain.New(drain.Options{}))"

func TestExecutorNotCreatedByNewPanicsInEveryMethod(t *testing.T) {
	var zero drain.Executor
	executors := map[string]*drain.Executor{
		"var e drain.Executor": &zero,
		"&drain.Executor{}":    {},
		"nil":                  nil,
	}
	ran := false
	fn := func(ctx context.Context) error { ran = true; return ctx.Err() }
	ctx := context.Background()
	methods := map[string]func(e *drain.Executor){
		"Call":     func(e *drain.Executor) { _ = e.Call(ctx, "c", fn) },
		"Go":       func(e *drain.Executor) { _ = e.Go(ctx, "c", fn) },
		"Run":      func(e *drain.Executor) { _ = e.Run(ctx, "c", fn) },
		"Drain":    func(e *drain.Executor) { _ = e.Drain(ctx) },
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
