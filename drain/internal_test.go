package drain

import (
	"context"
	"testing"

	"github.com/quiesce-dev/quiesce/internal"
)

// TestLocateCallNotStarted looks at a call between its admission and its fn's start, which
// the public API cannot hold still: Go starts fn's goroutine before it returns.
func TestLocateCallNotStarted(t *testing.T) {
	e := New(Options{})
	ran := make(chan struct{})
	c, err := e.admit(context.Background(), &internal.CallOptions{Name: "admitted"}, func(context.Context) error {
		close(ran)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	c.state.Store(callDetached)
	calls := e.locate([]*call{c})
	if len(calls) != 1 || calls[0].Name != "admitted" || calls[0].Where != NotStarted || calls[0].Handler != NotStarted {
		t.Errorf("locate = %+v, want the call not started", calls)
	}
	go c.exec()
	<-ran
	if err := e.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestIsStdInADotlessModule(t *testing.T) {
	saved := modules
	t.Cleanup(func() { modules = saved })
	modules = func() []string { return []string{"myoperator", "github.com/go-logr/logr"} }
	for pkg, want := range map[string]bool{
		"sync":                    true,
		"internal/sync":           true,
		"vendor/golang.org/x/net": true,
		"myoperator":              false,
		"myoperator/controllers":  false,
		"myoperatorx/controllers": true, // not the module: a prefix of a path element
		"github.com/go-logr/logr": false,
		"main":                    false,
		"example.com/not/in/deps": false, // a dot: never the standard library
		"command-line-arguments":  false,
	} {
		if got := isStd(pkg); got != want {
			t.Errorf("isStd(%q) = %v, want %v", pkg, got, want)
		}
	}
}
