// The storm's checks: what must hold while nothing moves (a pause), after
// every operation that reads the Manager, and at the end of a round, call
// by call.

package controller

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

func (w *stormWorker) checkNotFound(err error, name string) {
	if !errors.Is(err, ErrControllerNotFound) || !strings.Contains(err.Error(), name) {
		w.s.errorf("removing %q: %v, want an error wrapping ErrControllerNotFound naming it", name, err)
	}
}

func (w *stormWorker) checkMonotone(st ControllerStatuses) {
	for _, c := range st {
		now := [2]int64{c.Status.SuccessCount, c.Status.FailureCount}
		if was, ok := w.seen[c.UUID]; ok && (now[0] < was[0] || now[1] < was[1]) {
			w.s.errorf("counters of %s (%s) went down: success %d → %d, failure %d → %d", c.Name, c.UUID, was[0], now[0], was[1], now[1])
		}
		w.seen[c.UUID] = now
	}
}

func statusNames(st ControllerStatuses) []string {
	var out []string
	for _, c := range st {
		out = append(out, c.Name)
	}
	return out
}

// healthNames returns the controllers Health names, in its order.
func healthNames(s *storm, err error) []string {
	if err == nil {
		return nil
	}
	var errs []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	} else {
		errs = []error{err}
	}
	var names []string
	for _, e := range errs {
		_, rest, ok := strings.Cut(e.Error(), `controller "`)
		name, _, ok2 := strings.Cut(rest, `"`)
		if !ok || !ok2 {
			s.errorf("Health error %q does not name its controller", e)
			continue
		}
		names = append(names, name)
	}
	return names
}

// pause stops the storm between two half rounds and checks what must hold
// while nothing moves.
func (s *storm) pause() {
	s.mu.Lock()
	s.paused = true
	s.waitQuiet()
	// Lost updates: the newest parameters of an installed controller with
	// a live context must run (rule 5), unless a DoFunc of older ones still
	// runs. Wait for each to arrive at its gate, or for a call of older
	// parameters that the library started before the update but that had
	// not reached the test yet.
	for _, w := range s.workers {
		for _, name := range w.names {
			in := w.cur[name]
			if in == nil || s.m.Lookup(name) != in.c {
				continue
			}
			q := in.subs[len(in.subs)-1]
			if q.ctx != nil && q.ctx.Err() != nil || in.running() {
				continue
			}
			for len(q.calls) == 0 && !in.running() {
				s.totals.updateWaits++
				s.waitingFor = in.describe(s.m)
				s.cond.Wait()
			}
			s.waitingFor = ""
		}
	}
	s.waitQuiet()
	// A StopFunc that returned leaves its controller a few steps from
	// terminating; take those steps out of the picture.
	var stopped []*instance
	for _, in := range s.instances {
		for _, sub := range in.subs {
			if len(sub.stops) > 0 && sub.stops[0].exit != 0 {
				stopped = append(stopped, in)
			}
		}
	}
	s.mu.Unlock()
	for _, in := range stopped {
		<-terminationOf(in.c)
	}

	st := s.m.GetStatusModel()
	health := healthNames(s, s.m.Health())
	failing := testutil.ToFloat64(s.met.failing)
	active := testutil.ToFloat64(s.met.active)
	var buf bytes.Buffer
	if err := FormatStatus(&buf, st, false); err != nil {
		s.errorf("FormatStatus: %v", err)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	var stFailing []string
	for _, c := range st {
		in := s.byUUID[c.UUID]
		if in == nil || in.name != c.Name {
			s.errorf("GetStatusModel lists %s (%s), which no install returned", c.Name, c.UUID)
		}
		if c.Status.ConsecutiveFailureCount > 0 {
			stFailing = append(stFailing, c.Name)
		}
	}
	if !slices.Equal(stFailing, health) || failing != float64(len(health)) {
		s.errorf("controllers_failing = %v, Health names %v, the status model has %v failing", failing, health, stFailing)
	}
	if want := fmt.Sprintf("Controller Status: %d/%d healthy\n", len(st)-len(stFailing), len(st)); !strings.HasPrefix(buf.String(), want) {
		s.errorf("FormatStatus begins %q, want %q", strings.SplitAfter(buf.String(), "\n")[0], want)
	}
	alive := 0
	for _, in := range s.instances {
		if !isClosed(terminationOf(in.c)) {
			alive++
		}
		s.checkCountersGrow(in)
	}
	if active != float64(alive) {
		s.errorf("controllers_active = %v, but %d controllers are installed or stopping", active, alive)
	}
	s.totals.pauses++
	s.paused = false
	s.cond.Broadcast()
}

// waitQuiet waits, with s.mu held, until no call is busy and no parked call
// can wake up.
func (s *storm) waitQuiet() {
	defer func() { s.waitingFor = "" }()
	for {
		s.waitingFor = fmt.Sprintf("quiescence: %d calls busy, %d parked", s.busy, len(s.blocked))
		quiet := s.busy == 0
		for p := range s.blocked {
			if p.canWake() {
				quiet = false
				break
			}
		}
		if quiet {
			return
		}
		s.cond.Wait()
	}
}

// running reports whether a DoFunc of the instance has not returned.
func (in *instance) running() bool {
	for _, sub := range in.subs {
		for _, c := range sub.calls {
			if c.exit == 0 {
				return true
			}
		}
	}
	return false
}

func (s *storm) checkCountersGrow(in *instance) {
	succ, fail := in.c.GetSuccessCount(), in.c.GetFailureCount()
	if succ < in.lastSuccess || fail < in.lastFailure {
		s.errorf("counters of %s (%s) went down: success %d → %d, failure %d → %d", in.name, in.c.UUID(), in.lastSuccess, succ, in.lastFailure, fail)
	}
	in.lastSuccess, in.lastFailure = succ, fail
}

// endRound releases everything, removes and waits for every controller,
// then checks every instance of the round call by call.
func (s *storm) endRound() {
	s.hold()
	before := s.seq.Add(1)
	if s.round%2 == 0 {
		s.m.RemoveAllAndWait()
	} else {
		s.shut.Store(true)
		if err := s.m.Shutdown(context.Background()); err != nil {
			s.errorf("Shutdown without a deadline: %v", err)
		}
	}
	after := s.seq.Add(1)
	s.letBlock()

	if st := s.m.GetStatusModel(); len(st) != 0 {
		s.errorf("controllers left after the round: %v", statusNames(st))
	}
	if err := s.m.Health(); err != nil {
		s.errorf("Health with no controller: %v", err)
	}
	if v := testutil.ToFloat64(s.met.active); v != 0 {
		s.errorf("controllers_active = %v with every controller terminated", v)
	}
	if v := testutil.ToFloat64(s.met.failing); v != 0 {
		s.errorf("controllers_failing = %v with no controller installed", v)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	s.removals = append(s.removals, removalOp{before, after, true})
	if s.busy != 0 || len(s.blocked) != 0 {
		s.errorf("%d calls busy and %d parked after every controller terminated", s.busy, len(s.blocked))
	}
	for _, in := range s.instances {
		s.checkInstance(in)
	}
	for _, sub := range s.declined {
		if len(sub.calls)+len(sub.stops)+sub.reports+sub.stopReports > 0 {
			s.errorf("the parameters of a CreateController that returned false were used on %q", sub.name)
		}
	}
	s.checkMetrics()

	s.totals.instances += len(s.instances)
	s.instances, s.declined, s.removals = nil, nil, nil
	clear(s.byUUID)
	for _, w := range s.workers {
		clear(w.cur)
		w.newContexts()
	}
	if s.shut.Load() {
		// A shut down Manager takes no more installs: the next round
		// gets a fresh one.
		s.m = s.newMgr()
		s.shut.Store(false)
		s.shutDone.Store(false)
	}
}

// boundCall is a stormCall with the position of its submission in the
// instance's list.
type boundCall struct {
	stormCall
	sub int
}

// checkInstance checks one terminated instance call by call, then adds it
// to the totals checkMetrics compares with the metrics.
func (s *storm) checkInstance(in *instance) {
	id := fmt.Sprintf("%s (%s)", in.name, in.c.UUID())
	if !isClosed(terminationOf(in.c)) {
		s.errorf("%s did not terminate", id)
		return
	}
	calls, stops := in.boundCalls()
	s.totals.calls += len(calls)
	s.totals.stops += len(stops)
	if !s.checkRanThenStoppedOnce(id, in, calls, stops) {
		return
	}
	stop := stops[0]
	if !s.checkNoOverlap(id, calls, stop) {
		return
	}
	s.checkNoRunAfterRemoval(id, in, calls, stop)
	succ, fail, stopFailures, panics := s.checkCounters(id, in, calls, stop)
	s.checkReports(id, in, stopFailures)
	s.addToTotals(in, calls, succ, fail, stopFailures, panics)
}

// boundCalls returns the DoFunc calls of every submission of the instance,
// in the order they entered, and its StopFunc calls.
func (in *instance) boundCalls() (calls, stops []boundCall) {
	for i, sub := range in.subs {
		for _, c := range sub.calls {
			calls = append(calls, boundCall{c, i})
		}
		for _, c := range sub.stops {
			stops = append(stops, boundCall{c, i})
		}
	}
	slices.SortFunc(calls, func(a, b boundCall) int { return cmp.Compare(a.entry, b.entry) })
	return calls, stops
}

// checkRanThenStoppedOnce: rule 1, DoFunc runs at once, even when the
// controller was removed first; rule 7, then StopFunc exactly once, the
// newest one. It reports whether the other checks can go on.
func (s *storm) checkRanThenStoppedOnce(id string, in *instance, calls, stops []boundCall) bool {
	if len(calls) == 0 {
		s.errorf("%s: DoFunc never ran", id)
		return false
	}
	if len(stops) != 1 {
		s.errorf("%s: StopFunc ran %d times after DoFunc ran %d times, want once", id, len(stops), len(calls))
		return false
	}
	if stop := stops[0]; stop.sub != len(in.subs)-1 {
		s.errorf("%s: the StopFunc of parameters %d of %d ran, want that of the newest", id, stop.sub+1, len(in.subs))
	}
	return true
}

// checkNoOverlap: rule 6, no overlap, DoFunc after DoFunc, then StopFunc;
// and no stale parameters. It reports whether every DoFunc call returned.
func (s *storm) checkNoOverlap(id string, calls []boundCall, stop boundCall) bool {
	for i, c := range calls {
		if c.exit == 0 {
			s.errorf("%s: DoFunc call %d never returned", id, i)
			return false
		}
		if i > 0 && c.entry < calls[i-1].exit {
			s.errorf("%s: DoFunc call %d started before call %d returned", id, i, i-1)
		}
		if i > 0 && c.sub < calls[i-1].sub {
			s.errorf("%s: DoFunc call %d ran parameters %d after parameters %d had run (stale parameters)", id, i, c.sub+1, calls[i-1].sub+1)
		}
	}
	if last := calls[len(calls)-1]; stop.entry < last.exit || stop.exit == 0 {
		s.errorf("%s: StopFunc overlapped DoFunc", id)
	}
	return true
}

// checkNoRunAfterRemoval: no DoFunc starts after its removal returned. One
// call may be seen entering after it: the one the library had already
// started (or, for a controller removed before its first run, the first
// run, rule 1); either has a cancelled context. Nothing runs after a wait
// for the controller's termination returned.
func (s *storm) checkNoRunAfterRemoval(id string, in *instance, calls []boundCall, stop boundCall) {
	removed, waited := in.removed, in.waited
	for _, r := range s.removals {
		if r.before > in.created {
			removed = minSeq(removed, r.after)
			if r.waited {
				waited = minSeq(waited, r.after)
			}
		}
	}
	late := 0
	for i, c := range calls {
		s.totals.byKind[c.kind]++
		if c.ctxDone {
			s.totals.cancelledAtEntry++
		}
		if later(c.entry, removed) {
			s.totals.late++
			late++
			if late > 1 {
				s.errorf("%s: DoFunc call %d of %d started after the removal returned", id, i+1, len(calls))
			}
			if !c.ctxDone {
				s.errorf("%s: DoFunc call %d of %d, entered after the removal returned, has a live context", id, i+1, len(calls))
			}
		}
		if later(c.exit, waited) {
			s.errorf("%s: DoFunc call %d was still running after a wait for the controller's termination returned", id, i+1)
		}
	}
	if later(stop.exit, waited) {
		s.errorf("%s: StopFunc was still running after a wait for the controller's termination returned", id)
	}
}

// checkCounters: rules 3 and 7, the counters agree with the calls. It
// returns the counters, and the StopFunc failures and panics it counted.
func (s *storm) checkCounters(id string, in *instance, calls []boundCall, stop boundCall) (succ, fail, stopFailures, panics int) {
	sure, either := 0, 0
	for _, c := range calls {
		switch c.verdict {
		case sureSuccess:
			sure++
		case eitherOutcome:
			either++
		}
		if c.panics {
			panics++
		}
	}
	if stop.failed {
		stopFailures++
	}
	if stop.panics {
		panics++
	}
	succ, fail = in.c.GetSuccessCount(), in.c.GetFailureCount()
	if succ+fail != len(calls)+stopFailures || succ < sure || succ > sure+either {
		s.errorf("%s: success %d, failure %d after %d DoFunc calls (%d sure successes, %d either way) and %d StopFunc failures",
			id, succ, fail, len(calls), sure, either, stopFailures)
	}
	s.checkCountersGrow(in)
	return succ, fail, stopFailures, panics
}

// checkReports: each submission's HealthReporter was told every outcome
// of its DoFunc calls, and the newest one the StopFunc's failure.
func (s *storm) checkReports(id string, in *instance, stopFailures int) {
	for i, sub := range in.subs {
		if sub.reports != len(sub.calls) {
			s.errorf("%s: HealthReporter told %d outcomes of %d DoFunc calls", id, sub.reports, len(sub.calls))
		}
		want := 0
		if i == len(in.subs)-1 {
			want = stopFailures
		}
		if sub.stopReports != want {
			s.errorf("%s: HealthReporter told %d StopFunc failures, want %d", id, sub.stopReports, want)
		}
	}
}

// addToTotals adds a checked instance to the totals of the run.
func (s *storm) addToTotals(in *instance, calls []boundCall, succ, fail, stopFailures, panics int) {
	s.totals.success += succ
	s.totals.failure += fail
	s.totals.stopFailures += stopFailures
	s.totals.panics += panics
	for _, c := range calls {
		s.totals.groupCalls[in.subs[c.sub].group]++
	}
	if stopFailures > 0 {
		// Which group a StopFunc failure counts in is the library's
		// choice (the group of the last run or of the newest params);
		// allow either.
		g1, g2 := in.subs[calls[len(calls)-1].sub].group, in.subs[len(in.subs)-1].group
		s.totals.groupStopMax[g1]++
		if g2 != g1 {
			s.totals.groupStopMax[g2]++
		} else {
			s.totals.groupStopMin[g1]++
		}
	}
}

// checkMetrics compares the metrics with the totals of every round so far.
func (s *storm) checkMetrics() {
	mfs, err := s.reg.Gather()
	if err != nil {
		s.errorf("gather: %v", err)
		return
	}
	runs := map[string]float64{}
	var durations, panics float64
	groupRuns := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			switch mf.GetName() {
			case "controllers_runs_total":
				runs[labels["status"]] = m.GetCounter().GetValue()
			case "controllers_runs_duration_seconds":
				durations += float64(m.GetHistogram().GetSampleCount())
			case "controllers_panics_total":
				panics += m.GetCounter().GetValue()
			case "controllers_group_runs_total":
				groupRuns[labels["group_name"]] += m.GetCounter().GetValue()
			}
		}
	}
	for status, v := range runs {
		if v < s.totals.lastRuns[status] {
			s.errorf("controllers_runs_total{status=%q} went down: %v → %v", status, s.totals.lastRuns[status], v)
		}
		s.totals.lastRuns[status] = v
	}
	if runs["success"] != float64(s.totals.success) || runs["failure"] != float64(s.totals.failure) {
		s.errorf("controllers_runs_total: success %v, failure %v; the controllers counted %d and %d", runs["success"], runs["failure"], s.totals.success, s.totals.failure)
	}
	if durations != float64(s.totals.calls) {
		s.errorf("controllers_runs_duration_seconds has %v samples for %d DoFunc calls", durations, s.totals.calls)
	}
	if panics != float64(s.totals.panics) {
		s.errorf("controllers_panics_total = %v for %d panics", panics, s.totals.panics)
	}
	if _, ok := groupRuns[""]; ok {
		s.errorf("controllers_group_runs_total has runs of the empty group")
	}
	for _, g := range []string{"g1", "g2"} {
		lo := float64(s.totals.groupCalls[g] + s.totals.groupStopMin[g])
		hi := float64(s.totals.groupCalls[g] + s.totals.groupStopMax[g])
		if groupRuns[g] < lo || groupRuns[g] > hi {
			s.errorf("controllers_group_runs_total{group_name=%q} = %v, want %v..%v", g, groupRuns[g], lo, hi)
		}
	}
}
