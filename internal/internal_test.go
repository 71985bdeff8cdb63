package internal_test

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

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

func TestCut(t *testing.T) {
	if got := internal.Cut("short"); got != "short" {
		t.Errorf("Cut(short) = %q", got)
	}
	exact := strings.Repeat("a", internal.MaxNameBytes)
	if got := internal.Cut(exact); got != exact {
		t.Errorf("Cut of exactly MaxNameBytes changed it")
	}
	huge := strings.Repeat("x", 10<<20)
	if got := internal.Cut(huge); got != strings.Repeat("x", internal.MaxNameBytes)+"...(10485760 bytes)" {
		t.Errorf("Cut(10 MB) = %.300q...", got)
	}
	// A multi-byte rune across the bound is not split.
	s := strings.Repeat("a", internal.MaxNameBytes-1) + "é" + "tail"
	got := internal.Cut(s)
	if !utf8.ValidString(got) || !strings.HasPrefix(got, strings.Repeat("a", internal.MaxNameBytes-1)+"...(") {
		t.Errorf("Cut split a rune: %q", got)
	}
}

func TestCutError(t *testing.T) {
	short := errors.New("short")
	if got := internal.CutError(short); got != short { //nolint:errorlint // the same error, not a wrapper
		t.Errorf("CutError(short) = %#v, want it as it is", got)
	}
	if internal.CutError(nil) != nil {
		t.Error("CutError(nil) != nil")
	}
	long := fmt.Errorf("bad value %q: %w", strings.Repeat("v", 10_000), io.ErrUnexpectedEOF)
	got := internal.CutError(long)
	if n := len(got.Error()); n > internal.MaxNameBytes+32 || !strings.HasSuffix(got.Error(), "bytes)") {
		t.Errorf("CutError(10 KB) = %d bytes: %.300q, want it cut to %d and marked", n, got, internal.MaxNameBytes)
	}
	if !errors.Is(got, io.ErrUnexpectedEOF) || !errors.Is(got, long) {
		t.Errorf("CutError(long) does not wrap it")
	}
}
