// cohort.go: stop cohorts, which let RemoveAllAndWait and Shutdown wait for
// exactly the controllers that were stopping when they were called.

package controller

import "sync/atomic"

// A stopCohort is the set of controllers removed from a Manager between two
// waits. The Manager keeps one cohort open: every removal joins it. A wait
// (RemoveAllAndWait, Shutdown) seals the open cohort, opens the next, and
// waits for the sealed one to drain; since a cohort drains only after the
// one before it, the wait ends once every controller removed before it was
// sealed has terminated, and controllers removed later (an owner still
// installing and removing while it waits) cannot hold it up.
//
// pending counts, atomically:
//   - the cohort's controllers not yet terminated: added under the
//     Manager's lock as they join, subtracted by each controller's
//     goroutine as its last act;
//   - 1 while the cohort is open, subtracted when a wait seals it;
//   - 1 while the cohort before it has not drained, subtracted when that
//     one drains.
//
// It reaches 0 once: when the cohort is sealed and it and every earlier
// cohort have drained. Whoever brings it to 0 closes drained and subtracts
// from the next cohort. Two cohorts in a row, with c1 and c2 controllers:
//
//	open c1:           pending(1) = 1                 (open)
//	2 removals:        pending(1) = 3
//	a wait seals 1:    pending(1) = 2, pending(2) = 2 (open, 1 not drained)
//	1 removal:         pending(2) = 3
//	1's two finish:    pending(1) = 0: closed; pending(2) = 2
type stopCohort struct {
	pending atomic.Int64
	seq     uint64        // immutable: cohorts are numbered 1, 2, … as they open
	next    *stopCohort   // set under the Manager's lock when sealed, before pending can reach 0
	drained chan struct{} // made with next; closed when pending reaches 0
}

// newStopCohort returns the open cohort numbered seq; after tells whether a
// cohort before it is still to drain.
func newStopCohort(seq uint64, after bool) *stopCohort {
	co := &stopCohort{seq: seq}
	co.pending.Store(1)
	if after {
		co.pending.Add(1)
	}
	return co
}

// release subtracts n from pending and, when that drains the cohort, closes
// it and passes the news down the chain. The atomic subtraction that
// reaches 0 comes after the seal's, so next and drained are seen set.
func (co *stopCohort) release(n int64) {
	for co.pending.Add(-n) == 0 {
		close(co.drained)
		co, n = co.next, 1
	}
}

// openCohortLocked returns the cohort removals join now, opening the first
// one on first use. The caller holds m.mu.
func (m *Manager) openCohortLocked() *stopCohort {
	if m.cohort == nil {
		m.cohort = newStopCohort(1, false)
	}
	return m.cohort
}

// sealCohortLocked seals the open cohort and returns it, for the caller to
// wait on its drained channel; nil when no controller removed so far is
// still stopping. The caller holds m.mu.
func (m *Manager) sealCohortLocked() *stopCohort {
	co := m.cohort
	if co == nil || co.pending.Load() == 1 {
		// Only the open mark is left, and under m.mu nothing joins: the
		// cohort and all before it have drained. It stays open.
		return nil
	}
	co.next, co.drained = newStopCohort(co.seq+1, true), make(chan struct{})
	m.cohort = co.next
	co.release(1)
	return co
}
