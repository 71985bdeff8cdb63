package lifecycle

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"k8s.io/apimachinery/pkg/types"

	"github.com/quiesce-dev/quiesce/internal"
)

// MinProgressKeyBytes is the shortest HandlersOptions.ProgressKey that Handlers accepts.
const MinProgressKeyBytes = 32

// ReasonProgressForged is the reason of the Warning Event for a progress annotation that
// the operator did not sign (HandlersOptions.ProgressKey): written by someone else, copied
// from another object, or signed with another key. It is refused: all handlers start
// afresh.
const ReasonProgressForged = "ProgressForged"

// errUnsigned and errForged are why a progress annotation is refused.
var (
	errUnsigned = errors.New("failed to verify progress: no signature")
	errForged   = errors.New("failed to verify progress: signature does not match")
)

// signedRecord is the annotation's value with a ProgressKey: the Record's handlers as
// encoded, and their MAC.
type signedRecord struct {
	Generation int64           `json:"generation"`
	Handlers   json.RawMessage `json:"handlers"`
	MAC        string          `json:"mac"`
}

// encodeSigned returns r as the value of a progress annotation signed with key for the
// object uid: Encode's, plus "mac".
func encodeSigned(r Record, key []byte, uid types.UID) (string, error) {
	hs, err := json.Marshal(r.Handlers)
	if err != nil {
		return "", fmt.Errorf("failed to encode progress: %w", err)
	}
	b, err := json.Marshal(signedRecord{Generation: r.Generation, Handlers: hs, MAC: mac(key, uid, r.Generation, hs)})
	if err != nil {
		return "", fmt.Errorf("failed to encode progress: %w", err)
	}
	return string(b), nil
}

// verifySigned checks that raw, a progress annotation's value that ParseRecord accepted,
// carries the MAC of its own generation and handlers, as written, for the object uid.
func verifySigned(raw string, key []byte, uid types.UID) error {
	var w struct {
		Generation int64           `json:"generation"`
		Handlers   json.RawMessage `json:"handlers"`
		MAC        string          `json:"mac"`
	}
	if err := json.Unmarshal([]byte(raw), &w); err != nil {
		return fmt.Errorf("failed to verify progress: %w", internal.CutError(err))
	}
	if w.MAC == "" {
		return errUnsigned
	}
	if !hmac.Equal([]byte(w.MAC), []byte(mac(key, uid, w.Generation, w.Handlers))) {
		return errForged
	}
	return nil
}

// mac is the HMAC-SHA256, with key, of the object's UID, the generation and the handlers'
// JSON, base64-encoded. The UID binds a Record to one object (not one copied from another,
// nor one left by an object of the same name since deleted), the generation to one
// generation of it.
func mac(key []byte, uid types.UID, gen int64, handlers []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("quiesce.dev/progress/v1\x00" + string(uid) + "\x00" + strconv.FormatInt(gen, 10) + "\x00"))
	m.Write(handlers)
	return base64.RawStdEncoding.EncodeToString(m.Sum(nil))
}
