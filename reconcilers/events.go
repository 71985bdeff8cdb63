package reconcilers

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	"github.com/quiesce-dev/quiesce/internal"
)

// The reasons of the Events recorded through WrapOptions.Recorder: Warning but ReasonClaimWaited.
const (
	ReasonReconcileSlow      = "ReconcileSlow"      // in a "Slow calls" line; once while it stays slow
	ReasonReconcileAbandoned = "ReconcileAbandoned" // still running at the end of the grace period

	// ReasonClaimWaited (Normal): a HandOffAtStop reconcile is requeued because another
	// replica claims the object; once per holder of the claim, by the replica that waits.
	ReasonClaimWaited = "ClaimWaited"
	// ReasonClaimNotRenewed: the claim of a HandOffAtStop reconcile was not renewed within
	// the renew deadline and its context was ended; by the replica that held the claim.
	ReasonClaimNotRenewed = "ClaimNotRenewed"
)

// eventer is the internal.Observer of one controller wrapped with WrapOptions.Recorder.
type eventer struct {
	WrapOptions
	controller string
	failed     sync.Once
}

// where returns a location as Events show it (without file and line unless EventLocations).
func (ev *eventer) where(loc string) string {
	if !ev.EventLocations {
		loc, _, _ = strings.Cut(loc, " (")
	}
	return loc
}

// eventTag marks a reconcile's calls (CallOptions.Tag): one episode, slow at most once.
type eventTag struct {
	ev   *eventer   // nil without WrapOptions.Recorder
	ab   *abandoner // nil without WrapOptions.OnAbandon
	key  types.NamespacedName
	slow atomic.Bool // ReasonReconcileSlow recorded
}

// Slow records ReasonReconcileSlow for objects whose reconcile is newly slow.
func (ev *eventer) Slow(ctx context.Context, calls []internal.Observed) {
	ev.report(ctx, calls, ReasonReconcileSlow,
		"Reconcile running for %s (call %s, reconcileID %s), waiting in %s, handler %s")
}

// Abandoned records ReasonReconcileAbandoned for each object of calls.
func (ev *eventer) Abandoned(ctx context.Context, calls []internal.Observed) {
	ev.report(ctx, calls, ReasonReconcileAbandoned, "Reconcile abandoned at shutdown after %s (call %s, "+
		"reconcileID %s), still running in %s, handler %s: "+
		"it is cut off when the process exits and retried by the next leader")
}

// report records reason once per object of ev's calls, oldest first, naming its innermost
// call (it says best where the reconcile waits); ReasonReconcileSlow once per reconcile.
func (ev *eventer) report(ctx context.Context, calls []internal.Observed, reason, format string) {
	var keys []types.NamespacedName
	by := map[types.NamespacedName]internal.Entry{}
	fresh := map[types.NamespacedName]bool{}
	for _, c := range calls {
		t, ok := c.Options.Tag.(*eventTag)
		if !ok || t.ev != ev {
			continue
		}
		if _, seen := by[t.key]; !seen {
			keys = append(keys, t.key)
		}
		by[t.key] = c.Entry
		if reason != ReasonReconcileSlow || t.slow.CompareAndSwap(false, true) {
			fresh[t.key] = true
		}
	}
	for _, k := range keys {
		if e := by[k]; fresh[k] {
			ev.record(ctx, k, reason, fmt.Sprintf(format, e.Age, e.Name, e.ReconcileID, ev.where(e.Where), ev.where(e.Handler)))
		}
	}
}

// waiting records ReasonClaimWaited on key, claimed as wait says.
func (ev *eventer) waiting(ctx context.Context, key types.NamespacedName, wait internal.ClaimWait) {
	ev.recordType(ctx, key, corev1.EventTypeNormal, ReasonClaimWaited, fmt.Sprintf(
		"Reconcile waiting: the object is claimed by replica %s, finishing its reconcile after handing "+
			"the lease over; it runs once the claim is released or expires (in %s at most)",
		internal.Cut(wait.Holder), internal.Age(wait.Left)))
}

// fenced records ReasonClaimNotRenewed on key, whose reconcile reconcileID was fenced.
func (ev *eventer) fenced(ctx context.Context, key types.NamespacedName, reconcileID string) {
	ev.record(ctx, key, ReasonClaimNotRenewed, fmt.Sprintf("Claim not renewed within its deadline: "+
		"the context of reconcile %s was ended; the next leader reconciles the object once the claim expires",
		reconcileID))
}

// record hands a Warning Event on key to the recorder; a failed read is logged once.
func (ev *eventer) record(ctx context.Context, key types.NamespacedName, reason, msg string) {
	ev.recordType(ctx, key, corev1.EventTypeWarning, reason, msg)
}

// recordType hands an Event of type typ on key to the recorder; a failed read is logged once.
func (ev *eventer) recordType(ctx context.Context, key types.NamespacedName, typ, reason, msg string) {
	regarding, err := ev.regarding(ctx, key)
	if err != nil {
		ev.failed.Do(func() {
			logr.FromContextOrDiscard(ctx).Error(err, "Failed to record an Event; later failures are not logged",
				"controller", ev.controller, "namespace", key.Namespace, "name", key.Name, "reason", reason)
		})
		return
	}
	if regarding == nil {
		return // the object is gone: nobody can describe it
	}
	ev.Recorder.Eventf(regarding, nil, typ, reason, "Reconcile", "%s", internal.TruncateMessage(msg))
}

// regarding returns the Event's regarding object: a reference with kind and UID, or the
// object itself without a scheme; nil once the object is gone.
func (ev *eventer) regarding(ctx context.Context, key types.NamespacedName) (runtime.Object, error) {
	obj, ok := ev.Object.DeepCopyObject().(client.Object)
	if !ok {
		return nil, fmt.Errorf("failed to copy %T", ev.Object)
	}
	if err := ev.Reader.Get(ctx, key, obj); apierrors.IsNotFound(err) {
		return nil, nil
	} else if err != nil {
		return nil, fmt.Errorf("failed to get the object: %w", err)
	}
	gvk := obj.GetObjectKind().GroupVersionKind()
	if s, ok := ev.Reader.(interface{ Scheme() *runtime.Scheme }); ok && s.Scheme() != nil {
		var err error
		if gvk, err = apiutil.GVKForObject(obj, s.Scheme()); err != nil {
			return nil, fmt.Errorf("failed to find the kind of %T: %w", obj, err)
		}
	}
	if gvk.Empty() {
		return obj, nil
	}
	return &corev1.ObjectReference{
		Kind: gvk.Kind, APIVersion: gvk.GroupVersion().String(),
		Namespace: key.Namespace, Name: key.Name, UID: obj.GetUID(), ResourceVersion: obj.GetResourceVersion(),
	}, nil
}
