//go:build realnode

package realnode_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
)

// observer records, for one namespace, what the node does to the operator's pods (as the
// API shows it: readiness, deletion, the container's end) and their EndpointSlice entries, and
// follows each pod's log from its container's start to its end through the kubelet.
type observer struct {
	ns     string
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	pods     map[string]*podRecord
	leaseID  string      // the operator's leader election Lease
	holders  []string    // the lease's holders in turn (pod names)
	heldFrom []time.Time // when each of holders was first seen holding it
}

// podRecord is one pod's story; times are when the observer saw each change.
type podRecord struct {
	Name       string
	ReadyAt    time.Time // first Ready=True
	SigtermAt  time.Time // when the deletion was seen: the kubelet sends SIGTERM on the same update
	NotReadyAt time.Time // first Ready=False after SigtermAt, while the container still ran
	NotServing time.Time // first EndpointSlice entry with serving=false after SigtermAt, the container still running
	Terminated *corev1.ContainerStateTerminated
	EndedAt    time.Time // when Terminated was first seen (its finishedAt has whole seconds only)
	Gone       bool      // deleted from the API

	following bool
	logErr    error // why the log could not be followed
	logDone   chan struct{}
	lines     []map[string]any
}

// observe starts observing ns, the lease of examples/rollout's operator its leader election
// Lease; stop ends it.
func observe(ns string) *observer { return observeLease(ns, "rollout-operator") }

// observeLease is observe for an operator whose leader election Lease is named leaseID.
func observeLease(ns, leaseID string) *observer {
	ctx, cancel := context.WithCancel(context.Background())
	o := &observer{ns: ns, cancel: cancel, pods: map[string]*podRecord{}, leaseID: leaseID}
	f := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(ns))
	pods := f.Core().V1().Pods().Informer()
	_, _ = pods.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { o.pod(ctx, obj, false) },
		UpdateFunc: func(_, obj any) { o.pod(ctx, obj, false) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			o.pod(ctx, obj, true)
		},
	})
	eps := f.Discovery().V1().EndpointSlices().Informer()
	_, _ = eps.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { o.slice(obj) },
		UpdateFunc: func(_, obj any) { o.slice(obj) },
	})
	leases := f.Coordination().V1().Leases().Informer()
	_, _ = leases.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { o.lease(obj) },
		UpdateFunc: func(_, obj any) { o.lease(obj) },
	})
	o.wg.Go(func() { f.Start(ctx.Done()); <-ctx.Done(); f.Shutdown() })
	return o
}

func (o *observer) record(name string) *podRecord {
	r := o.pods[name]
	if r == nil {
		r = &podRecord{Name: name, logDone: make(chan struct{})}
		o.pods[name] = r
	}
	return r
}

func (o *observer) pod(ctx context.Context, obj any, deleted bool) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	now := time.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	r := o.record(p.Name)
	ready := podReady(p)
	if ready && r.ReadyAt.IsZero() {
		r.ReadyAt = now
	}
	// deletionTimestamp has whole seconds only: the time it was seen is closer.
	if p.DeletionTimestamp != nil && r.SigtermAt.IsZero() {
		r.SigtermAt = now
	}
	for _, s := range p.Status.ContainerStatuses {
		if s.State.Terminated != nil {
			r.Terminated = s.State.Terminated.DeepCopy()
			if r.EndedAt.IsZero() {
				r.EndedAt = now
			}
		}
		if !r.SigtermAt.IsZero() && !ready && s.State.Running != nil && r.NotReadyAt.IsZero() && !r.ReadyAt.IsZero() {
			r.NotReadyAt = now
		}
		// The operator's container only: a pod of the operator's work has others.
		if s.State.Running != nil && !r.following && s.Name == appName {
			r.following = true
			o.wg.Go(func() { o.follow(ctx, r) })
		}
	}
	if deleted {
		r.Gone = true
	}
}

// lease records each new holder of the operator's lease (controller-runtime's identity is
// "<pod name>_<uuid>"); other Leases (HandOffAtStop's claims) are not the operator's lease.
func (o *observer) lease(obj any) {
	l, ok := obj.(*coordinationv1.Lease)
	if !ok || l.Name != o.leaseID || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" {
		return
	}
	pod, _, _ := strings.Cut(*l.Spec.HolderIdentity, "_")
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.holders) == 0 || o.holders[len(o.holders)-1] != pod {
		o.holders = append(o.holders, pod)
		o.heldFrom = append(o.heldFrom, time.Now())
	}
}

// heldSince is when pod was first seen holding the lease; zero if never.
func (o *observer) heldSince(pod string) time.Time {
	o.mu.Lock()
	defer o.mu.Unlock()
	if i := slices.Index(o.holders, pod); i >= 0 {
		return o.heldFrom[i]
	}
	return time.Time{}
}

// leaseHolders returns the lease's holders in turn.
func (o *observer) leaseHolders() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.holders)
}

func (o *observer) slice(obj any) {
	s, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return
	}
	now := time.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, e := range s.Endpoints {
		if e.TargetRef == nil {
			continue
		}
		r := o.record(e.TargetRef.Name)
		if !r.SigtermAt.IsZero() && r.Terminated == nil && r.NotServing.IsZero() && e.Conditions.Serving != nil && !*e.Conditions.Serving {
			r.NotServing = now
		}
	}
}

// follow streams r's log, through the API server and the kubelet, until the container ends
// (the stream's EOF) or the observer stops.
func (o *observer) follow(ctx context.Context, r *podRecord) {
	defer close(r.logDone)
	var stream io.ReadCloser
	var last error
	// The stream lives on the observer's context, not the poll's (which ends when it returns).
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		stream, last = cs.CoreV1().Pods(o.ns).GetLogs(r.Name, &corev1.PodLogOptions{Container: appName, Follow: true}).Stream(ctx)
		return last == nil, nil
	})
	if err != nil {
		o.mu.Lock()
		r.logErr = errors.Join(err, last)
		o.mu.Unlock()
		return
	}
	defer func() { _ = stream.Close() }()
	stop := context.AfterFunc(ctx, func() { _ = stream.Close() })
	defer stop()
	br := bufio.NewReader(stream)
	for {
		line, err := br.ReadString('\n')
		if line = strings.TrimSpace(line); line != "" {
			var e map[string]any
			if json.Unmarshal([]byte(line), &e) != nil {
				e = map[string]any{"msg": line, "raw": true}
			}
			o.mu.Lock()
			r.lines = append(r.lines, e)
			o.mu.Unlock()
		}
		if err != nil {
			return
		}
	}
}

// waitLogs waits until the logs of the pods named end (their containers ended), bounded by ctx.
func (o *observer) waitLogs(ctx context.Context, names ...string) error {
	for _, n := range names {
		o.mu.Lock()
		r := o.pods[n]
		o.mu.Unlock()
		if r == nil {
			return errors.New("no pod " + n)
		}
		select {
		case <-r.logDone:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// stop ends the observation and its log streams, and waits for them.
func (o *observer) stop() {
	o.cancel()
	o.wg.Wait()
}

// snapshot returns a copy of every pod's record, by name.
func (o *observer) snapshot() map[string]podRecord {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make(map[string]podRecord, len(o.pods))
	for n, r := range o.pods {
		c := *r
		c.lines = slices.Clone(r.lines)
		out[n] = c
	}
	return out
}

// count is how many of r's log lines have the message msg.
func (r podRecord) count(msg string) int {
	n := 0
	for _, e := range r.lines {
		if m, _ := e["msg"].(string); strings.EqualFold(m, msg) {
			n++
		}
	}
	return n
}

// has says whether a log line's message contains text (any case).
func (r podRecord) has(text string) bool {
	for _, e := range r.lines {
		if m, _ := e["msg"].(string); strings.Contains(strings.ToLower(m), strings.ToLower(text)) {
			return true
		}
	}
	return false
}

// reconcile is one "Reconcile ended" line of the operator.
type reconcile struct {
	pod          string
	object       string // the ConfigMap's name (controller-runtime's "name" key)
	start, end   time.Time
	worked, done bool
	err          string
}

func (r podRecord) reconciles() []reconcile {
	var out []reconcile
	for _, e := range r.lines {
		if e["msg"] != "Reconcile ended" {
			continue
		}
		s, _ := e["start"].(string)
		t, _ := e["end"].(string)
		start, err1 := time.Parse(time.RFC3339Nano, s)
		end, err2 := time.Parse(time.RFC3339Nano, t)
		if err1 != nil || err2 != nil {
			continue
		}
		w, _ := e["worked"].(bool)
		d, _ := e["done"].(bool)
		msg, _ := e["error"].(string)
		obj, _ := e["name"].(string)
		out = append(out, reconcile{pod: r.Name, object: obj, start: start, end: end, worked: w, done: d, err: msg})
	}
	return out
}

// exitCode is the container's exit code as the kubelet reported it; -1 when unknown.
func (r podRecord) exitCode() int {
	if r.Terminated == nil {
		return -1
	}
	return int(r.Terminated.ExitCode)
}
