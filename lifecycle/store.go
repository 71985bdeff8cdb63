package lifecycle

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// store is where Handlers keeps the Record of an object: an annotation, or a string field of
// the status (HandlersOptions.StatusField).
type store struct {
	annotation string   // the annotation key; "" with field
	field      []string // the field's path under .status; nil for the annotation
	where      string   // "annotation <key>" or "status field .status.<path>", for logs and Events
	bound      string   // the place the signature binds: the annotation key, or ".status.<path>"
}

func newStore(annotation, statusField string) (store, error) {
	if statusField == "" {
		if errs := validation.IsQualifiedName(annotation); len(errs) > 0 {
			return store{}, fmt.Errorf("failed to create handlers: annotation key %q: %s: %w",
				annotation, strings.Join(errs, "; "), ErrInvalidHandlers)
		}
		return store{annotation: annotation, where: "annotation " + annotation, bound: annotation}, nil
	}
	// An annotation key never starts with a dot: the two places never bind alike.
	path := strings.Split(statusField, ".")
	for _, f := range path {
		if f == "" {
			return store{}, fmt.Errorf("failed to create handlers: HandlersOptions.StatusField %q has an empty field name: %w",
				statusField, ErrInvalidHandlers)
		}
	}
	return store{field: path, where: "status field .status." + statusField, bound: ".status." + statusField}, nil
}

// stored returns the Record's value on obj, and whether it has one; an error (and true: it
// is reported like a corrupt Record) for a status field that is not a string.
func (s store) stored(obj client.Object) (string, bool, error) {
	if s.field == nil {
		v, ok := obj.GetAnnotations()[s.annotation]
		return v, ok, nil
	}
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return "", true, fmt.Errorf("failed to read progress: %w", err)
	}
	v, ok, err := unstructured.NestedFieldNoCopy(u, append([]string{"status"}, s.field...)...)
	if err != nil || !ok || v == nil {
		return "", false, nil // a status, or one of its parents, that is not an object: none
	}
	str, isString := v.(string)
	if !isString {
		return "", true, fmt.Errorf("failed to decode progress: %s is a %T, not a string", s.where, v)
	}
	return str, true, nil
}

// statusPatch returns the merge patch of the status subresource that sets the field to val,
// with the resourceVersion rv as its optimistic lock ("" for none).
func (s store) statusPatch(val, rv string) ([]byte, error) {
	var v any = val
	for i := len(s.field) - 1; i >= 0; i-- {
		v = map[string]any{s.field[i]: v}
	}
	p := map[string]any{"status": v}
	if rv != "" {
		p["metadata"] = map[string]any{"resourceVersion": rv}
	}
	b, err := json.Marshal(p)
	if err != nil {
		return nil, fmt.Errorf("failed to encode progress: %w", err)
	}
	return b, nil
}

// errFieldDropped is the error of a status patch whose field the object, as the API server
// returned it, lacks: the CRD's schema pruned it, or the Go type has no such field.
var errFieldDropped = errors.New("the object returned lacks the status field: add it, a string, " +
	"to the CRD's schema and the Go type, or unset HandlersOptions.StatusField")

// progressSaveFailures counts Records that could not be saved, process-wide, like
// controller-runtime's own metrics. registerMetrics registers it.
var (
	progressSaveFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quiesce_progress_save_failures_total",
		Help: "Progress records of lifecycle.Handlers that could not be saved, by controller and reason " +
			"(too_large, invalid, forbidden, conflict, error). No handler runs on an object until its record is saved.",
	}, []string{"controller", "reason"})
	registerOnce sync.Once
)

// registerMetrics registers progressSaveFailures in controller-runtime's metrics.Registry,
// once: at the first Handlers, so that a process without Handlers serves no such metric. A
// counter of that name registered already (another copy of this package) is used instead.
func registerMetrics() {
	registerOnce.Do(func() {
		err := metrics.Registry.Register(progressSaveFailures)
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(*prometheus.CounterVec); ok {
				progressSaveFailures = existing
			}
		}
	})
}

// The reasons of quiesce_progress_save_failures_total.
const (
	reasonTooLarge  = "too_large"
	reasonInvalid   = "invalid"
	reasonForbidden = "forbidden"
	reasonConflict  = "conflict"
	reasonError     = "error"
)

// whyNotSaved returns the metric's reason for err, a failed progress patch of obj, and what
// the Event says of it: never the error's text, which the operator's log has. The note is
// the same for every error of a reason and object size, so that the Events fold into a series.
func (s store) whyNotSaved(obj client.Object, err error) (reason, why string) {
	var noStatus *noStatusError
	switch {
	case apierrors.IsConflict(err):
		return reasonConflict, fmt.Sprintf("the object changed before each of %d or more patches in a row "+
			"(someone updates it faster than the operator reads and patches it)", ConflictsToReport)
	case etcdTooLarge(err):
		size := "of unknown size"
		if b, jerr := json.Marshal(obj); jerr == nil {
			size = strconv.Itoa(len(b)) + " bytes as JSON"
		}
		return reasonTooLarge, "the object is too large for the API server's storage (" + size +
			"; anyone who may write it can grow it, with labels for one)"
	case apierrors.IsRequestEntityTooLargeError(err), apierrors.HasStatusCause(err, metav1.CauseTypeTooLong):
		if s.field == nil {
			return reasonTooLarge, "the object is too large (its annotations reach the API server's limit: " +
				"someone else's may fill them)"
		}
		return reasonTooLarge, "the object is too large"
	case errors.Is(err, errFieldDropped):
		return reasonInvalid, "the object has no " + s.where + " (a string) to keep it in"
	case errors.As(err, &noStatus):
		return reasonInvalid, "the kind " + noStatus.kind + " has no status subresource to keep it in"
	case apierrors.IsInvalid(err):
		return reasonInvalid, "the API server refused it as invalid: " + errorClass(err)
	case apierrors.IsForbidden(err):
		return reasonForbidden, "the operator may not patch it: " + errorClass(err)
	default:
		return reasonError, errorClass(err)
	}
}

// etcdTooLarge reports whether err is etcd's refusal of an object over its request limit
// (--max-request-bytes, 1.5 MiB by default), which kube-apiserver passes on as an internal
// error with etcd's text; the texts are those kube-apiserver itself matches (isTooLargeError
// in k8s.io/apiserver/pkg/endpoints/handlers).
func etcdTooLarge(err error) bool {
	var status apierrors.APIStatus
	if !errors.As(err, &status) || status.Status().Code != http.StatusInternalServerError {
		return false
	}
	msg := status.Status().Message
	return strings.Contains(msg, "etcdserver: request is too large") ||
		strings.Contains(msg, "trying to send message larger than max")
}

// noStatusError is the error of a status patch that got a 404 while the object exists: its
// kind has no status subresource.
type noStatusError struct{ kind string }

func (e *noStatusError) Error() string {
	return "the status patch got a 404 while the object exists: " + e.kind + " has no /status subresource: " +
		"add one (a CRD's subresources.status) or unset HandlersOptions.StatusField"
}

// whereTitle is where, capitalized, to start an Event's note.
func (s store) whereTitle() string { return strings.ToUpper(s.where[:1]) + s.where[1:] }
