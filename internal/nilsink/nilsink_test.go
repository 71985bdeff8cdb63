package nilsink_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/quiesce-dev/quiesce/internal/nilsink"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestATypedNilSinkFailsWhenItLogs(t *testing.T) {
	l := nilsink.Logger() // made without a panic: Init needs no receiver
	defer func() {
		if recover() == nil {
			t.Error("a typed-nil Sink logged without a nil dereference")
		}
	}()
	l.Info("line")
}
