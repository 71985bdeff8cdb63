package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/internal"
)

// redactedSuffix ends what Handlers publishes of an error unless
// HandlersOptions.PublishErrors is set.
const redactedSuffix = " (details in the operator's log)"

// published returns what the annotation and the Events say of a handler's error: its
// class, or with PublishErrors its text cut to internal.MaxMessageBytes.
func (o *HandlersOptions) published(err error) string {
	if o.PublishErrors {
		return internal.TruncateMessage(err.Error())
	}
	return errorClass(err) + redactedSuffix
}

// errorClass returns what Handlers publishes of a handler's error by default, in place of
// its text: its class, never a word of its message, which may hold URLs, response bodies or
// tokens. It is, in order:
//
//   - for an API error (apierrors.APIStatus): its reason and HTTP status,
//     "Forbidden (HTTP 403)", or its HTTP status alone, "HTTP 418", for a reason that is not
//     one of metav1.StatusReason's constants (any server or webhook may send any text there);
//   - for a context's end: "context deadline exceeded" or "context canceled";
//   - for a panic (*drain.PanicError): "panic";
//   - otherwise the type of the outermost error in its chain that is not a plain wrapper
//     (fmt.Errorf, errors.New, errors.Join): "*url.Error", or "error" if all are;
//
// prefixed by "terminal error: " for a reconcile.TerminalError. The result is short and
// stable: the same failure gives the same class at every retry.
func errorClass(err error) string {
	if errors.Is(err, reconcile.TerminalError(nil)) {
		return "terminal error: " + classOf(errors.Unwrap(err))
	}
	return classOf(err)
}

func classOf(err error) string {
	var status apierrors.APIStatus
	var pe *drain.PanicError
	switch {
	case err == nil:
		return "error"
	case errors.As(err, &status):
		st := status.Status()
		if !knownReasons[st.Reason] { // the reason is the server's (or a webhook's) to write
			return "HTTP " + strconv.Itoa(int(st.Code))
		}
		return string(st.Reason) + " (HTTP " + strconv.Itoa(int(st.Code)) + ")"
	case errors.Is(err, context.DeadlineExceeded):
		return context.DeadlineExceeded.Error()
	case errors.Is(err, context.Canceled):
		return context.Canceled.Error()
	case errors.As(err, &pe):
		return "panic"
	}
	for e := err; e != nil; e = errors.Unwrap(e) {
		if t := fmt.Sprintf("%T", e); !plainWrappers[t] {
			return t
		}
	}
	return "error"
}

// knownReasons are metav1.StatusReason's constants but the empty one: the only reasons
// errorClass publishes.
var knownReasons = map[metav1.StatusReason]bool{
	metav1.StatusReasonUnauthorized: true, metav1.StatusReasonForbidden: true, metav1.StatusReasonNotFound: true,
	metav1.StatusReasonAlreadyExists: true, metav1.StatusReasonConflict: true, metav1.StatusReasonGone: true,
	metav1.StatusReasonInvalid: true, metav1.StatusReasonServerTimeout: true, metav1.StatusReasonStoreReadError: true,
	metav1.StatusReasonTimeout: true, metav1.StatusReasonTooManyRequests: true, metav1.StatusReasonBadRequest: true,
	metav1.StatusReasonMethodNotAllowed: true, metav1.StatusReasonNotAcceptable: true,
	metav1.StatusReasonRequestEntityTooLarge: true, metav1.StatusReasonUnsupportedMediaType: true,
	metav1.StatusReasonInternalError: true, metav1.StatusReasonExpired: true,
	metav1.StatusReasonServiceUnavailable: true,
}

// plainWrappers are the error types that say nothing but their text.
var plainWrappers = map[string]bool{
	"*errors.errorString": true,
	"*errors.joinError":   true,
	"*fmt.wrapError":      true,
	"*fmt.wrapErrors":     true,
}
