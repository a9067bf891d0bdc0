// debounce.go: the trigger debounce, which holds a run an update or
// trigger asked for until a window after the previous run has passed,
// and never drops it.

package controller

import "time"

// WithTriggerDebounce gives each controller of the Manager a minimum time
// d between the end of a run and the start of a run that an update or a
// trigger asks for: one that comes sooner is held until d after that end,
// then runs, once for every update and trigger that came meanwhile
// (coalesced as during a run, with the newest parameters). None is
// dropped: a trigger sent just after a run still makes a run, d later.
// The first run of a controller is never held (rule 1), a removal ends the
// wait at once and runs nothing (rule 5), and runs on the controller's own
// schedule (RunInterval, retries) are not held: one due before the
// window's end comes on time and serves the update or trigger too.
//
// The window counts from when the previous run returned, on the wall
// clock (invalid parameters given since count as such an end too); a
// clock stepped back holds a run for d at the most. Default (and for
// d ≤ 0): off, and the run loop is what it is without this option.
func WithTriggerDebounce(d time.Duration) Option {
	return func(m *Manager) { m.debounce = max(d, 0) }
}

// holdLocked decides, for a run an update or trigger asked for, whether it
// waits for the end of the debounce window; if so, it arms the timer,
// marks the run held (stHeld, with the pending bits of st, so that the
// lock-free claim fails and begin takes the run when the timer fires) and
// reports true. timed says a timed run is due at runStart (the loop was in
// a timed wait, or the previous run ended with the update or trigger
// pending and a timed wait to follow): a timed run due before the
// window's end is not held back.
//
// Out of line: it runs only with the option on, and its frame must not
// count in begin's.
//
//go:noinline
func (c *Controller) holdLocked(l *loop, st uint32, timed bool) bool {
	now := l.anchorNs + int64(l.offset())
	// The end of the previous run: a success or an exit records its time
	// as lastSuccessTime, a failure as lastErrTime (and invalid
	// parameters, which count so as well).
	lastEnd := max(c.lastSuccessTime, c.lastErrTime)
	elapsed := time.Duration(max(now-lastEnd, 0)) // a clock stepped back: no time passed
	if elapsed >= c.mgr.debounce {
		return false
	}
	wait := c.mgr.debounce - elapsed
	if timed {
		wait = min(wait, time.Duration(c.runStart-now))
	}
	if wait <= 0 {
		return false
	}
	c.armTimerLocked(wait)
	l.timed = true
	c.state.Store(stHeld | st&(stUpdate|stTrigger))
	return true
}
