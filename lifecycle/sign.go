package lifecycle

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/types"

	"github.com/quiesce-dev/quiesce/internal"
)

// MinProgressKeyBytes is the shortest HandlersOptions.ProgressKey that Handlers accepts.
const MinProgressKeyBytes = 32

// ReasonProgressForged is the reason of the Warning Event for a progress annotation that
// the operator did not sign (HandlersOptions.ProgressKey) where it is read: written by someone
// else, copied from another object, annotation or controller, signed with another key, or
// holding a field twice (or in another case) so that two decoders could read it differently.
// It is refused: all handlers start afresh.
const ReasonProgressForged = "ProgressForged"

// macPrefix starts the MAC of a Record signed by this release. v0.2.0's MAC (macV1) has no
// prefix and binds neither the annotation key nor the controller: a Record it signed is not
// trusted, its handlers run once more (see openSigned).
const macPrefix = "v2:"

// Why a signed progress annotation is refused.
var (
	errUnsigned     = errors.New("failed to verify progress: no signature")
	errForged       = errors.New("failed to verify progress: signature does not match")
	errOldSignature = errors.New("failed to verify progress: signed by v0.2.0")
)

// signedFields are the fields of a signed Record, each of which must appear once, spelt so.
var signedFields = []string{"generation", "handlers", "mac"}

// binding is what a signature binds a Record to besides its content: where it was written.
type binding struct {
	annotation string    // the annotation key holding it, or ".status.<field>" (HandlersOptions.StatusField)
	controller string    // the controller whose handlers it records
	uid        types.UID // the object's UID
}

// signedRecord is the annotation's value with a ProgressKey: the Record's handlers as
// encoded, and their MAC.
type signedRecord struct {
	Generation int64           `json:"generation"`
	Handlers   json.RawMessage `json:"handlers"`
	MAC        string          `json:"mac"`
}

// encodeSigned returns r as the value of a progress annotation signed with key for b:
// Encode's, plus "mac".
func encodeSigned(r Record, key []byte, b binding) (string, error) {
	hs, err := json.Marshal(r.Handlers)
	if err != nil {
		return "", fmt.Errorf("failed to encode progress: %w", err)
	}
	out, err := json.Marshal(signedRecord{Generation: r.Generation, Handlers: hs, MAC: mac(key, b, r.Generation, hs)})
	if err != nil {
		return "", fmt.Errorf("failed to encode progress: %w", err)
	}
	return string(out), nil
}

// openSigned returns the Record of raw, a progress annotation's value that ParseRecord
// accepted, if it carries the MAC with key of its generation and handlers for b. The
// handlers are decoded from the very bytes the MAC covers, and raw must hold each of
// "generation", "handlers" and "mac" once, spelt so: encoding/json takes the last of two
// equal keys and matches field names in any case, so a second "handlers" (or a "HANDLERS")
// could otherwise be read in place of the signed one.
func openSigned(raw string, key []byte, b binding) (Record, error) {
	if err := checkFields(raw); err != nil {
		return Record{}, err
	}
	var w signedRecord
	if err := json.Unmarshal([]byte(raw), &w); err != nil {
		return Record{}, fmt.Errorf("failed to verify progress: %w", internal.CutError(err))
	}
	old := !strings.HasPrefix(w.MAC, macPrefix)
	switch {
	case w.MAC == "":
		return Record{}, errUnsigned
	case old && hmac.Equal([]byte(w.MAC), []byte(macV1(key, b.uid, w.Generation, w.Handlers))):
		return Record{}, errOldSignature
	case !hmac.Equal([]byte(w.MAC), []byte(mac(key, b, w.Generation, w.Handlers))):
		return Record{}, errForged
	}
	hs, err := decodeHandlers(w.Handlers)
	if err != nil {
		return Record{}, err
	}
	return Record{Generation: w.Generation, Handlers: hs}, nil
}

// checkFields returns an error if the JSON object raw holds one of signedFields more than
// once, or a key that encoding/json would match to one of them but spelt otherwise.
func checkFields(raw string) error {
	dec := json.NewDecoder(strings.NewReader(raw))
	if _, err := dec.Token(); err != nil { // "{": ParseRecord accepted raw
		return fmt.Errorf("failed to verify progress: %w", internal.CutError(err))
	}
	seen := make(map[string]bool, len(signedFields))
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return fmt.Errorf("failed to verify progress: %w", internal.CutError(err))
		}
		k, _ := tok.(string)
		for _, f := range signedFields {
			if !strings.EqualFold(k, f) {
				continue
			}
			switch {
			case k != f:
				return fmt.Errorf("failed to verify progress: field %q spelt %q", f, internal.Cut(k))
			case seen[f]:
				return fmt.Errorf("failed to verify progress: field %q appears twice", f)
			}
			seen[f] = true
		}
		var value json.RawMessage
		if err := dec.Decode(&value); err != nil {
			return fmt.Errorf("failed to verify progress: %w", internal.CutError(err))
		}
	}
	return nil
}

// mac is "v2:" and the HMAC-SHA256, with key, of the binding (the annotation key, the
// controller and the object's UID), the generation and the handlers' JSON, base64-encoded;
// each of them is prefixed by its length, so that no two bindings give the same input. The
// UID binds a Record to one object (not one copied from another, nor one left by an object of
// the same name since deleted), the annotation and the controller to the handlers that wrote
// it, the generation to one generation of the object.
func mac(key []byte, b binding, gen int64, handlers []byte) string {
	var in bytes.Buffer
	in.WriteString("quiesce.dev/progress/v2")
	for _, f := range []string{b.annotation, b.controller, string(b.uid), strconv.FormatInt(gen, 10)} {
		in.WriteString("\x00" + strconv.Itoa(len(f)) + ":" + f)
	}
	in.WriteString("\x00")
	in.Write(handlers)
	m := hmac.New(sha256.New, key)
	m.Write(in.Bytes())
	return macPrefix + base64.RawStdEncoding.EncodeToString(m.Sum(nil))
}

// macV1 is v0.2.0's MAC, which did not bind the annotation nor the controller. A Record it
// signed is told from a forged one (logged, no Event), never trusted.
func macV1(key []byte, uid types.UID, gen int64, handlers []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("quiesce.dev/progress/v1\x00" + string(uid) + "\x00" + strconv.FormatInt(gen, 10) + "\x00"))
	m.Write(handlers)
	return base64.RawStdEncoding.EncodeToString(m.Sum(nil))
}
