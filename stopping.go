// stopping.go: controllers removed and still stopping: the view that lists
// them, and the warning about those that take too long.

package controller

import (
	"fmt"
	"slices"
	"time"
	"weak"
)

// defaultSlowStop is how long a removed controller may take to stop before
// it is logged, unless WithSlowStopWarning says otherwise.
const defaultSlowStop = time.Minute

// stoppingController is a removed controller in Manager.stopping.
type stoppingController struct {
	c       *Controller
	removed int64 // when it was removed, Unix nanoseconds
	warned  bool  // logged as slow to stop; guarded by the Manager's mu
}

// WithSlowStopWarning makes the Manager log at Warn, once, each removed
// controller whose DoFunc or StopFunc has not returned d after its removal,
// naming the function and how long it has been. Default: 1 minute. d < 0
// turns the warning off (and 0 keeps the default).
func WithSlowStopWarning(d time.Duration) Option {
	return func(m *Manager) { m.slowStop = d }
}

func (m *Manager) slowStopAfter() time.Duration {
	if m.slowStop == 0 {
		return defaultSlowStop
	}
	return max(m.slowStop, 0)
}

// watchStoppingLocked arms the Manager's watch timer after a removal,
// unless it is armed already (then it fires for an earlier removal, and
// re-arms itself for the later ones). One timer serves every removal of
// the Manager: made on the first, reset after.
func (m *Manager) watchStoppingLocked() {
	after := m.slowStopAfter()
	switch {
	case after == 0 || m.watchArmed:
		return
	case m.watch == nil:
		// The timer's goroutine is the Manager's: it runs warnSlowStops,
		// which takes m.mu briefly and returns. The timer holds m weakly,
		// so that it never keeps m (nor the owner that embeds it) from
		// the garbage collector: while a controller is stopping, its
		// goroutine holds m anyway.
		wm := weak.Make(m)
		m.watch = time.AfterFunc(after, func() {
			if m := wm.Value(); m != nil {
				m.warnSlowStops()
			}
		})
	default:
		m.watch.Reset(after)
	}
	m.watchArmed = true
}

// unwatchIfIdleLocked disarms the watch timer once no controller is
// stopping (a removal may have come since the count reached 0): a pending
// timer, even a minute away, makes goroutine wake-ups in the whole
// process slower (BenchmarkTrigger's p50: 270 ns with one, 240 ns
// without, on the machine of docs/performance.md).
func (m *Manager) unwatchIfIdleLocked() {
	if m.watchArmed && m.stoppingN.Load() == 0 {
		m.watch.Stop()
		m.watchArmed = false
	}
}

// warnSlowStops logs the removed controllers that have been stopping for
// the Manager's threshold and were not logged yet, and re-arms the timer
// for the next one to reach it.
func (m *Manager) warnSlowStops() {
	type slow struct {
		c   *Controller
		age time.Duration
	}
	after := m.slowStopAfter()
	now := time.Now()
	var due []slow
	var next time.Duration
	m.mu.Lock()
	for i := range m.stopping {
		s := &m.stopping[i]
		if s.warned || s.c.done() {
			continue
		}
		switch age := now.Sub(time.Unix(0, s.removed)); {
		case age >= after:
			s.warned = true
			due = append(due, slow{s.c, age})
		case next == 0 || after-age < next:
			next = after - age
		}
	}
	m.watchArmed = next > 0
	if m.watchArmed {
		m.watch.Reset(next)
	}
	m.mu.Unlock()
	for _, s := range due {
		s.c.logSlowStop(s.age)
	}
}

// logSlowStop logs that c, removed d ago, has not terminated: its DoFunc
// still runs, or its StopFunc does.
func (c *Controller) logSlowStop(d time.Duration) {
	c.mu.Lock()
	fn, ctx := "StopFunc", c.params.Context
	if c.runningSinceLocked() != 0 {
		fn = "DoFunc"
	}
	c.mu.Unlock()
	c.log(&logLine{ctx: ctx, level: levelWarn, msg: fmt.Sprintf("controller removed %s ago is still stopping: its %s has not returned", d.Round(time.Millisecond), fn), duration: d, timed: true})
}

// indexStoppingLocked records c, just appended to m.stopping, as the
// controller last removed under its name.
func (m *Manager) indexStoppingLocked(c *Controller) {
	if m.stoppingByName == nil {
		m.stoppingByName = make(map[string]*Controller)
	}
	// The last one still stopping, through the chain: the one indexed may
	// have terminated while one it shadowed still stops (A removed and
	// stopping, then B removed and terminated, then C removed: C shadows
	// A, not B).
	if prev := m.lastStoppingLocked(c.name); prev != nil {
		if m.shadowed == nil {
			m.shadowed = make(map[*Controller]*Controller)
		}
		m.shadowed[c] = prev
	}
	m.stoppingByName[c.name] = c
}

// lastStoppingLocked returns the controller last removed under name that
// has not terminated, nil when there is none: the index's, or the first
// of those it shadowed that is still stopping. Each controller shadows
// the last one still stopping when it was removed, so the chain holds
// every one that may still stop.
func (m *Manager) lastStoppingLocked(name string) *Controller {
	c := m.stoppingByName[name]
	for c != nil && c.done() {
		c = m.shadowed[c]
	}
	return c
}

// GetStoppingStatus returns the status of every controller removed from
// the Manager whose DoFunc or StopFunc has not returned yet, sorted by
// name, then UUID. Each has Status.RemovedTimestamp set; a non-nil
// Status.RunningSince says its DoFunc still runs (else its StopFunc does).
// A controller stays here until it terminates, also after a
// [Manager.Shutdown] whose deadline passed. [Manager.GetStatusModel] lists
// the installed controllers only, as Cilium's does.
func (m *Manager) GetStoppingStatus() ControllerStatuses {
	m.mu.Lock()
	ss := m.stillStoppingLocked(nil)
	m.mu.Unlock()
	return stoppingStatuses(ss, time.Now().UnixNano())
}

// GetGlobalStoppingStatus is [Manager.GetStoppingStatus] for every Manager
// in the process (but [FakeManager]s), as [GetGlobalStatus] is for the
// installed controllers.
func GetGlobalStoppingStatus() ControllerStatuses {
	var ss []stoppingController
	for _, m := range registry.snapshot() {
		m.mu.Lock()
		ss = m.stillStoppingLocked(ss)
		m.mu.Unlock()
	}
	return stoppingStatuses(ss, time.Now().UnixNano())
}

// stillStoppingLocked appends m's stopping controllers that have not
// terminated to ss.
func (m *Manager) stillStoppingLocked(ss []stoppingController) []stoppingController {
	for _, s := range m.stopping {
		if !s.c.done() {
			ss = append(ss, s)
		}
	}
	return ss
}

// stoppingStatuses returns the statuses of ss at now (Unix nanoseconds),
// sorted, with their removal times.
func stoppingStatuses(ss []stoppingController, now int64) ControllerStatuses {
	slices.SortFunc(ss, func(a, b stoppingController) int { return compareController(a.c, b.c) })
	cs := make([]*Controller, len(ss))
	for i, s := range ss {
		cs[i] = s.c
	}
	out := statusesOf(cs, formatUUIDs(cs), now)
	removed := make([]time.Time, len(ss))
	for i, s := range ss {
		removed[i] = statusTime(s.removed)
		out[i].Status.RemovedTimestamp = &removed[i]
	}
	return out
}
