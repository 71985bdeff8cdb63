package reconcilers

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/quiesce-dev/quiesce/internal"
)

// The reasons of the Events that WithEvents records.
const (
	// ReasonReconcileSlow: a reconcile of the object has been logged as slow (see
	// drain.Options.SlowAfter).
	ReasonReconcileSlow = "ReconcileSlow"
	// ReasonReconcileAbandoned: a reconcile of the object, or a Call inside it, was still
	// running at the end of the grace period; it is cut off when the process exits.
	ReasonReconcileAbandoned = "ReconcileAbandoned"
)

// EventTimeout bounds the Event writes of one "Slow calls" line, and those of the end of
// the grace period: the Runnable's Start returns at most this long after the grace period.
const EventTimeout = 2 * time.Second

// WithEvents records Warning Events on the object of a wrapped reconcile that needs
// attention, so that `kubectl describe` shows them where users look first:
//
//   - ReasonReconcileSlow, when the reconcile (or a Call inside it) is found slow by a
//     "Slow calls" line: once per object for as long as it stays slow. Every slow call
//     counts, not only the 20 the line lists, up to the oldest 100 per line (a bound on
//     the Event writes of one line; a reconcile beyond it gets its Event from a later line
//     once older ones returned);
//   - ReasonReconcileAbandoned, when the runnable.Runnable abandons it at the end of the
//     grace period: written before the Runnable's Start returns, so before mgr.Start does.
//
// Each says the call's age, where it waits and its handler. c reads the object (for its
// UID) and creates the Events (core/v1, the kind kubectl describe lists; kubebuilder's
// scaffold already grants events create and patch); mgr.GetClient() fits. obj is an
// object of the reconciled type (e.g. &cachev1alpha1.Memcached{}), used as a template.
//
// Writes are synchronous and bounded by EventTimeout per batch, so keep
// GracePeriod + EventTimeout within the manager's GracefulShutdownTimeout. A failed write
// is logged once per controller and never delays a drain beyond that bound. WithEvents
// works with reconcile.Request requests only: WrapTyped panics for other request types.
// Calls that are not wrapped reconciles (plain drain calls) record nothing.
func WithEvents(c client.Client, obj client.Object) Option {
	if c == nil || obj == nil {
		panic("reconcilers.WithEvents: nil client or object")
	}
	return func(o *options) {
		o.events = &eventer{c: c, obj: obj}
	}
}

// eventer is the internal.Observer of one wrapped controller with WithEvents.
type eventer struct {
	c          client.Client
	obj        client.Object
	controller string // set by WrapTyped
	failed     sync.Once
}

// eventTag marks the calls of one wrapped reconcile with WithEvents, and its Calls
// (internal.CallOptions.Tag): the reconcile and what it started are one episode, recorded
// as slow at most once.
type eventTag struct {
	ev   *eventer
	key  types.NamespacedName
	slow atomic.Bool // ReasonReconcileSlow recorded
}

// tag returns the Tag of a reconcile of req, a reconcile.Request.
func (ev *eventer) tag(req any) any {
	r, _ := req.(reconcile.Request)
	return &eventTag{ev: ev, key: r.NamespacedName}
}

// mine returns the calls of ev's reconciles among calls, one per object (the innermost
// call, the youngest of them: it says best where the reconcile waits), oldest first, with
// the tags of each object's calls.
func (ev *eventer) mine(calls []internal.Observed) (keys []types.NamespacedName,
	by map[types.NamespacedName]internal.Entry, tags map[types.NamespacedName][]*eventTag) {
	by = map[types.NamespacedName]internal.Entry{}
	tags = map[types.NamespacedName][]*eventTag{}
	for _, c := range calls {
		t, ok := c.Options.Tag.(*eventTag)
		if !ok || t.ev != ev {
			continue
		}
		if _, seen := by[t.key]; !seen {
			keys = append(keys, t.key)
		}
		by[t.key] = c.Entry
		tags[t.key] = append(tags[t.key], t)
	}
	return keys, by, tags
}

// Slow records ReasonReconcileSlow for the objects whose reconcile is newly among the slow
// calls, on a goroutine of its own, bounded by EventTimeout.
func (ev *eventer) Slow(ctx context.Context, calls []internal.Observed) {
	keys, by, tags := ev.mine(calls)
	var fresh []types.NamespacedName
	for _, k := range keys {
		isNew := false
		for _, t := range tags[k] {
			if t.slow.CompareAndSwap(false, true) {
				isNew = true
			}
		}
		if isNew {
			fresh = append(fresh, k)
		}
	}
	if len(fresh) == 0 {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(ctx, EventTimeout)
		defer cancel()
		for _, k := range fresh {
			e := by[k]
			ev.record(ctx, k, ReasonReconcileSlow, fmt.Sprintf(
				"Reconcile running for %s (call %s, reconcileID %s), waiting in %s, handler %s",
				e.Age, e.Name, e.ReconcileID, e.Where, e.Handler))
		}
	}()
}

// Abandoned records ReasonReconcileAbandoned for each object of calls, until ctx ends.
func (ev *eventer) Abandoned(ctx context.Context, calls []internal.Observed) {
	keys, by, _ := ev.mine(calls)
	ctx, cancel := context.WithTimeout(ctx, EventTimeout)
	defer cancel()
	for _, k := range keys {
		e := by[k]
		ev.record(ctx, k, ReasonReconcileAbandoned, fmt.Sprintf(
			"Reconcile abandoned at shutdown after %s (call %s, reconcileID %s), still running in %s, "+
				"handler %s: it is cut off when the process exits and retried by the next leader",
			e.Age, e.Name, e.ReconcileID, e.Where, e.Handler))
	}
}

// record writes one Warning Event about the object key. A failure is logged once.
func (ev *eventer) record(ctx context.Context, key types.NamespacedName, reason, msg string) {
	err := ev.write(ctx, key, reason, msg)
	if err == nil {
		return
	}
	ev.failed.Do(func() {
		logr.FromContextOrDiscard(ctx).Error(err, "Failed to record an Event; later failures are not logged",
			"controller", ev.controller, "namespace", key.Namespace, "name", key.Name, "reason", reason)
	})
}

func (ev *eventer) write(ctx context.Context, key types.NamespacedName, reason, msg string) error {
	obj, ok := ev.obj.DeepCopyObject().(client.Object)
	if !ok {
		return fmt.Errorf("failed to copy %T", ev.obj)
	}
	if err := ev.c.Get(ctx, key, obj); apierrors.IsNotFound(err) {
		return nil // the object is gone: nobody can describe it
	} else if err != nil {
		return fmt.Errorf("failed to get the object: %w", err)
	}
	gvk, err := apiutil.GVKForObject(obj, ev.c.Scheme())
	if err != nil {
		return fmt.Errorf("failed to find the kind of %T: %w", obj, err)
	}
	ns := key.Namespace
	if ns == "" {
		ns = metav1.NamespaceDefault
	}
	now := metav1.Now()
	event := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{GenerateName: strings.ToLower(key.Name) + ".", Namespace: ns},
		InvolvedObject: corev1.ObjectReference{
			Kind: gvk.Kind, APIVersion: gvk.GroupVersion().String(),
			Namespace: key.Namespace, Name: key.Name, UID: obj.GetUID(), ResourceVersion: obj.GetResourceVersion(),
		},
		Reason:         reason,
		Message:        internal.TruncateMessage(msg),
		Type:           corev1.EventTypeWarning,
		Source:         corev1.EventSource{Component: ev.controller},
		FirstTimestamp: now,
		LastTimestamp:  now,
		Count:          1,
	}
	if err := ev.c.Create(ctx, event); err != nil {
		return fmt.Errorf("failed to create Event: %w", err)
	}
	return nil
}
