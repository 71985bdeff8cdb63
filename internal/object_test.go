package internal_test

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"

	"github.com/quiesce-dev/quiesce/internal"
)

func TestTruncateMessage(t *testing.T) {
	const mark = "... (truncated)"
	const limit = internal.MaxMessageBytes
	fits := strings.Repeat("a", limit)
	for _, tc := range []struct{ name, in, want string }{
		{"empty", "", ""},
		{"short", "failed to dial", "failed to dial"},
		{"exactly the limit", fits, fits},
		{"one byte over", fits + "b", fits[:limit-len(mark)] + mark},
		{"cut inside a rune", strings.Repeat("a", limit-len(mark)-1) + "é" + fits, strings.Repeat("a", limit-len(mark)-1) + mark},
		{"invalid UTF-8", "bad \xff byte", "bad \uFFFD byte"},
		{"a run of invalid bytes", strings.Repeat("\x80", 2*limit), "\uFFFD"},
	} {
		got := internal.TruncateMessage(tc.in)
		if got != tc.want || len(got) > limit || !utf8.ValidString(got) {
			t.Errorf("%s: TruncateMessage = %d bytes %.30q...; want %d bytes %.30q...", tc.name, len(got), got, len(tc.want), tc.want)
		}
	}
}

func TestJitter(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		r    float64
		want time.Duration
	}{
		{time.Second, 0, time.Second},
		{time.Second, 0.5, 950 * time.Millisecond},
		{time.Minute, 0.5, 57 * time.Second},
	} {
		if got := internal.Jitter(tc.d, tc.r); got != tc.want {
			t.Errorf("Jitter(%v, %v) = %v, want %v", tc.d, tc.r, got, tc.want)
		}
	}
}

func TestIsNil(t *testing.T) {
	var p *strings.Builder
	var m map[string]int
	for _, tc := range []struct {
		v    any
		want bool
	}{
		{nil, true}, {p, true}, {m, true}, {&strings.Builder{}, false}, {0, false}, {"", false},
		{(func())(nil), true}, {func() {}, false}, {(chan int)(nil), true}, {make(chan int), false},
	} {
		if got := internal.IsNil(tc.v); got != tc.want {
			t.Errorf("IsNil(%#v) = %t, want %t", tc.v, got, tc.want)
		}
	}
}

func TestNoLogger(t *testing.T) {
	for _, tc := range []struct {
		name string
		l    logr.Logger
		want bool
	}{
		{"zero", logr.Logger{}, true},
		{"Discard", logr.Discard(), true},
		{"typed-nil sink", logr.New((*initOnly)(nil)), true},
		{"funcr", funcr.New(func(string, string) {}, funcr.Options{}), false},
	} {
		if got := internal.NoLogger(tc.l); got != tc.want {
			t.Errorf("NoLogger(%s) = %t, want %t", tc.name, got, tc.want)
		}
	}
}

// initOnly is a logr.LogSink whose other methods need a non-nil receiver.
type initOnly struct{ logr.LogSink }

func (*initOnly) Init(logr.RuntimeInfo) {}
