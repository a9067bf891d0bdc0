// The recorder of runs, and the checks on what it recorded.

package runlog

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/bgctl/controller"
)

// Interval is one DoFunc run or StopFunc call: from its start to its
// return.
type Interval struct {
	Replica    string
	Start, End time.Duration // since the recorder's base; End < 0 while running
}

// Recorder watches every name's DoFuncs and StopFuncs across all replicas
// of a test. Its DoFuncs run until their context ends, so a name "runs" on
// a replica for as long as the replica holds it; its StopFuncs take a few
// milliseconds, and count as running too: the claim is released only after
// the StopFunc returned, so no other replica's DoFunc may start before.
type Recorder struct {
	base time.Time // immutable

	mu        sync.Mutex
	active    map[string]int        // guarded by mu; DoFuncs of the name running now
	where     map[string]string     // guarded by mu; the replica running the name
	runs      map[string][]Interval // guarded by mu; every run, by name
	overlaps  int                   // guarded by mu; DoFunc or StopFunc starts that found another running
	maxActive int                   // guarded by mu
}

// New returns a recorder whose clock starts now.
func New() *Recorder {
	return &Recorder{base: time.Now(), active: map[string]int{}, where: map[string]string{}, runs: map[string][]Interval{}}
}

// Now returns the time since the recorder was made.
func (rec *Recorder) Now() time.Duration { return time.Since(rec.base) }

// Params returns the ControllerParams replica registers name with.
func (rec *Recorder) Params(replica, name string) controller.ControllerParams {
	return controller.ControllerParams{
		DoFunc: func(ctx context.Context) error {
			i := rec.Begin(replica, name)
			<-ctx.Done()
			rec.Finish(name, i)
			return nil
		},
		StopFunc: func(context.Context) error {
			i := rec.Begin(replica, name)
			time.Sleep(StopFuncTakes) // a StopFunc's work, not an ordering
			rec.Finish(name, i)
			return nil
		},
		RunInterval:            5 * time.Millisecond,
		ErrorRetryBaseDuration: 10 * time.Millisecond,
	}
}

// StopFuncTakes is how long the recorder's StopFuncs work.
const StopFuncTakes = 5 * time.Millisecond

func (rec *Recorder) Begin(replica, name string) int {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	rec.active[name]++
	if rec.active[name] > 1 {
		rec.overlaps++
	}
	rec.maxActive = max(rec.maxActive, rec.active[name])
	rec.where[name] = replica
	rec.runs[name] = append(rec.runs[name], Interval{Replica: replica, Start: rec.Now(), End: -1})
	return len(rec.runs[name]) - 1
}

func (rec *Recorder) Finish(name string, i int) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	rec.active[name]--
	if rec.active[name] == 0 {
		delete(rec.where, name)
	}
	rec.runs[name][i].End = rec.Now()
}

// RanOn returns how many runs (and StopFunc calls) replica has made.
func (rec *Recorder) RanOn(replica string) int {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	n := 0
	for _, runs := range rec.runs {
		for _, run := range runs {
			if run.Replica == replica {
				n++
			}
		}
	}
	return n
}

// RanOnSeveral returns how many names ran (or stopped) on more than one
// replica.
func (rec *Recorder) RanOnSeveral() int {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	n := 0
	for _, runs := range rec.runs {
		for _, run := range runs[1:] {
			if run.Replica != runs[0].Replica {
				n++
				break
			}
		}
	}
	return n
}

// Placement returns where each name runs now.
func (rec *Recorder) Placement() map[string]string {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	m := make(map[string]string, len(rec.where))
	for k, v := range rec.where {
		m[k] = v
	}
	return m
}

// Misplaced returns how many names of want do not run where it says.
func (rec *Recorder) Misplaced(want map[string]string) int {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	n := 0
	for name, w := range want {
		if rec.where[name] != w {
			n++
		}
	}
	return n
}

// AssertNoOverlap checks both ways that no name ever ran on two replicas
// at once: the count of DoFuncs running at once, and the recorded
// intervals, sorted by start, each ending before the next starts.
func (rec *Recorder) AssertNoOverlap(t testing.TB) {
	t.Helper()
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.overlaps != 0 || rec.maxActive > 1 {
		t.Errorf("%d DoFunc or StopFunc starts found the name running already (at most %d at once)", rec.overlaps, rec.maxActive)
	}
	bad, total := 0, 0
	for name, runs := range rec.runs {
		runs = slices.Clone(runs)
		sort.Slice(runs, func(i, j int) bool { return runs[i].Start < runs[j].Start })
		total += len(runs)
		for i := 1; i < len(runs); i++ {
			prev, cur := runs[i-1], runs[i]
			if prev.End < 0 || prev.End > cur.Start {
				bad++
				if bad <= 5 {
					t.Errorf("%s: run on %s [%v, %v] overlaps run on %s from %v", name, prev.Replica, prev.Start, prev.End, cur.Replica, cur.Start)
				}
			}
		}
	}
	t.Logf("overlap: %d concurrent starts, %d overlapping intervals, in %d runs of %d names", rec.overlaps, bad, total, len(rec.runs))
}

// Handover returns when replica's last run (or StopFunc) of any of names
// ended, and when the first run of them on another replica started after
// since.
func (rec *Recorder) Handover(replica string, names []string, since time.Duration) (lastEnd, firstOther time.Duration) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	firstOther = -1
	for _, name := range names {
		for _, run := range rec.runs[name] {
			if run.Replica == replica && run.End > lastEnd {
				lastEnd = run.End
			}
			if run.Replica != replica && run.Start >= since && (firstOther < 0 || run.Start < firstOther) {
				firstOther = run.Start
			}
		}
	}
	return lastEnd, firstOther
}

// LongestStop returns the longest time within [from, to] that one of names
// ran nowhere (no DoFunc or StopFunc of it running on any replica), and
// that name.
func (rec *Recorder) LongestStop(names []string, from, to time.Duration) (time.Duration, string) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	var longest time.Duration
	var which string
	for _, name := range names {
		runs := slices.Clone(rec.runs[name])
		sort.Slice(runs, func(i, j int) bool { return runs[i].Start < runs[j].Start })
		covered := from // the name ran, or the window began, until here
		note := func(until time.Duration) {
			if gap := min(until, to) - covered; gap > longest {
				longest, which = gap, name
			}
		}
		for _, run := range runs {
			end := run.End
			if end < 0 {
				end = to // running still
			}
			if end <= covered {
				continue
			}
			if run.Start > covered {
				note(run.Start)
			}
			covered = max(covered, end)
			if covered >= to {
				break
			}
		}
		if covered < to {
			note(to)
		}
	}
	return longest, which
}

// Base returns when the recorder's clock started.
func (rec *Recorder) Base() time.Time { return rec.base }

// Runs returns a copy of every run recorded so far, by name, in the
// order they began on each name.
func (rec *Recorder) Runs() map[string][]Interval {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	m := make(map[string][]Interval, len(rec.runs))
	for name, runs := range rec.runs {
		m[name] = slices.Clone(runs)
	}
	return m
}

// Names returns n names: prefix-0, prefix-1, and so on.
func Names(prefix string, n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return names
}
