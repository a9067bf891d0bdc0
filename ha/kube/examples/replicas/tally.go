// What the example shows and checks: which replica runs each name, and
// whether a name ever started while it ran on another.

package main

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
)

// tally records the runs of the names on the replicas of this process.
type tally struct {
	mu       sync.Mutex
	on       map[string][]string // guarded by mu: name → the replicas running it now
	starts   int                 // guarded by mu
	overlaps int                 // guarded by mu: starts while the name ran elsewhere
}

func newTally() *tally { return &tally{on: map[string][]string{}} }

// start records that replica started name, and returns what records its
// end.
func (t *tally) start(name, replica string) (end func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.starts++
	if len(t.on[name]) > 0 {
		t.overlaps++
	}
	t.on[name] = append(t.on[name], replica)
	return func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		t.on[name] = slices.DeleteFunc(t.on[name], func(r string) bool { return r == replica })
	}
}

// line returns "r0: 00 03 | r1: 01 | r2: 02", the names each replica of
// ids runs, by number.
func (t *tally) line(ids []string) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	parts := make([]string, len(ids))
	for i, id := range ids {
		var mine []string
		for name, rs := range t.on {
			if slices.Contains(rs, id) {
				mine = append(mine, strings.TrimPrefix(name, "job-"))
			}
		}
		slices.Sort(mine)
		parts[i] = id + ": " + strings.Join(mine, " ")
	}
	return strings.Join(parts, " | ")
}

// placed tells which of names do not run on exactly one replica, or
// returns nil.
func (t *tally) placed(names []string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	var errs []error
	for _, name := range names {
		if n := len(t.on[name]); n != 1 {
			errs = append(errs, fmt.Errorf("%s runs on %d replicas, not one", name, n))
		}
	}
	return errors.Join(errs...)
}

// counts returns the starts and the overlapping ones.
func (t *tally) counts() (starts, overlaps int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.starts, t.overlaps
}
