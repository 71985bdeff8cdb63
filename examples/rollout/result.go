package main

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/quiesce-dev/quiesce/shutdowntest"
)

// result is what one run measured.
type result struct {
	Mode      string
	SignalAt  time.Time     // when the first leader got SIGTERM
	EndAt     time.Time     // when the client stopped creating
	ExitCode  int           // the first leader's
	ExitAfter time.Duration // from SIGTERM to its exit
	Lost      int           // ConfigMaps never reconciled to completion
	By        map[string]int

	Creates, Failed    int
	Conns, ConnsFailed int           // connections the Service accepted, and those it could not forward
	Errors             []string      // the first distinct errors of failed creates
	P50, P99, Max      time.Duration // latency of the creates (the webhook call included) from SIGTERM to EndAt

	InFlight int           // the first leader's reconciles working when SIGTERM came
	CutOff   int           // its reconciles whose work ended unfinished
	Overlaps int           // the new leader's reconciles that began before the old one's last ended
	Gap      time.Duration // from SIGTERM to the new leader's first reconcile
	Timeline []step        // the first leader's lines with "sinceStop", in log order
	story    []event

	creates []create
}

type step struct {
	Msg       string
	SinceStop any
}

type event struct {
	at   time.Duration
	what string
}

type reconcile struct {
	start, end   time.Time
	worked, done bool
}

// measure fills res from the replicas' log entries and the Service's pool events.
func (res *result) measure(a, b []map[string]any, pool []poolEvent) {
	add := func(at time.Time, format string, args ...any) {
		res.story = append(res.story, event{at.Sub(res.SignalAt), fmt.Sprintf(format, args...)})
	}
	add(res.SignalAt, "%s-a gets SIGTERM", res.Mode)
	add(res.SignalAt.Add(res.ExitAfter), "%s-a exits with code %d", res.Mode, res.ExitCode)
	for _, e := range pool {
		add(e.At, "router: %s %s the pool", e.Replica, map[bool]string{true: "joins", false: "leaves"}[e.In])
	}

	var lastA time.Time
	for _, e := range a {
		if d, ok := e["sinceStop"]; ok {
			msg, _ := e["msg"].(string)
			res.Timeline = append(res.Timeline, step{Msg: msg, SinceStop: d})
			add(entryTime(e), "%s-a: %q sinceStop=%v", res.Mode, msg, d)
		}
		r, ok := parseReconcile(e)
		if !ok {
			continue
		}
		lastA = maxTime(lastA, r.end)
		if r.worked && r.start.Before(res.SignalAt) && r.end.After(res.SignalAt) {
			res.InFlight++
		}
		if r.worked && !r.done {
			res.CutOff++
		}
	}
	var firstB time.Time
	for _, e := range b {
		if msg, _ := e["msg"].(string); strings.Contains(strings.ToLower(msg), strings.ToLower(shutdowntest.LeaseAcquired)) {
			add(entryTime(e), "%s-b: %q", res.Mode, msg)
		}
		r, ok := parseReconcile(e)
		if !ok {
			continue
		}
		if firstB.IsZero() || r.start.Before(firstB) {
			firstB = r.start
		}
		if r.start.Before(lastA) {
			res.Overlaps++
		}
	}
	add(lastA, "%s-a: its last reconcile ends", res.Mode)
	if !firstB.IsZero() {
		res.Gap = firstB.Sub(res.SignalAt)
		add(firstB, "%s-b: its first reconcile starts (handover gap)", res.Mode)
	}

	var lat []time.Duration
	for _, c := range res.creates {
		res.Creates++
		if c.err != nil {
			res.Failed++
			if msg := c.err.Error(); len(res.Errors) < 3 && !slices.Contains(res.Errors, msg) {
				res.Errors = append(res.Errors, msg)
			}
		}
		if !c.start.Before(res.SignalAt) {
			lat = append(lat, c.took)
		}
	}
	slices.Sort(lat)
	// The slowest creates, in the story: when they began, how long they took.
	slow := slices.Clone(res.creates)
	slices.SortFunc(slow, func(x, y create) int { return int(y.took - x.took) })
	for _, c := range slow[:min(3, len(slow))] {
		if !c.start.Before(res.SignalAt) && c.took > 10*s0(lat) {
			add(c.start, "a create begins that takes %s (err: %v)", c.took.Round(time.Millisecond), c.err)
		}
	}
	slices.SortStableFunc(res.story, func(x, y event) int { return int(x.at - y.at) })
	if n := len(lat); n > 0 {
		res.P50, res.P99, res.Max = lat[n/2], lat[(n*99)/100], lat[n-1]
	}
}

// s0 is the median of sorted, or 0.
func s0(sorted []time.Duration) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[len(sorted)/2]
}

func parseReconcile(e map[string]any) (reconcile, bool) {
	if e["msg"] != reconcileEnded {
		return reconcile{}, false
	}
	var r reconcile
	var err1, err2 error
	s, _ := e["start"].(string)
	r.start, err1 = time.Parse(time.RFC3339Nano, s)
	s, _ = e["end"].(string)
	r.end, err2 = time.Parse(time.RFC3339Nano, s)
	r.worked, _ = e["worked"].(bool)
	r.done, _ = e["done"].(bool)
	return r, err1 == nil && err2 == nil
}

func entryTime(e map[string]any) time.Time {
	s, _ := e["ts"].(string)
	t, _ := time.Parse(time.RFC3339Nano, s)
	return t
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// Story is the rollout, from SIGTERM on, one line per step, offsets from SIGTERM.
func (res *result) Story() []string {
	lines := make([]string, 0, len(res.story))
	for _, e := range res.story {
		lines = append(lines, fmt.Sprintf("  %+8.3fs  %s", e.at.Seconds(), e.what))
	}
	return lines
}

// check returns an error unless the run kept every promise of quiesce.
func (res *result) check() error {
	var errs []error
	if res.Failed > 0 {
		errs = append(errs, fmt.Errorf("%d of %d creates failed: %v", res.Failed, res.Creates, res.Errors))
	}
	if res.Lost > 0 {
		errs = append(errs, fmt.Errorf("%d ConfigMaps were never reconciled", res.Lost))
	}
	if res.Overlaps > 0 {
		errs = append(errs, fmt.Errorf("%d reconciles of the new leader began before the old leader's last ended",
			res.Overlaps))
	}
	if res.ExitCode != 0 {
		errs = append(errs, fmt.Errorf("the old leader exited with code %d", res.ExitCode))
	}
	if res.InFlight == 0 {
		errs = append(errs, errors.New("no reconcile was in flight at SIGTERM: the run proves nothing"))
	}
	if res.CutOff > 0 {
		errs = append(errs, fmt.Errorf("%d reconciles of the old leader were cut off", res.CutOff))
	}
	if res.Gap <= 0 {
		errs = append(errs, errors.New("the new leader never reconciled"))
	}
	if err := checkTimeline(res.Timeline); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// checkTimeline: the timeline has the expected steps, in order, their sinceStop never
// decreasing: the webhook server stops after the drain.
func checkTimeline(steps []step) error { return checkSteps(steps, timelineSteps) }

// checkSteps: steps are want, in order, their sinceStop never decreasing; the drain's reports
// may come between them.
func checkSteps(steps []step, want []string) error {
	var msgs []string
	prev := time.Duration(-1)
	for _, s := range steps {
		d, err := sinceStop(s.SinceStop)
		if err != nil {
			return fmt.Errorf("timeline line %q: %w", s.Msg, err)
		}
		if d < prev {
			return fmt.Errorf("timeline out of order: %q at sinceStop=%v after a later step", s.Msg, s.SinceStop)
		}
		prev = d
		if s.Msg != stepReport { // the drain's reports: as many as the drain's length allows
			msgs = append(msgs, s.Msg)
		}
	}
	if !slices.Equal(msgs, want) {
		return fmt.Errorf("timeline steps = %q, want %q", msgs, want)
	}
	return nil
}

// sinceStop reads a sinceStop value: a duration string, or seconds (zap's production encoder).
func sinceStop(v any) (time.Duration, error) {
	switch v := v.(type) {
	case string:
		return time.ParseDuration(v)
	case float64:
		return time.Duration(v * float64(time.Second)), nil
	}
	return 0, fmt.Errorf("failed to parse sinceStop %v", v)
}

// table prints the runs side by side.
func table(runs []*result) string {
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	row := func(name string, f func(r *result) string) {
		cells := make([]string, 0, 1+len(runs))
		cells = append(cells, name)
		for _, r := range runs {
			cells = append(cells, f(r))
		}
		_, _ = fmt.Fprintln(w, strings.Join(cells, "\t")) // a strings.Builder: no error
	}
	ms := func(d time.Duration) string { return d.Round(time.Millisecond).String() }
	row("", func(r *result) string { return r.Mode })
	row("creates during the run", func(r *result) string { return fmt.Sprint(r.Creates) })
	row("failed creates", func(r *result) string { return fmt.Sprint(r.Failed) })
	row("webhook connections (failed to forward)", func(r *result) string {
		return fmt.Sprintf("%d (%d)", r.Conns, r.ConnsFailed)
	})
	row("reconciles in flight at SIGTERM", func(r *result) string { return fmt.Sprint(r.InFlight) })
	row("reconciles cut off (context canceled)", func(r *result) string { return fmt.Sprint(r.CutOff) })
	row("objects reconciled by old / new leader", func(r *result) string {
		return fmt.Sprintf("%d / %d", r.By[r.Mode+"-a"], r.By[r.Mode+"-b"])
	})
	row("objects never reconciled (lost)", func(r *result) string { return fmt.Sprint(r.Lost) })
	row("overlapping reconciles of two leaders", func(r *result) string { return fmt.Sprint(r.Overlaps) })
	row("old leader's exit code", func(r *result) string { return fmt.Sprint(r.ExitCode) })
	row("old leader exits after SIGTERM", func(r *result) string { return ms(r.ExitAfter) })
	row("handover gap (SIGTERM → new leader reconciles)", func(r *result) string { return ms(r.Gap) })
	row("create latency from SIGTERM on, p50", func(r *result) string { return ms(r.P50) })
	row("p99", func(r *result) string { return ms(r.P99) })
	row("max", func(r *result) string { return ms(r.Max) })
	_ = w.Flush()
	return b.String()
}
