package internal_test

import (
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/quiesce-dev/quiesce/internal"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestAge(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0:                       "0s",
		1499 * time.Microsecond: "1ms",
		999 * time.Millisecond:  "999ms",
		1499 * time.Millisecond: "1s",
		1500 * time.Millisecond: "2s",
		90 * time.Second:        "1m30s",
	} {
		if got := internal.Age(d); got != want {
			t.Errorf("Age(%v) = %q, want %q", d, got, want)
		}
	}
}
