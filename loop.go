// loop.go: the run loop, the goroutine each controller runs.

package controller

import (
	"context"
	"fmt"
	"runtime/debug"
	"time"
)

// loop is the run loop's own state. It lives on the loop goroutine's stack
// and only that goroutine touches it.
type loop struct {
	do     ControllerFunc  // DoFunc of the params the next run uses
	health HealthReporter  // and their HealthReporter, told its outcome
	group  *groupHandles   // and the metrics of their group, which count it
	ctx    context.Context // its run context
	parent context.Context // params.Context, or Background
	ends   bool            // parent can end (its Done is not nil)
	timed  bool            // the next wait is on the timer
	step   int             // failures since the last success or update
	ranDo  bool            // DoFunc ran at least once
	begun  bool            // begin ran at least once

	// The clock: anchor is the last full reading (wall and monotonic),
	// anchorNs its wall time in Unix nanoseconds. Runs are timed as
	// monotonic offsets from it, see offset.
	anchor   time.Time
	anchorNs int64

	// lastFailure is the error of the last failed run, to recognise the
	// same error returned again without classifying it anew.
	lastFailure error
}

// offset returns the time since the anchor, reading only the monotonic
// clock (about half the cost of a full reading). It renews the anchor when
// that is a second old, so a step of the wall clock shows in the recorded
// timestamps within a second (or one run).
func (l *loop) offset() time.Duration {
	if l.anchorNs != 0 {
		if d := time.Since(l.anchor); d >= 0 && d < time.Second {
			return d
		}
	}
	l.anchor = time.Now()
	l.anchorNs = l.anchor.UnixNano()
	return 0
}

// What the loop does after looking at the controller's state.
type action uint8

const (
	actRun  action = iota // run DoFunc now
	actWait               // wait for a signal or the timer
	actExit               // removed: stop
)

// run is the controller's goroutine. Its owner is the Manager that
// installed the controller, which joins it through the Manager's drain
// (RemoveAllAndWait, Shutdown) or the termination channel
// (RemoveControllerAndWait).
//
// The loop only wires signals and the timer. Its frame is kept small, and
// everything heavy happens in helpers at the depth of DoFunc rather than
// below it, so the goroutine's stack stays at its initial 2 KiB for an idle
// controller. A timed run whose state did not change is claimed without
// the lock.
func (c *Controller) run() {
	var l loop
	due := true // rule 1: the first run starts at once
	for {
		fired := false
		if !due {
			if l.timed {
				<-c.timer.C
				l.timed, fired = false, true
			} else {
				<-c.signal
			}
		}
		// A timer that fired with nothing else pending is a timed run:
		// claim it without the lock.
		if !fired || (l.ends && l.parent.Err() != nil) || !c.state.CompareAndSwap(stTimed, stRunning) {
			switch c.begin(&l, due || fired) {
			case actExit:
				c.finish(&l)
				return
			case actWait:
				due = false
				continue
			}
		}
		due = false
		l.ranDo = true
		start := l.offset()
		err, stack := call(l.do, l.ctx)
		end := time.Since(l.anchor)
		c.afterRun(&l, err, stack, end-start, l.anchorNs+int64(end))
	}
}

// begin looks at the controller's state under the lock and decides whether
// the loop runs DoFunc now (due: the timer fired, or this is the first
// run), waits, or exits. For a run, it sets l up and marks the controller
// running.
//
//go:noinline
func (c *Controller) begin(l *loop, due bool) action {
	c.mu.Lock()
	// The loop is out of any timed wait: from here on a change must wake
	// it through the signal channel, also while the lock is dropped below.
	c.state.And(^stTimed)
	l.timed = false
	for inv := c.unreported; inv != nil; inv = c.unreported {
		// Taken whole: updates that come while the lock is dropped start
		// a new list, so the nodes taken here are the loop's alone.
		c.unreported = nil
		c.mu.Unlock()
		for ; inv != nil; inv = inv.next {
			c.reportInvalid(inv)
		}
		c.mu.Lock()
	}
	st := c.state.Load()
	// Removal wins over every other signal. Only a valid controller whose
	// goroutine had not started when it was removed still makes its first
	// run (rule 1).
	first := !l.begun
	l.begun = true
	if st&stRemoved != 0 && (l.ranDo || c.invalid != nil || !first) {
		c.mu.Unlock()
		return actExit
	}
	updated := st&stUpdate != 0
	if updated {
		l.step = 0
	}
	due = due || updated || st&stTrigger != 0
	c.state.Store(st &^ (stUpdate | stTrigger))
	l.parent = contextOrBackground(c.params.Context)
	l.ends = l.parent.Done() != nil
	// Parked until an update: invalid parameters, or an ended
	// params.Context (the first run happens regardless, rule 1).
	park := c.invalid != nil || (l.ranDo && l.parent.Err() != nil)
	if park || !due {
		c.mu.Unlock()
		return actWait
	}
	if c.runCtx == nil {
		c.newRunCtxLocked(l.parent)
		if st&stRemoved != 0 {
			c.cancelRunCtxLocked()
		}
	}
	l.do, l.health, l.group, l.ctx = c.params.DoFunc, c.params.Health, c.group, c.runCtx
	c.cancelOnUpdate = c.params.CancelDoFuncOnUpdate
	c.state.Store(stRunning | st&stRemoved)
	c.mu.Unlock()
	return actRun
}

// finish ends the loop: StopFunc (rule 7), then termination.
//
//go:noinline
func (c *Controller) finish(l *loop) {
	c.mu.Lock()
	if c.timer != nil {
		c.timer.Stop()
	}
	c.mu.Unlock()
	if l.ranDo {
		c.runStopFunc()
	}
	c.mgr.release(c)
}

// runStopFunc runs the StopFunc of the newest valid parameters (rule 7).
func (c *Controller) runStopFunc() {
	c.mu.Lock()
	stop := c.params.StopFunc
	if stop == nil {
		c.mu.Unlock()
		return
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(contextOrBackground(c.params.Context)))
	defer cancel()
	c.runCtx, c.runCancel = ctx, cancel
	if c.stopExpired {
		cancel()
	}
	c.mu.Unlock()

	err, stack := call(stop, ctx)
	if err == nil {
		return
	}
	var msg string
	if stack != nil {
		msg = err.Error() // our own panicError
	} else {
		err, msg, _ = inspectError(err, false)
	}
	c.mu.Lock()
	c.recordFailureLocked(err, msg, time.Now().UnixNano())
	health, group := c.params.Health, c.group
	c.mu.Unlock()
	met := c.met
	met.countStopFailure(group)
	if stack != nil {
		met.countPanic(group)
	}
	c.logStopFailure(err, stack)
	if health != nil {
		c.reportHealth(health, err)
	}
}

// call runs f, turning a panic into an error that reads "panic: <value>"
// and returning the stack of the panic (nil when f returned).
func call(f ControllerFunc, ctx context.Context) (err error, stack []byte) {
	defer func() {
		if r := recover(); r != nil {
			err, stack = panicError(r), debug.Stack()
		}
	}()
	return f(ctx), nil
}

func panicError(r any) error {
	if e, ok := r.(error); ok {
		return fmt.Errorf("panic: %w", e)
	}
	return fmt.Errorf("panic: %v", r)
}
