package claims

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	typedcoordinationv1 "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"

	"github.com/quiesce-dev/quiesce/internal"
)

// ControllerLabel labels each claim with its controller (sanitized to a label value), so that
// `kubectl get leases -l quiesce.dev/claim-controller` lists the claims.
const ControllerLabel = "quiesce.dev/claim-controller"

// ObjectAnnotation holds the claimed object, "<namespace>/<name>", for reading.
const ObjectAnnotation = "quiesce.dev/claim-object"

// ErrHeld is wrapped by Take's error when another replica holds the claim and it has not
// expired by this replica's observation.
var ErrHeld = errors.New("claim held by another replica")

// Options configure a Registry. Every field is required but the On hooks.
type Options struct {
	// Leases is the client of the Leases in the operator's lease namespace.
	Leases typedcoordinationv1.LeaseInterface
	// Identity is this replica's: the leader lease lock's Identity().
	Identity string
	// RenewDeadline: a claim not renewed this long after its last successful write ends its
	// work's context (Bind). RetryPeriod: how often a claim is renewed. The leader lease's.
	RenewDeadline, RetryPeriod time.Duration
	// Clock times renewals, deadlines and observations.
	Clock clock.WithTickerAndDelayedExecution
	// Logger receives the failed renewals and releases.
	Logger logr.Logger
	// OnWaited, OnRenewFailed and OnFenced, if set, count for the metrics, by controller: a
	// Wait that found another replica's claim (its reconcile is requeued), a claim renewal
	// that failed, and a work whose context a claim not renewed ended. They must not block.
	OnWaited, OnRenewFailed, OnFenced func(controller string)
}

// Registry keeps one replica's claims. Make it with New.
type Registry struct {
	o Options

	mu       sync.Mutex
	inFlight map[*Call]struct{}
	taken    map[*Call]struct{}
	seen     map[string]waited   // by claim name: the holder's last write as first seen here
	others   map[string]struct{} // claims of other replicas Wait reads again (list)

	listMu sync.Mutex  // serializes the list
	listed atomic.Bool // the claims were listed
}

// waited is another replica's claim as this replica last read it.
type waited struct {
	observation
	controller, namespace, name string
	until                       time.Time // o.at + the claim's duration
}

// observation is a claim's holder and last write, and when this replica first saw them.
type observation struct {
	holder, renewTime, resourceVersion string
	at                                 time.Time
}

// New returns an empty Registry.
func New(o Options) *Registry {
	return &Registry{o: o, inFlight: map[*Call]struct{}{}, taken: map[*Call]struct{}{},
		seen: map[string]waited{}, others: map[string]struct{}{}}
}

// Name returns the name of the claim of controller on the object namespace/name: a DNS-1123
// subdomain made of "claim-", the controller and the object's name (sanitized, cut to 40
// bytes each), and a hash of all three.
func Name(controller, namespace, name string) string {
	h := sha256.Sum256([]byte(controller + "\x00" + namespace + "\x00" + name))
	return "claim-" + sanitize(controller, 40) + "-" + sanitize(name, 40) + "-" + hex.EncodeToString(h[:5])
}

// sanitize lowers s to [a-z0-9-], runs of other bytes made one "-", at most n bytes, with no
// "-" at either end.
func sanitize(s string, n int) string {
	b := make([]byte, 0, min(len(s), n))
	for i := 0; i < len(s) && len(b) < n; i++ {
		switch c := s[i]; {
		case 'a' <= c && c <= 'z', '0' <= c && c <= '9':
			b = append(b, c)
		case 'A' <= c && c <= 'Z':
			b = append(b, c+'a'-'A')
		case len(b) > 0 && b[len(b)-1] != '-':
			b = append(b, '-')
		}
	}
	return strings.Trim(string(b), "-")
}

// Wait returns how long another replica still holds the object's claim: 0 when there is none,
// it is free or this replica's, or it expired. Its first call lists the claims (a LIST, never
// a cache: the leader's, once it leads); an object whose claim that list or a later read
// found held by another replica is read again with a GET at each call until its claim is
// gone, free or expired; any other object costs no request. A claim is written only by a
// leader, before it hands the lease over, so a claim written after this replica's list is
// one this replica need not honour (docs/design.md, "Handing over").
// Expiry is judged as client-go's elector judges a lease: the claim's duration from when this
// replica first saw its holder's last write (holder, renewTime, resourceVersion), on its own
// clock, never from the holder's renewTime. A claim found expired is deleted (precondition:
// the resourceVersion read), so that a killed holder's claims do not outlive it.
// First is true the first time it finds this holder holding the claim (until the claim is
// gone or held by none or this replica). A claim held counts in OnWaited.
func (r *Registry) Wait(ctx context.Context, controller, namespace, name string) (internal.ClaimWait, error) {
	if err := r.list(ctx); err != nil {
		return internal.ClaimWait{}, err
	}
	n := Name(controller, namespace, name)
	r.mu.Lock()
	_, held := r.others[n]
	r.mu.Unlock()
	if !held {
		return internal.ClaimWait{}, nil
	}
	l, err := r.o.Leases.Get(ctx, n, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		r.forget(n)
		return internal.ClaimWait{}, nil
	case err != nil:
		return internal.ClaimWait{}, fmt.Errorf("failed to read claim %s: %w", n, err)
	}
	left, first := r.left(l, controller, namespace, name)
	if left == 0 {
		r.forget(n)
		if h := ptr.Deref(l.Spec.HolderIdentity, ""); h != "" && h != r.o.Identity {
			r.deleteExpired(ctx, l)
		}
		return internal.ClaimWait{}, nil
	}
	if r.o.OnWaited != nil {
		r.o.OnWaited(controller)
	}
	return internal.ClaimWait{Left: left, Holder: ptr.Deref(l.Spec.HolderIdentity, ""), First: first}, nil
}

// list lists the claims once: those of other replicas are read again by Wait.
func (r *Registry) list(ctx context.Context) error {
	if r.listed.Load() {
		return nil
	}
	r.listMu.Lock()
	defer r.listMu.Unlock()
	if r.listed.Load() {
		return nil
	}
	ls, err := r.o.Leases.List(ctx, metav1.ListOptions{LabelSelector: ControllerLabel})
	if err != nil {
		return fmt.Errorf("failed to list claims: %w", err)
	}
	r.mu.Lock()
	for _, l := range ls.Items {
		if h := ptr.Deref(l.Spec.HolderIdentity, ""); h != "" && h != r.o.Identity {
			r.others[l.Name] = struct{}{}
		}
	}
	r.mu.Unlock()
	r.listed.Store(true)
	return nil
}

// deleteExpired deletes l, a claim that expired by this replica's observation, unless it
// was written since it was read. A failure is logged: the claim is then left alone.
func (r *Registry) deleteExpired(ctx context.Context, l *coordinationv1.Lease) {
	var pre metav1.Preconditions
	if l.ResourceVersion != "" {
		pre.ResourceVersion = &l.ResourceVersion
	}
	err := r.o.Leases.Delete(ctx, l.Name, metav1.DeleteOptions{Preconditions: &pre})
	if err != nil && !apierrors.IsNotFound(err) {
		internal.Safely(func() {
			r.o.Logger.V(1).Info("Failed to delete expired claim", "claim", l.Name, "reason", err.Error())
		})
	}
}

// left is how long l's holder still holds it, by this replica's observation; first: this
// replica had not seen that holder hold it.
func (r *Registry) left(l *coordinationv1.Lease, controller, namespace, name string) (left time.Duration, first bool) {
	holder := ptr.Deref(l.Spec.HolderIdentity, "")
	if holder == "" || holder == r.o.Identity {
		r.forget(l.Name)
		return 0, false
	}
	o := observation{holder: holder, resourceVersion: l.ResourceVersion}
	if t := l.Spec.RenewTime; t != nil {
		o.renewTime = t.UTC().Format(time.RFC3339Nano)
	}
	now := r.o.Clock.Now()
	d := time.Duration(ptr.Deref(l.Spec.LeaseDurationSeconds, 0)) * time.Second
	r.mu.Lock()
	seen, ok := r.seen[l.Name]
	first = !ok || seen.holder != holder
	if o.at = seen.at; !ok || o != seen.observation {
		o.at = now
	}
	r.seen[l.Name] = waited{observation: o, controller: controller, namespace: namespace, name: name, until: o.at.Add(d)}
	r.mu.Unlock()
	return max(0, o.at.Add(d).Sub(now)), first
}

func (r *Registry) forget(name string) {
	r.mu.Lock()
	delete(r.seen, name)
	delete(r.others, name)
	r.mu.Unlock()
}

// Begin registers a reconcile of controller on namespace/name as in flight, until End.
func (r *Registry) Begin(controller, namespace, name, reconcileID string) internal.Claimed {
	c := &Call{Controller: controller, Namespace: namespace, Name: name, ReconcileID: reconcileID,
		r: r, fenced: make(chan struct{})}
	r.mu.Lock()
	r.inFlight[c] = struct{}{}
	r.mu.Unlock()
	return c
}

// InFlight returns the reconciles begun and not ended.
func (r *Registry) InFlight() []*Call {
	r.mu.Lock()
	defer r.mu.Unlock()
	calls := make([]*Call, 0, len(r.inFlight))
	for c := range r.inFlight {
		calls = append(calls, c)
	}
	return calls
}

// Take claims c's object for duration (rounded up to whole seconds), unless c ended, and
// renews the claim every RetryPeriod until c ends. taken reports whether it holds the claim.
// It fails, holding nothing, when the claim cannot be written, or with an error wrapping
// ErrHeld when another replica holds it unexpired. Writes are optimistic (resourceVersion).
func (r *Registry) Take(ctx context.Context, c *Call, duration time.Duration) (taken bool, err error) {
	sent := r.o.Clock.Now() // before c.mu: a fake clock's Step holds its lock while a fence locks nothing
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ended || c.released || c.lease != nil {
		return c.lease != nil, nil
	}
	n := Name(c.Controller, c.Namespace, c.Name)
	now := metav1.NewMicroTime(sent)
	secs := int32((duration + time.Second - 1) / time.Second)
	spec := coordinationv1.LeaseSpec{HolderIdentity: ptr.To(r.o.Identity), LeaseDurationSeconds: &secs,
		AcquireTime: &now, RenewTime: &now}
	meta := metav1.ObjectMeta{Name: n, Labels: map[string]string{ControllerLabel: sanitize(c.Controller, 63)},
		Annotations: map[string]string{ObjectAnnotation: internal.Cut(c.Namespace + "/" + c.Name)}}
	// Create first: a claim exists only where a hand-over or a kill left one.
	l, err := r.o.Leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: meta, Spec: spec}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		if l, err = r.o.Leases.Get(ctx, n, metav1.GetOptions{}); err == nil {
			if r.leftOf(l, c) > 0 {
				holder := ptr.Deref(l.Spec.HolderIdentity, "")
				return false, fmt.Errorf("failed to take claim %s: held by %q: %w", n, holder, ErrHeld)
			}
			l = l.DeepCopy() // keeps its resourceVersion: the update fails if another wrote since
			l.Labels, l.Annotations, l.Spec = meta.Labels, meta.Annotations, spec
			l, err = r.o.Leases.Update(ctx, l, metav1.UpdateOptions{})
		}
	}
	if err != nil {
		return false, fmt.Errorf("failed to take claim %s: %w", n, err)
	}
	c.lease, c.stop, c.renewed = l, make(chan struct{}), make(chan struct{})
	c.takenAt, c.renewedAt = sent, sent
	r.mu.Lock()
	r.taken[c] = struct{}{}
	r.mu.Unlock()
	go r.renew(c, sent)
	return true, nil
}

// leftOf is left for c's claim l.
func (r *Registry) leftOf(l *coordinationv1.Lease, c *Call) time.Duration {
	d, _ := r.left(l, c.Controller, c.Namespace, c.Name)
	return d
}

// Stop stops renewing the claims still held (their work was abandoned: each expires one
// claim duration after its last renewal) and returns once no renewal runs.
func (r *Registry) Stop() {
	r.mu.Lock()
	calls := make([]*Call, 0, len(r.taken))
	for c := range r.taken {
		calls = append(calls, c)
	}
	r.mu.Unlock()
	for _, c := range calls {
		c.stopRenewing()
	}
}

// renew renews c's claim every RetryPeriod until c ends or the renewals fail past
// RenewDeadline from the last one sent that succeeded (sent: the take's); then it fences c.
func (r *Registry) renew(c *Call, sent time.Time) {
	defer close(c.renewed)
	cause := fmt.Errorf("quiesce: claim %s of %s on %s/%s not renewed within %v: "+
		"another replica may reconcile the object once it expires",
		Name(c.Controller, c.Namespace, c.Name), c.Controller, c.Namespace, c.Name, r.o.RenewDeadline)
	fence := func() { c.fence(cause) } // runs under a fake clock's lock: it takes none
	deadline := r.o.Clock.AfterFunc(r.o.RenewDeadline-r.o.Clock.Since(sent), fence)
	defer func() { deadline.Stop() }()
	fenced := func() {
		internal.Safely(func() {
			r.o.Logger.Info("Claim not renewed within its deadline: ending its work", "controller", c.Controller,
				"namespace", c.Namespace, "name", c.Name, "claim", Name(c.Controller, c.Namespace, c.Name))
		})
		if r.o.OnFenced != nil {
			r.o.OnFenced(c.Controller)
		}
		c.notify()
	}
	for {
		t := r.o.Clock.NewTimer(r.o.RetryPeriod)
		select {
		case <-c.stop:
			t.Stop()
			select { // the fence that ended the work, and so stopped the renewals, is reported
			case <-c.fenced:
				fenced()
			default:
			}
			return
		case <-c.fenced:
			t.Stop()
			fenced()
			return
		case <-t.C():
		}
		sent := r.o.Clock.Now()
		c.mu.Lock()
		l := c.lease.DeepCopy()
		c.mu.Unlock()
		if l == nil { // given up
			return
		}
		now := metav1.NewMicroTime(sent)
		l.Spec.RenewTime = &now
		ctx, cancel := context.WithTimeout(context.Background(), r.o.RenewDeadline)
		l, err := r.o.Leases.Update(ctx, l, metav1.UpdateOptions{})
		cancel()
		if err != nil {
			internal.Safely(func() {
				r.o.Logger.V(1).Info("Failed to renew claim", "claim", Name(c.Controller, c.Namespace, c.Name),
					"reason", err.Error())
			})
			if r.o.OnRenewFailed != nil {
				r.o.OnRenewFailed(c.Controller)
			}
			continue
		}
		c.mu.Lock()
		if c.lease != nil {
			c.lease, c.renewedAt = l, sent
		}
		c.mu.Unlock()
		if !deadline.Stop() { // fenced meanwhile: the work's context ended already
			continue
		}
		deadline = r.o.Clock.AfterFunc(r.o.RenewDeadline-r.o.Clock.Since(sent), fence)
	}
}

// Call is one reconcile in flight of a HandOffAtStop controller (Registry.Begin).
type Call struct {
	Controller, Namespace, Name, ReconcileID string

	r *Registry

	fenceOnce sync.Once
	fenced    chan struct{}                           // closed by fence
	cause     atomic.Pointer[error]                   // fence's cause
	cancel    atomic.Pointer[context.CancelCauseFunc] // Bind's
	onFence   atomic.Pointer[func()]                  // Bind's
	notified  sync.Once                               // onFence called

	mu        sync.Mutex
	ended     bool
	released  bool                  // Release gave the claim up
	lease     *coordinationv1.Lease // the claim as last written; nil until taken
	takenAt   time.Time             // when Take sent its write
	renewedAt time.Time             // when the last renewal that succeeded was sent
	stop      chan struct{}         // closed to stop renewing
	stopOnce  sync.Once
	renewed   chan struct{} // closed when the renewals stopped
}

var _ internal.Claimed = (*Call)(nil)

// Bind returns ctx, ended with a cause naming the claim when fence ends the work; then
// onFence, if not nil, is called once, on the renewing goroutine (on Bind's if the fence came
// first): before End returns.
func (c *Call) Bind(ctx context.Context, onFence func()) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	if onFence != nil {
		c.onFence.Store(&onFence)
	}
	c.cancel.Store(&cancel)
	if cause := c.cause.Load(); cause != nil {
		cancel(*cause)
		c.notify()
	}
	return ctx, func() { cancel(nil) }
}

// notify calls Bind's onFence once, if set; a panic in it is recovered.
func (c *Call) notify() {
	fn := c.onFence.Load()
	if fn == nil {
		return
	}
	c.notified.Do(func() {
		internal.Safely(*fn)
	})
}

// fence ends the work's context with cause, once.
func (c *Call) fence(cause error) {
	c.fenceOnce.Do(func() {
		c.cause.Store(&cause)
		close(c.fenced)
		if cancel := c.cancel.Load(); cancel != nil {
			(*cancel)(cause)
		}
	})
}

// stopRenewing stops the renewals of a taken claim and waits for them to stop.
func (c *Call) stopRenewing() {
	c.stopOnce.Do(func() { close(c.stop) })
	<-c.renewed
}

// End marks the reconcile returned and gives its claim up, if taken (see Release). Idempotent.
func (c *Call) End() {
	c.r.mu.Lock()
	delete(c.r.inFlight, c)
	c.r.mu.Unlock()
	c.mu.Lock()
	c.ended = true
	c.mu.Unlock()
	c.Release()
}

// Release gives c's claim up, if taken: it stops renewing it and deletes it (a failed delete
// is logged: the claim then expires by itself). A hand-over that did not happen releases the
// claims it took while their reconciles still run. Idempotent.
func (c *Call) Release() {
	c.mu.Lock()
	giving := c.lease != nil && !c.released
	c.released = c.released || giving
	c.mu.Unlock()
	if !giving {
		return
	}
	c.stopRenewing()
	c.mu.Lock()
	l := c.lease
	c.lease = nil
	c.mu.Unlock()
	c.r.mu.Lock()
	delete(c.r.taken, c)
	c.r.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), c.r.o.RenewDeadline)
	defer cancel()
	var pre metav1.Preconditions
	if l.ResourceVersion != "" { // the claim as this replica wrote it last, not another's
		pre.ResourceVersion = &l.ResourceVersion
	}
	err := c.r.o.Leases.Delete(ctx, l.Name, metav1.DeleteOptions{Preconditions: &pre})
	if err != nil && !apierrors.IsNotFound(err) {
		internal.Safely(func() {
			c.r.o.Logger.Error(err, "Failed to release claim: it expires by itself", "controller", c.Controller,
				"namespace", c.Namespace, "name", c.Name, "claim", l.Name)
		})
	}
}

// Held is a claim this replica holds, as /debug/quiesce shows it.
type Held struct {
	Object     string `json:"object"` // <namespace>/<name>
	Controller string `json:"controller"`
	Claim      string `json:"claim"`
	Since      string `json:"since"`   // how long ago it was taken
	Renewed    string `json:"renewed"` // how long ago its last renewal that succeeded was sent
}

// Waited is another replica's claim this replica waits on, as /debug/quiesce shows it.
type Waited struct {
	Object     string `json:"object"` // <namespace>/<name>
	Controller string `json:"controller"`
	Claim      string `json:"claim"`
	Holder     string `json:"holder"`
	Left       string `json:"left"` // until it expires, by this replica's observation
}

// Held returns the claims this replica holds, oldest first, at most n, and how many it holds.
func (r *Registry) Held(n int) ([]Held, int) {
	r.mu.Lock()
	calls := make([]*Call, 0, len(r.taken))
	for c := range r.taken {
		calls = append(calls, c)
	}
	r.mu.Unlock()
	type held struct {
		c              *Call
		taken, renewed time.Time
	}
	hs := make([]held, 0, len(calls))
	for _, c := range calls {
		c.mu.Lock()
		if c.lease != nil {
			hs = append(hs, held{c, c.takenAt, c.renewedAt})
		}
		c.mu.Unlock()
	}
	slices.SortFunc(hs, func(a, b held) int { return a.taken.Compare(b.taken) })
	now := r.o.Clock.Now()
	out := make([]Held, 0, min(n, len(hs)))
	for _, h := range hs[:min(n, len(hs))] {
		out = append(out, Held{Object: internal.Cut(h.c.Namespace + "/" + h.c.Name), Controller: internal.Cut(h.c.Controller),
			Claim: Name(h.c.Controller, h.c.Namespace, h.c.Name), Since: internal.Age(now.Sub(h.taken)),
			Renewed: internal.Age(now.Sub(h.renewed))})
	}
	return out, len(hs)
}

// Waiting returns the claims of other replicas that this replica's last reads found
// unexpired, the soonest to expire first, at most n, and how many there are.
func (r *Registry) Waiting(n int) ([]Waited, int) {
	now := r.o.Clock.Now()
	type wait struct {
		claim string
		w     waited
	}
	r.mu.Lock()
	ws := make([]wait, 0, len(r.seen))
	for claim, w := range r.seen {
		if w.until.After(now) {
			ws = append(ws, wait{claim, w})
		}
	}
	r.mu.Unlock()
	slices.SortFunc(ws, func(a, b wait) int {
		return cmp.Or(a.w.until.Compare(b.w.until), strings.Compare(a.claim, b.claim))
	})
	out := make([]Waited, 0, min(n, len(ws)))
	for _, w := range ws[:min(n, len(ws))] {
		out = append(out, Waited{Object: internal.Cut(w.w.namespace + "/" + w.w.name),
			Controller: internal.Cut(w.w.controller), Claim: w.claim, Holder: internal.Cut(w.w.holder),
			Left: internal.Age(w.w.until.Sub(now))})
	}
	return out, len(ws)
}
