// What the example shows and checks: where each name runs and whether one
// ever started while it ran elsewhere (examplekit's tally, as the
// Kubernetes store's example keeps it), and how its fenced writes went.

package main

import (
	"sync"

	"github.com/bgctl/controller/ha/internal/examplekit"
)

// board records the runs of the names on the replicas of this process,
// and their fenced writes.
type board struct {
	*examplekit.Tally

	mu      sync.Mutex
	writes  int // guarded by mu: fenced writes committed
	refused int // guarded by mu: fenced writes Held refused
}

func newBoard() *board { return &board{Tally: examplekit.NewTally()} }

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

// writeCounts returns the fenced writes committed and refused.
func (b *board) writeCounts() (writes, refused int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.writes, b.refused
}
