package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Names shared with examples/rollout/operator, for the single-replica case.
const (
	reconcileWorking = "Reconcile working"
	ownWriteAdmitted = "Admitted own write"
)

// singleTimelineSteps are the timeline of a stop with no ShutdownDelay: the drain begins at
// SIGTERM, and the webhooks, which admit the reconciles' own writes, stop after it.
var singleTimelineSteps = []string{stepStopBegan, stepDraining, stepReturned, stepWebhookStopped}

// single is the single-replica case of issue 22: one replica, no ShutdownDelay, whose
// reconciles write objects that its own webhook validates (--self-write), stopped with
// SIGTERM while its reconciles work.
type single struct{ stage }

func (s *single) args(ns string) []string {
	return append(s.stage.args(ns, 0, s.cfg.SingleWork),
		"--self-write", "--max-concurrent-reconciles="+strconv.Itoa(s.cfg.SingleObjects))
}

// singleResult is what one single-replica run measured.
type singleResult struct {
	Mode      string
	Objects   int       // ConfigMaps created before SIGTERM
	SignalAt  time.Time // when the replica got SIGTERM
	ExitCode  int
	ExitAfter time.Duration // from SIGTERM to its exit

	InFlight int // reconciles working when SIGTERM came (when the replica's stop began)
	Finished int // of those, the ones that wrote DoneAnnotation
	CutOff   int // reconciles whose work ended unfinished
	// Own writes (UPDATEs adding DoneAnnotation) that the replica's own webhook admitted
	// after SIGTERM, and of those, during the drain (from "Draining executor" to "All calls
	// returned"; quiesce only).
	OwnWrites, OwnWritesInDrain int
	Unreconciled                int      // ConfigMaps without DoneAnnotation once it exited
	Errors                      []string // the first distinct errors of its reconciles
	Timeline                    []step
	story                       []event
}

// play runs the single-replica case and measures it; it returns an error when it could not run.
func (s *single) play(ctx context.Context) (*singleResult, error) {
	mode := s.mode()
	ns, name := "single-"+mode, "single-"+mode
	svc, err := s.setUp(ctx, ns)
	if err != nil {
		return nil, err
	}
	defer func() { _ = svc.Close() }()
	a, err := s.startReplica(ctx, svc, name, s.args(ns), 0, true)
	if err != nil {
		return nil, err
	}
	defer a.Kill()

	// The objects, at once, so that their reconciles work together.
	n := s.cfg.SingleObjects
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
				Name: fmt.Sprintf("cm-%05d", i), Namespace: ns, Labels: map[string]string{labelKey: mode},
			}}
			errs[i] = s.c.Create(ctx, cm)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("failed to create the ConfigMaps: %w", err)
	}
	if err := a.waitFor(ctx, reconcileWorking, n); err != nil {
		return nil, err
	}
	s.say("%s: %d reconciles working; sending it SIGTERM", a.name, n)
	stopped, signalAt, err := a.stop(ctx)
	if err != nil {
		return nil, err
	}
	res := &singleResult{Mode: mode, Objects: n, SignalAt: signalAt, ExitAfter: stopped.Took, ExitCode: stopped.ExitCode}
	s.say("%s exited with code %d, %s after SIGTERM", a.name, res.ExitCode, res.ExitAfter.Round(time.Millisecond))

	var l corev1.ConfigMapList
	if err := s.c.List(ctx, &l, client.InNamespace(ns), client.HasLabels{labelKey}); err != nil {
		return nil, fmt.Errorf("failed to list the ConfigMaps: %w", err)
	}
	for _, cm := range l.Items {
		if _, ok := cm.Annotations[doneAnnotation]; !ok {
			res.Unreconciled++
		}
	}
	res.measure(entries(stopped.Lines), poolEvents(svc, res.SignalAt, res.SignalAt.Add(res.ExitAfter), a))
	for _, l := range res.Story() {
		s.say("%s", l)
	}
	return res, nil
}

// measure fills res from the replica's log entries and the Service's pool events.
func (res *singleResult) measure(entries []map[string]any, pool []poolEvent) {
	add := func(at time.Time, format string, args ...any) {
		res.story = append(res.story, event{at.Sub(res.SignalAt), fmt.Sprintf(format, args...)})
	}
	name := "single-" + res.Mode
	add(res.SignalAt, "%s gets SIGTERM", name)
	add(res.SignalAt.Add(res.ExitAfter), "%s exits with code %d", name, res.ExitCode)
	for _, e := range pool {
		add(e.At, "router: %s %s the pool", e.Replica, map[bool]string{true: "joins", false: "leaves"}[e.In])
	}
	// A reconcile is in flight, and a write after the stop, by the replica's own clock when
	// it logged "Stop began" (quiesce): a write between the runner's SIGTERM and the
	// replica's first line is not the drain's. Otherwise by the runner's SIGTERM.
	ref := res.SignalAt
	for _, e := range entries {
		if e["msg"] == stepStopBegan {
			ref = entryTime(e)
			break
		}
	}
	var drainFrom, drainTo time.Time
	var writes []time.Time
	var last time.Time
	for _, e := range entries {
		msg, _ := e["msg"].(string)
		if d, ok := e["sinceStop"]; ok {
			res.Timeline = append(res.Timeline, step{Msg: msg, SinceStop: d})
			add(entryTime(e), "%s: %q sinceStop=%v", name, msg, d)
			switch msg {
			case stepDraining:
				drainFrom = entryTime(e)
			case stepReturned:
				drainTo = entryTime(e)
			}
		}
		if msg == ownWriteAdmitted {
			if at := entryTime(e); !at.Before(ref) {
				writes = append(writes, at)
			}
		}
		r, ok := parseReconcile(e)
		if !ok {
			continue
		}
		last = maxTime(last, r.end)
		if r.worked && r.start.Before(ref) && r.end.After(ref) {
			res.InFlight++
			if r.done {
				res.Finished++
			}
		}
		if r.worked && !r.done {
			res.CutOff++
		}
		if em, _ := e["error"].(string); em != "" && len(res.Errors) < 3 && !slices.Contains(res.Errors, em) {
			res.Errors = append(res.Errors, em)
		}
	}
	res.OwnWrites = len(writes)
	for _, at := range writes {
		if !drainFrom.IsZero() && !drainTo.IsZero() && !at.Before(drainFrom) && !at.After(drainTo) {
			res.OwnWritesInDrain++
		}
	}
	if len(writes) > 0 {
		add(writes[0], "%s: its webhook admits the first of %d own write(s) after SIGTERM", name, len(writes))
		add(writes[len(writes)-1], "%s: its webhook admits the last of them", name)
	}
	if !last.IsZero() {
		add(last, "%s: its last reconcile ends", name)
	}
	slices.SortStableFunc(res.story, func(x, y event) int { return int(x.at - y.at) })
}

// Story is the stop, one line per step, offsets from SIGTERM.
func (res *singleResult) Story() []string {
	lines := make([]string, 0, len(res.story))
	for _, e := range res.story {
		lines = append(lines, fmt.Sprintf("  %+8.3fs  %s", e.at.Seconds(), e.what))
	}
	return lines
}

// check returns an error unless the single-replica run kept every promise of quiesce:
// every reconcile in flight at SIGTERM finished, its write admitted by the replica's own
// webhook during the drain, nothing left unreconciled, the timeline in order, exit 0.
func (res *singleResult) check() error {
	var errs []error
	if res.InFlight == 0 {
		errs = append(errs, errors.New("no reconcile was in flight at SIGTERM: the run proves nothing"))
	}
	if res.Finished != res.InFlight {
		errs = append(errs, fmt.Errorf("%d of %d reconciles in flight at SIGTERM finished", res.Finished, res.InFlight))
	}
	if res.CutOff > 0 {
		errs = append(errs, fmt.Errorf("%d reconciles were cut off: %q", res.CutOff, res.Errors))
	}
	if res.OwnWritesInDrain < res.InFlight {
		errs = append(errs, fmt.Errorf("the webhook admitted %d own writes during the drain, want one per "+
			"reconcile in flight at SIGTERM (%d)", res.OwnWritesInDrain, res.InFlight))
	}
	if res.Unreconciled > 0 {
		errs = append(errs, fmt.Errorf("%d of %d ConfigMaps were left unreconciled", res.Unreconciled, res.Objects))
	}
	if res.ExitCode != 0 {
		errs = append(errs, fmt.Errorf("the replica exited with code %d", res.ExitCode))
	}
	if err := checkSteps(res.Timeline, singleTimelineSteps); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// singleTable prints the single-replica runs side by side.
func singleTable(runs []*singleResult) string {
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	row := func(name string, f func(r *singleResult) string) {
		cells := make([]string, 0, 1+len(runs))
		cells = append(cells, name)
		for _, r := range runs {
			cells = append(cells, f(r))
		}
		_, _ = fmt.Fprintln(w, strings.Join(cells, "\t")) // a strings.Builder: no error
	}
	row("", func(r *singleResult) string { return r.Mode })
	row("ConfigMaps created before SIGTERM", func(r *singleResult) string { return fmt.Sprint(r.Objects) })
	row("reconciles in flight at SIGTERM", func(r *singleResult) string { return fmt.Sprint(r.InFlight) })
	row("of those, finished (own write made)", func(r *singleResult) string { return fmt.Sprint(r.Finished) })
	row("reconciles cut off", func(r *singleResult) string { return fmt.Sprint(r.CutOff) })
	row("own writes admitted by its webhook after SIGTERM", func(r *singleResult) string {
		return fmt.Sprint(r.OwnWrites)
	})
	row("of those, during the drain", func(r *singleResult) string {
		if len(r.Timeline) == 0 {
			return "-"
		}
		return fmt.Sprint(r.OwnWritesInDrain)
	})
	row("ConfigMaps left unreconciled at exit", func(r *singleResult) string { return fmt.Sprint(r.Unreconciled) })
	row("exit code", func(r *singleResult) string { return fmt.Sprint(r.ExitCode) })
	row("exits after SIGTERM", func(r *singleResult) string { return r.ExitAfter.Round(time.Millisecond).String() })
	row("reconcile errors", func(r *singleResult) string {
		if len(r.Errors) == 0 {
			return "none"
		}
		return strings.Join(r.Errors, "; ")
	})
	_ = w.Flush()
	return b.String()
}
