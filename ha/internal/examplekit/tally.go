// What an example shows and checks: which replica runs each name, and
// whether a name ever started while it ran on another.

package examplekit

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
)

// Tally records the runs of the names on the replicas of an example's
// process. Its methods are safe for concurrent use.
type Tally struct {
	mu       sync.Mutex
	on       map[string][]string // guarded by mu: name → the replicas running it now
	starts   int                 // guarded by mu
	overlaps int                 // guarded by mu: starts while the name ran elsewhere
}

// NewTally returns an empty Tally.
func NewTally() *Tally { return &Tally{on: map[string][]string{}} }

// Start records that replica started name, and returns what records its
// end.
func (t *Tally) Start(name, replica string) (end func()) {
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

// Line returns "r0: 00 03 | r1: 01 | r2: 02", the names each replica of
// ids runs, by number.
func (t *Tally) Line(ids []string) string {
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

// On returns the names replica runs now, sorted.
func (t *Tally) On(replica string) []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var names []string
	for name, rs := range t.on {
		if slices.Contains(rs, replica) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

// AllMoved tells whether each of names runs on one replica, not gone:
// a crashed replica's names were taken over.
func (t *Tally) AllMoved(names []string, gone string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, name := range names {
		if rs := t.on[name]; len(rs) != 1 || rs[0] == gone {
			return false
		}
	}
	return true
}

// Placed tells which of names do not run on exactly one replica, or
// returns nil.
func (t *Tally) Placed(names []string) error {
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

// Counts returns the starts and the overlapping ones.
func (t *Tally) Counts() (starts, overlaps int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.starts, t.overlaps
}
