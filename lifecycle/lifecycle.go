package lifecycle

import (
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// Progress is the progress of one handler on one generation of one object. A Func reads
// Retries and Done; Handlers keeps all of it in the object's Record.
type Progress struct {
	// Retries counts the runs that failed with a retryable error. A run interrupted by a
	// shutdown is not counted: it was not the handler's failure.
	Retries int `json:"retries"`

	// Done reports that the handler will not run again for this generation: it succeeded,
	// or it failed for good (Failed).
	Done bool `json:"done"`

	// Failed reports that the handler returned a reconcile.TerminalError.
	Failed bool `json:"failed,omitempty"`

	// Started is when the last run began. Set and not Done: the run failed, or the operator
	// stopped while it ran, and the handler runs again.
	Started *time.Time `json:"started,omitempty"`

	// Delayed is the time before which a failed handler is not retried (the backoff).
	Delayed *time.Time `json:"delayed,omitempty"`

	// Message is what is published of the error of the last failed run: by default its
	// class only ("Forbidden (HTTP 403)", "*url.Error", "terminal error: ...", "panic",
	// then " (details in the operator's log)"); with HandlersOptions.PublishErrors its text,
	// cut to 1 KiB on a UTF-8 boundary and then ending with "... (truncated)". Empty once
	// the handler succeeded.
	Message string `json:"message,omitempty"`
}

// Func picks, from the handlers still to run (in registration order), those to run now.
//
// pending holds handler ids; progress maps a handler id to its progress, and a missing entry
// means zero retries, not done. A Func must not modify pending or progress, and returns a new
// slice (never a sub-slice of pending) holding a subset of pending. When pending is empty, every
// Func of this package returns nil.
//
// The caller passes in pending only the handlers that are not done, so the Funcs of this package
// do not filter on Progress.Done: the filtering is in one place.
type Func func(pending []string, progress map[string]Progress) []string

// Test seams: the sources of randomness of Randomized and Shuffled.
var (
	intN    = rand.IntN
	shuffle = rand.Shuffle
)

// AllAtOnce returns all pending handlers, in order.
func AllAtOnce(pending []string, _ map[string]Progress) []string {
	if len(pending) == 0 {
		return nil
	}
	return slices.Clone(pending)
}

// OneByOne returns the first pending handler only.
func OneByOne(pending []string, _ map[string]Progress) []string {
	if len(pending) == 0 {
		return nil
	}
	return []string{pending[0]}
}

// Randomized returns one pending handler, picked at random.
func Randomized(pending []string, _ map[string]Progress) []string {
	if len(pending) == 0 {
		return nil
	}
	return []string{pending[intN(len(pending))]}
}

// Shuffled returns all pending handlers, in random order.
func Shuffled(pending []string, _ map[string]Progress) []string {
	if len(pending) == 0 {
		return nil
	}
	s := slices.Clone(pending)
	shuffle(len(s), func(i, j int) { s[i], s[j] = s[j], s[i] })
	return s
}

// ASAP returns one pending handler: the one with the fewest retries; on a tie, the first in
// pending, that is in registration order. A handler missing from progress has zero retries.
// ASAP is the default of HandlersOptions.Lifecycle: a handler that keeps failing does not
// hold back the others, which run before its next retry.
func ASAP(pending []string, progress map[string]Progress) []string {
	if len(pending) == 0 {
		return nil
	}
	best := 0
	for i := 1; i < len(pending); i++ {
		// Strictly fewer: on a tie the earlier handler stays.
		if progress[pending[i]].Retries < progress[pending[best]].Retries {
			best = i
		}
	}
	return []string{pending[best]}
}

// The lifecycles are functions of type Func, not variables: nothing can replace them.
var (
	_ Func = AllAtOnce
	_ Func = OneByOne
	_ Func = Randomized
	_ Func = Shuffled
	_ Func = ASAP
)

// names lists the lifecycles known to Named, in the order Names returns them.
var names = []struct {
	name string
	fn   Func
}{
	{"ASAP", ASAP},
	{"AllAtOnce", AllAtOnce},
	{"OneByOne", OneByOne},
	{"Randomized", Randomized},
	{"Shuffled", Shuffled},
}

// Named returns the lifecycle called name, and whether there is one. The names are those of the
// package's functions, matched without regard to case, '-' or '_': "ASAP", "asap", "OneByOne",
// "one-by-one" and kopf's "one_by_one" all work. It suits a command-line flag.
func Named(name string) (Func, bool) {
	key := normalize(name)
	for _, n := range names {
		if normalize(n.name) == key {
			return n.fn, true
		}
	}
	return nil, false
}

// Names returns the names Named knows, the default first, for a flag's help text.
func Names() []string {
	s := make([]string, len(names))
	for i, n := range names {
		s[i] = n.name
	}
	return s
}

func normalize(name string) string {
	return strings.ToLower(strings.NewReplacer("-", "", "_", "").Replace(name))
}
