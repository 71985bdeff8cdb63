package lifecycle

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/quiesce-dev/quiesce/internal"
)

// DefaultProgressAnnotation is the annotation in which Handlers keeps its Record when
// HandlersOptions.Annotation is empty.
const DefaultProgressAnnotation = "quiesce.dev/progress"

// Record is the progress of an object's handlers for its current generation, as Handlers keeps
// it, JSON-encoded, in one annotation of the object. Tests and tools read it with ParseRecord;
// Handlers is its only writer.
//
// With HandlersOptions.ProgressKey, the value also holds "mac", the Record's signature,
// which ParseRecord ignores. An example of the annotation's value:
//
//	{"generation":3,"handlers":{"a":{"retries":0,"done":true,"started":"2025-01-02T03:04:05Z"},
//	 "b":{"retries":2,"done":false,"started":"...","delayed":"...","message":"failed to dial: ..."}}}
type Record struct {
	// Generation is the metadata.generation of the object the handlers ran for. A Record of
	// another generation is stale: every handler runs again for the new one.
	Generation int64 `json:"generation"`

	// Handlers maps a handler id to its progress. A missing id has not run yet. Ids that
	// the reconciler does not know (a handler since removed) are kept as read.
	Handlers map[string]Progress `json:"handlers,omitempty"`
}

// errNoRecord is returned by ParseRecord for an empty value.
var errNoRecord = errors.New("no progress")

// ParseRecord decodes the value of a progress annotation. It returns an error for a value
// that is not a Record: empty, not a JSON object, without a generation, with a field of the
// wrong type, with trailing data, or with a negative retry count.
//
// Unknown fields are ignored, at the top level and in each handler's progress, so that an
// operator rolled back to an older release still reads what a newer one wrote instead of
// running every handler again; it drops those fields when it records its next cycle.
func ParseRecord(s string) (Record, error) {
	if s == "" {
		return Record{}, errNoRecord
	}
	// Every version writes the generation: without one, the value is some other JSON.
	var w struct {
		Generation *int64          `json:"generation"`
		Handlers   json.RawMessage `json:"handlers"`
	}
	if err := json.Unmarshal([]byte(s), &w); err != nil {
		return Record{}, fmt.Errorf("failed to decode progress: %w", internal.CutError(err))
	}
	if w.Generation == nil {
		return Record{}, errors.New("failed to decode progress: no generation")
	}
	hs, err := decodeHandlers(w.Handlers)
	if err != nil {
		return Record{}, err
	}
	return Record{Generation: *w.Generation, Handlers: hs}, nil
}

// decodeHandlers decodes the "handlers" of a Record; nil or null for none.
func decodeHandlers(raw json.RawMessage) (map[string]Progress, error) {
	if raw == nil {
		return nil, nil
	}
	var hs map[string]Progress
	if err := json.Unmarshal(raw, &hs); err != nil {
		return nil, fmt.Errorf("failed to decode progress: %w", internal.CutError(err))
	}
	for id, h := range hs {
		if h.Retries < 0 {
			return nil, fmt.Errorf("failed to decode progress: handler %q has %d retries", internal.Cut(id), h.Retries)
		}
	}
	return hs, nil
}

// Encode returns r as the value of a progress annotation. Map keys are sorted (encoding/json),
// so an equal Record always encodes to the same string. It fails only for a time outside the
// years 0-9999.
func (r Record) Encode() (string, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return "", fmt.Errorf("failed to encode progress: %w", err)
	}
	return string(b), nil
}

// progressOf returns the progress of ids in a map of its own, for a Func to read.
func (r Record) progressOf(ids []string) map[string]Progress {
	out := make(map[string]Progress, len(ids))
	for _, id := range ids {
		out[id] = r.Handlers[id]
	}
	return out
}

// clone returns a copy of r that shares no map with it.
func (r Record) clone() Record {
	out := Record{Generation: r.Generation, Handlers: make(map[string]Progress, len(r.Handlers))}
	for id, h := range r.Handlers {
		out.Handlers[id] = h
	}
	return out
}
