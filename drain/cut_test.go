package drain_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/quiesce-dev/quiesce/drain"
)

// TestMegabytePanicValuesAndNames: a panic value and a call name of a megabyte each reach
// the error and the "Call panicked" line cut, not whole.
func TestMegabytePanicValuesAndNames(t *testing.T) {
	huge := strings.Repeat("x", 1<<20)
	lines := &logs{}
	ex := drain.New(drain.Options{Logger: lines.logger(t)})
	if err := ex.Go(context.Background(), huge, func(context.Context) error { panic(huge) }); err != nil {
		t.Fatal(err)
	}
	err := ex.Call(context.Background(), huge, func(context.Context) error { panic(errors.New(huge)) })
	if err := ex.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	var pe *drain.PanicError
	if !errors.As(err, &pe) || len(err.Error()) > 1024 || !strings.HasSuffix(err.Error(), "...(1048576 bytes)") {
		t.Fatalf("Call's error of %d bytes, want a *PanicError of at most 1 KiB, the value cut and marked", len(err.Error()))
	}
	got := lines.get()
	if len(got) == 0 {
		t.Fatal("no line about the panic of the call nobody waited for")
	}
	for _, l := range got {
		// The line holds the stack too: bounded by the runtime, not by what the caller said.
		if len(l.raw) > 16<<10 {
			t.Errorf("log line of %d bytes: %.200s...", len(l.raw), l.raw)
		}
	}
}
