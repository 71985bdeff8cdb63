package reconcilers

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/quiesce-dev/quiesce/lifecycle"
)

// DefaultProgressAnnotation is the annotation in which Handlers keeps handler progress when
// HandlersOptions.Annotation is empty.
const DefaultProgressAnnotation = "quiesce.dev/progress"

// Progress is what Handlers keeps, as JSON in one annotation of the object, about the
// handlers of the object's current generation. It is exported so that tests and tools can
// read the annotation with ParseProgress; a reconciler of Handlers is its only writer.
//
// An example of the annotation's value:
//
//	{"generation":3,"handlers":{"a":{"retries":0,"done":true,"started":"2025-01-02T03:04:05Z"},
//	 "b":{"retries":2,"done":false,"started":"...","delayed":"...","message":"failed to dial: ..."}}}
type Progress struct {
	// Generation is the metadata.generation of the object the handlers ran for. Progress of
	// another generation is stale: every handler runs again for the new one.
	Generation int64 `json:"generation"`

	// Handlers maps a handler id to its progress. A missing id has not run yet. Ids that
	// the reconciler does not know (a handler removed in a later version) are kept as read.
	Handlers map[string]HandlerProgress `json:"handlers,omitempty"`
}

// HandlerProgress is the progress of one handler for one generation of one object.
type HandlerProgress struct {
	// Retries counts the runs that failed with a retryable error. A run interrupted by a
	// shutdown (its context ended) is not counted: it was not a failure of the handler.
	Retries int `json:"retries"`

	// Done reports that the handler will not run again for this generation: it succeeded,
	// or it failed for good (Failed).
	Done bool `json:"done"`

	// Failed reports that the handler returned a reconcile.TerminalError: it is done, and
	// failed for good.
	Failed bool `json:"failed,omitempty"`

	// Started is when the last run of the handler began. Set and not Done means the handler
	// was started and did not finish (it failed, or the operator stopped while it ran): it
	// runs again.
	Started *time.Time `json:"started,omitempty"`

	// Delayed is the time before which a failed handler is not retried (the backoff).
	Delayed *time.Time `json:"delayed,omitempty"`

	// Message is the error of the last failed run; empty once the handler succeeded. An
	// error longer than 1 KiB is cut to 1 KiB, on a UTF-8 character boundary, ending with
	// "... (truncated)".
	Message string `json:"message,omitempty"`
}

// errNoProgress is returned by ParseProgress for an empty value.
var errNoProgress = errors.New("no progress")

// ParseProgress decodes the value of a progress annotation. It returns an error for a value
// that is not a progress: empty, not a JSON object, without a generation, with a field of
// the wrong type, with trailing data, or with a negative retry count.
//
// Fields it does not know are ignored, at the top level and in each handler's progress: a
// newer version of this package may add some, and an operator rolled back to an older one
// must still read the progress rather than run every handler again. The older version drops
// those fields when it records its next cycle.
func ParseProgress(s string) (Progress, error) {
	if s == "" {
		return Progress{}, errNoProgress
	}
	// Every version writes the generation: without one, the value is some other JSON.
	var w struct {
		Generation *int64                     `json:"generation"`
		Handlers   map[string]HandlerProgress `json:"handlers"`
	}
	if err := json.Unmarshal([]byte(s), &w); err != nil {
		return Progress{}, fmt.Errorf("failed to decode progress: %w", err)
	}
	if w.Generation == nil {
		return Progress{}, errors.New("failed to decode progress: no generation")
	}
	for id, h := range w.Handlers {
		if h.Retries < 0 {
			return Progress{}, fmt.Errorf("failed to decode progress: handler %q has %d retries", id, h.Retries)
		}
	}
	return Progress{Generation: *w.Generation, Handlers: w.Handlers}, nil
}

// Encode returns p as the value of a progress annotation. Map keys are sorted (encoding/json),
// so equal progress always encodes to the same string. It fails only for a time outside the
// years 0-9999.
func (p Progress) Encode() (string, error) {
	b, err := json.Marshal(p)
	if err != nil {
		return "", fmt.Errorf("failed to encode progress: %w", err)
	}
	return string(b), nil
}

// lifecycleProgress returns the progress of ids in the form a lifecycle.Func reads.
func (p Progress) lifecycleProgress(ids []string) map[string]lifecycle.Progress {
	out := make(map[string]lifecycle.Progress, len(ids))
	for _, id := range ids {
		h := p.Handlers[id]
		out[id] = lifecycle.Progress{Retries: h.Retries, Done: h.Done}
	}
	return out
}

// clone returns a copy of p that shares no map with it.
func (p Progress) clone() Progress {
	out := Progress{Generation: p.Generation, Handlers: make(map[string]HandlerProgress, len(p.Handlers))}
	for id, h := range p.Handlers {
		out.Handlers[id] = h
	}
	return out
}
