package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
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
//     "Forbidden (HTTP 403)";
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
		if st.Reason == "" {
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

// plainWrappers are the error types that say nothing but their text.
var plainWrappers = map[string]bool{
	"*errors.errorString": true,
	"*errors.joinError":   true,
	"*fmt.wrapError":      true,
	"*fmt.wrapErrors":     true,
}
