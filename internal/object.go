package internal

import (
	"reflect"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/go-logr/logr"
)

// BackoffCeiling bounds the retry delays of reconcilers.Daemons and lifecycle.Handlers. A
// century is "never" for a retry, and it stays far enough below time.Duration's limit (292
// years) for wait.Backoff, which doubles delays in float64 and overflows to a negative delay
// with a cap near that limit.
const BackoffCeiling = 100 * 365 * 24 * time.Hour

// Jitter returns d shortened by r tenths of itself, r in [0, 1): a jitter that spreads retries
// of things that failed together, and never lengthens a capped delay.
func Jitter(d time.Duration, r float64) time.Duration {
	return d - time.Duration(r*0.1*float64(d))
}

// MaxMessageBytes bounds the error messages kept in a progress annotation and the notes of
// Events. The API server caps all the annotations of an object together at 256 KiB, and an
// Event's note at 1 KiB: a whole error message (a response body, a command's output) would
// make every progress patch fail.
const MaxMessageBytes = 1024

// truncatedSuffix ends a message that TruncateMessage cut.
const truncatedSuffix = "... (truncated)"

// TruncateMessage returns s with invalid UTF-8 replaced (as encoding/json would anyway), cut
// to at most MaxMessageBytes bytes on a rune boundary and then ending with "... (truncated)".
func TruncateMessage(s string) string {
	s = strings.ToValidUTF8(s, string(utf8.RuneError))
	if len(s) <= MaxMessageBytes {
		return s
	}
	cut := MaxMessageBytes - len(truncatedSuffix)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + truncatedSuffix
}

// IsNil reports whether v is nil or a nil pointer, map, interface, slice, func or channel:
// a typed nil passed as an interface (a *events.FakeRecorder(nil) as a Recorder, a
// *clocktesting.FakeClock(nil) as a Clock, a client.Object).
//
// It is quiesce's one rule for plug-ins (every Options' recorders, clocks, loggers' sinks,
// readers, objects, clients, servers, locks): a typed nil is nil, so it means what an unset
// one means, a default or an error at setup, never a nil dereference at run time.
func IsNil(v any) bool {
	if v == nil {
		return true
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Interface, reflect.Slice, reflect.Func, reflect.Chan:
		return rv.IsNil()
	}
	return false
}

// NoLogger reports whether l logs nowhere: the zero Logger (logr.Discard() is the same), or
// one whose sink is a typed nil, which IsNil treats as unset.
func NoLogger(l logr.Logger) bool { return IsNil(l.GetSink()) }
