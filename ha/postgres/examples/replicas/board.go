// What the example shows and checks: where each name runs, whether one
// ever started while it ran elsewhere, and how its fenced writes went.

package main

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
)

// board records the runs of the names on the replicas of this process.
type board struct {
	mu       sync.Mutex
	running  map[string][]string // guarded by mu: name → the replicas whose DoFunc for it runs now
	starts   int                 // guarded by mu
	overlaps int                 // guarded by mu: starts while the name ran on another replica
	writes   int                 // guarded by mu: fenced writes committed
	refused  int                 // guarded by mu: fenced writes Held refused
}

func newBoard() *board { return &board{running: map[string][]string{}} }

// start records that replica started name's DoFunc, and returns what
// records its end.
func (b *board) start(name, replica string) (end func()) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.starts++
	if len(b.running[name]) > 0 {
		b.overlaps++
	}
	b.running[name] = append(b.running[name], replica)
	return func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		b.running[name] = slices.DeleteFunc(b.running[name], func(r string) bool { return r == replica })
	}
}

// wrote records a fenced write: committed, or refused by Held.
func (b *board) wrote(committed bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if committed {
		b.writes++
	} else {
		b.refused++
	}
}

// on returns the names replica runs, sorted.
func (b *board) on(replica string) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var names []string
	for name, rs := range b.running {
		if slices.Contains(rs, replica) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

// line returns "r0: 00 03 | r1: 01 | r2: 02", the names each replica
// runs, by number.
func (b *board) line() string {
	parts := make([]string, len(ids))
	for i, id := range ids {
		nums := b.on(id)
		for j, name := range nums {
			nums[j] = strings.TrimPrefix(name, "job-")
		}
		parts[i] = id + ": " + strings.Join(nums, " ")
	}
	return strings.Join(parts, " | ")
}

// allMoved tells whether each of names runs on one replica, not gone.
func (b *board) allMoved(names []string, gone string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, name := range names {
		if rs := b.running[name]; len(rs) != 1 || rs[0] == gone {
			return false
		}
	}
	return true
}

// placed tells which of names do not run on exactly one replica, or
// returns nil.
func (b *board) placed(names []string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	var errs []error
	for _, name := range names {
		if n := len(b.running[name]); n != 1 {
			errs = append(errs, fmt.Errorf("%s runs on %d replicas at the end, not one", name, n))
		}
	}
	return errors.Join(errs...)
}

// counts returns the starts, the overlapping ones, and the fenced writes
// committed and refused.
func (b *board) counts() (starts, overlaps, writes, refused int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.starts, b.overlaps, b.writes, b.refused
}
