// loop.go: the run loop, the goroutine each controller runs.

package controller

import (
	"context"
	"fmt"
	"math"
	"runtime/debug"
	"time"
)

// How the run loop stays cheap, and the test that fails when a trick stops
// working:
//
//   - An idle controller keeps the 2 KiB stack its goroutine starts with:
//     run's frame is small, and begin, afterRun and finish are out of line
//     (//go:noinline), so their frames exist only while they run, at the
//     depth of DoFunc. TestIdleControllerKeepsTheInitialStack.
//   - A run without a RunTimeout allocates nothing (with one, it makes a
//     context and its timer, callTimed): the timer is made once and reset, the run
//     context is part of the Controller (runCtxLazy, which makes a real
//     context only when DoFunc asks for Done), the message of a repeated
//     error is the same string, and run counts go to the metrics' own
//     collector. TestRunLoopDoesNotAllocate; a controller's whole life,
//     TestControllerLifeAllocations.
//   - A run's start (Controller.runStart, for the status, Health and the
//     longest-running gauge) costs the run no store of its own: the loop
//     sets it under the lock it holds anyway, in begin, or in
//     scheduleLocked to when the timer is due, and stRunning says whether
//     it is current. Nothing else about a run in flight is recorded, and
//     the gauges that need more compute it when scraped.
//     BenchmarkRunSuccess; TestStatusShowsTheRunningDoFunc and
//     TestStatusShowsTheRunningTimedRun for the times shown.
//   - A timed run whose state did not change is claimed with one
//     CompareAndSwap, without the lock; the state table in controller.go
//     says why that is safe. TestRemovalRacingATimedRunIsNotLost, and the
//     storm (TestStorm) with every operation racing the claim.
//   - The loop waits on one channel at a time (the timer's or signal),
//     never a select, and reads the wall clock at most once a second
//     (loop.offset). BenchmarkRunSuccess and BenchmarkRunFailure against
//     BenchmarkFloor.
//   - A failure that returns the same error value as the last one is not
//     classified again (identical); its message is still read.
//     TestReusedErrorWithNewMessage for the message, BenchmarkRunFailure
//     for the cost.
//   - What a run changed (runEvent) reaches report in registers, not
//     memory: it has four one-word fields. TestRunEventFitsInRegisters;
//     BenchmarkRunSuccess and BenchmarkRunFailure for the cost.
//   - The trigger debounce (WithTriggerDebounce) is decided in holdLocked,
//     which a run through begin reaches only with the option on, after an
//     update or trigger; a held run is a state bit (stHeld), not a field.
//     TestTriggerDebounce; BenchmarkTrigger.
//   - The goroutine's pprof labels are made by the installer
//     (newController) and only set by the goroutine (labelAtStart): their
//     allocations, made here, would reach deeper than the idle stack
//     allows. TestIdleControllerKeepsTheInitialStack.
//   - Run middleware (WithRunMiddleware) is applied once per set of
//     parameters, in adopt, after an update: a run pays for it only the
//     middleware's own calls, and without middleware a run through begin
//     tests one bool more, a timed run claimed without the lock nothing.
//     TestRunMiddlewareWrapsOncePerSetOfParameters; BenchmarkTrigger.
//   - The Controller fills its 416-byte size class to the last byte.
//     TestControllerStaysInItsSizeClass; BenchmarkIdle for the whole
//     footprint of an idle controller.

// loop is the run loop's own state. It lives on the loop goroutine's stack
// and only that goroutine touches it.
type loop struct {
	do     ControllerFunc  // DoFunc of the params the next run uses, wrapped by the run middleware
	health HealthReporter  // and their HealthReporter, told its outcome
	group  *groupHandles   // and the metrics of their group, which count it
	runCtx context.Context // and the run context it gets (Controller.runCtx)
	parent context.Context // params.Context, or Background: runCtx's parent
	// timeout is the RunTimeout of the params the next run uses.
	timeout time.Duration
	step    int  // failures since the last success or update
	ends    bool // parent can end (its Done is not nil)
	timed   bool // the next wait is on the timer
	ranDo   bool // DoFunc ran at least once
	begun   bool // begin ran at least once
	// stale says an update came since do was last taken from the
	// parameters: the next run takes it again, and adopt wraps it in the
	// Manager's run middleware. A bool in the padding after begun: a
	// field of its own would grow run's frame, and the idle stack with it
	// (TestIdleControllerKeepsTheInitialStack).
	stale bool
	// dueAfterRun says the last run ended with a change pending and a
	// timed run (RunInterval, retry) due at Controller.runStart, which a
	// run held by the debounce must not wait past (holdLocked). A bool in
	// the padding, as stale.
	dueAfterRun bool
	// cut is what ended the context of the last run with a RunTimeout
	// first, read by callTimed before it cancels that context: cutNone,
	// cutTimeout or cutOther. A byte in the padding, as stale.
	cut uint8

	// The clock: anchor is the last full reading (wall and monotonic),
	// anchorNs its wall time in Unix nanoseconds. Runs are timed as
	// monotonic offsets from it, see offset.
	anchor   time.Time
	anchorNs int64

	// lastFailure is the error of the last failed run, to recognise the
	// same error returned again without classifying it anew.
	lastFailure error
}

// parentEnded reports whether params.Context, the parent of the run
// context, has ended: the one change to a controller that sets no state
// bit.
func (l *loop) parentEnded() bool { return l.ends && l.parent.Err() != nil }

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

// What ended a timed run's context first (loop.cut): the first cause
// decides whether the run timed out (rule 3).
const (
	cutNone    uint8 = iota // still live when DoFunc returned
	cutTimeout              // its RunTimeout passed
	cutOther                // a removal, update, trigger or the end of params.Context
)

// What the loop does after looking at the controller's state.
type action uint8

const (
	actRun  action = iota // run DoFunc now
	actWait               // wait for a signal or the timer
	actExit               // removed: stop
)

// run is the controller's goroutine. Its owner is the Manager that
// installed the controller, which joins it through a stop cohort
// (RemoveAllAndWait, Shutdown) or the termination channel
// (RemoveControllerAndWait, TerminationChannel).
//
// The loop only wires signals and the timer; the decisions are begin's,
// the bookkeeping afterRun's. A timed run whose state did not change is
// claimed without the lock.
func (c *Controller) run() {
	c.labelAtStart()
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
		// A timer that fired with nothing pending and a live parent
		// context is a timed run, claimed without the lock: see the
		// state table in controller.go for why that is safe.
		claimed := fired && !l.parentEnded() && c.state.CompareAndSwap(stTimed, stRunning)
		var start time.Duration // when the run starts, as an offset of l's clock
		if claimed {
			start = l.offset()
		} else {
			var act action
			switch act, start = c.begin(&l, due || fired); act {
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
		err, stack := c.callDo(&l)
		end := time.Since(l.anchor)
		c.afterRun(&l, err, stack, end-start, l.anchorNs+int64(end))
	}
}

// callDo runs DoFunc for the loop, bounded by RunTimeout when that is
// set, and turns a panic into an error, as call does. It recovers itself
// rather than calling call, so that a run costs one frame between run and
// DoFunc, not two.
func (c *Controller) callDo(l *loop) (err error, stack []byte) {
	if l.timeout > 0 {
		return callTimed(l)
	}
	defer func() {
		if r := recover(); r != nil {
			err, stack = panicError(r), debug.Stack()
		}
	}()
	return l.do(l.runCtx), nil
}

// callTimed runs DoFunc with a context that ends after RunTimeout, with
// the cause ErrRunTimeout (which costs nothing more). The
// context with its timer is a run's only allocation (4 objects, 272 bytes:
// BenchmarkRunSuccessWithRunTimeout), and only a run with a RunTimeout
// makes it.
//
//go:noinline
func callTimed(l *loop) (error, []byte) {
	ctx, cancel := context.WithTimeoutCause(l.runCtx, l.timeout, ErrRunTimeout)
	defer cancel()
	err, stack := call(l.do, ctx)
	// The context keeps its first cause: the timeout, or the run
	// context's cause when a removal or update came before it.
	switch cause := context.Cause(ctx); {
	case cause == nil:
		l.cut = cutNone
	case cause == ErrRunTimeout: // our own sentinel, never wrapped here
		l.cut = cutTimeout
	default:
		l.cut = cutOther
	}
	return err, stack
}

// begin looks at the controller's state under the lock and decides whether
// the loop runs DoFunc now (due: the timer fired, or this is the first
// run), waits, or exits. For a run, it sets l up, marks the controller
// running, and returns when the run starts, on l's clock.
//
// Out of line so that its locals, and the reporting of invalid parameters
// it may do, never count in run's frame.
//
//go:noinline
func (c *Controller) begin(l *loop, due bool) (_ action, start time.Duration) {
	c.mu.Lock()
	// The loop is out of any timed wait, and holds no run: from here on a
	// change must wake it through the signal channel, also while the lock
	// is dropped below.
	waited := c.state.And(^(stTimed | stHeld))
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
	// Removal wins over every other signal (rule 5), but for the first
	// run of valid parameters, which happens even when the controller was
	// removed before its goroutine started (rule 1).
	firstRunOwed := !l.begun && !l.ranDo && c.invalid == nil
	l.begun = true
	if st&stRemoved != 0 && !firstRunOwed {
		c.mu.Unlock()
		return actExit, 0
	}
	updated := st&stUpdate != 0
	if updated {
		l.step = 0
		l.stale = true
	}
	asked := updated || st&stTrigger != 0
	due = due || asked
	c.state.Store(st &^ (stUpdate | stTrigger))
	l.parent = contextOrBackground(c.params.Context)
	l.ends = l.parent.Done() != nil
	// Parked until an update: invalid parameters, or an ended
	// params.Context (the first run happens regardless, rule 1).
	park := c.invalid != nil || (l.ranDo && l.parent.Err() != nil)
	if park || !due {
		c.mu.Unlock()
		return actWait, 0
	}
	// A run an update or trigger asked for waits out the debounce window
	// (debounce.go), but the first, and one held already.
	timedDue := waited&stTimed != 0 || l.dueAfterRun
	l.dueAfterRun = false
	if asked && c.mgr.debounce > 0 && l.ranDo && waited&stHeld == 0 && c.holdLocked(l, st, timedDue) {
		c.mu.Unlock()
		return actWait, 0
	}
	if c.runCtx == nil {
		c.newRunCtxLocked(l.parent)
		if st&stRemoved != 0 {
			c.cancelRunCtxLocked(removalCause(st))
		}
	}
	l.health, l.group, l.runCtx = c.params.Health, c.group, c.runCtx
	l.timeout = c.params.RunTimeout
	c.cancelOnUpdate = c.params.CancelDoFuncOnUpdate
	var group Group
	relabel := false
	if l.stale {
		// Only an update changes DoFunc, and every update leaves
		// stUpdate, which made l.stale.
		l.do, group = c.params.DoFunc, c.params.Group
		relabel, c.groupChanged = c.groupChanged, false
	}
	// The run's start, read once: the loop times the run from it too.
	start = l.offset()
	c.runStart = l.anchorNs + int64(start)
	c.state.Store(stRunning | st&(stRemoved|stClosed))
	c.mu.Unlock()
	if l.stale {
		c.adopt(l, group, relabel)
	}
	return actRun, start
}

// adopt makes the loop's own what follows from new parameters, once per
// set of them and outside mu: l.do, just taken from them, wrapped by the
// Manager's run middleware, and, when relabel says their group is another,
// the goroutine's pprof labels. group is the parameters' Group; l.timeout,
// set with l.do, their RunTimeout.
//
// Out of line: it runs after updates only, and its frame, with the
// middleware's, must not count in begin's.
//
//go:noinline
func (c *Controller) adopt(l *loop, group Group, relabel bool) {
	l.stale = false
	if relabel {
		c.relabel(group.Name)
	}
	if len(c.mgr.middleware) > 0 {
		l.do = c.wrapDo(l.do, group, l.timeout)
	}
}

// afterRun ends a run: it classifies the result (rule 3), records it and
// schedules the next run (rule 4) under the lock, then reports it to the
// metrics, the HealthReporter and the log.
//
// Out of line so that its locals never count in run's frame: an idle
// controller keeps run's frame on its stack, not afterRun's.
//
//go:noinline
func (c *Controller) afterRun(l *loop, err error, stack []byte, took time.Duration, end int64) {
	// A timed run timed out when its RunTimeout ended its context before
	// anything else did, or, its timer not yet fired, when it lasted that
	// long (rule 3).
	timedOut := l.timeout > 0 && (l.cut == cutTimeout || l.cut == cutNone && took >= l.timeout)
	o, err, msg := c.classify(l, err, stack, timedOut)
	if o == outcomeFailure {
		l.step++
	} else {
		l.step = 0
	}
	c.mu.Lock()
	c.lastRunDuration = took
	ev := c.recordLocked(o, err, msg, end)
	ev.gaveUp = c.scheduleLocked(l, o, end)
	c.mu.Unlock()
	if timedOut && o == outcomeFailure && stack == nil {
		// Counted here, not in report: see runEvent.
		c.met.countTimeout(l.group)
	}
	c.report(l, o, err, ev, stack, took)
}

// scheduleLocked sets the loop up for its next wait after a run that ended
// with o (rule 4): the timer is armed when the wait is timed and nothing
// is pending (a signal that came during the run is in the signal channel
// already). When something is pending, runStart still records when the
// timed run would be due, for the debounce (l.dueAfterRun). It reports
// whether this failure made the retries stop at MaxRetries.
func (c *Controller) scheduleLocked(l *loop, o outcome, end int64) (gaveUp bool) {
	p := &c.params
	var jitter time.Duration
	if p.Jitter > 0 {
		jitter = c.mgr.jitterN(p.Jitter)
	}
	wait, timed := nextWait(o, p, l.step, jitter)
	st := c.state.Load() &^ stRunning
	l.timed = timed && st == 0
	l.dueAfterRun = timed && st != 0
	if timed {
		// The timed run starts when the timer is due: end + wait,
		// saturating (a wait of the largest Duration never comes).
		c.runStart = end + int64(min(wait, time.Duration(math.MaxInt64-end)))
	}
	if l.timed {
		c.armTimerLocked(wait)
		st = stTimed
	}
	c.state.Store(st)
	return o == outcomeFailure && !p.NoErrorRetry && p.MaxRetries > 0 && l.step == p.MaxRetries
}

// armTimerLocked makes the timer fire after wait, reusing it: a run makes
// no timer of its own.
func (c *Controller) armTimerLocked(wait time.Duration) {
	switch {
	case c.timer == nil:
		c.timer = time.NewTimer(wait)
	case c.timerPoked && cap(c.timer.C) != 0:
		// A wake-up (wakeLocked) may have fired after the loop stopped
		// waiting. Go's timers drop its tick on Reset, but not under
		// GODEBUG=asynctimerchan=1, where the channel is buffered (the
		// cap tells): there, Stop may report the timer expired while its
		// tick is still on its way, so no drain can be sure to catch it,
		// and a tick landing after the drain would end the next wait at
		// once. The old timer is left to it; the loop waits on a new one.
		// Only after a wake-up, and only under that setting.
		// TestTimedRunNotCutShortByAStaleTick.
		c.timer.Stop()
		c.timer = time.NewTimer(wait)
		c.timerPoked = false
	default:
		c.timer.Reset(wait)
		c.timerPoked = false
	}
}

// finish ends the loop: StopFunc (rule 7), then termination.
//
// Out of line: it runs once, and its frame must not count in run's.
//
//go:noinline
func (c *Controller) finish(l *loop) {
	c.mu.Lock()
	if c.timer != nil {
		c.timer.Stop()
	}
	// An update to another group that no run followed (a removal came
	// with it) left the goroutine with the old group's label: the
	// StopFunc, of the newest parameters, runs under theirs (rule 8).
	relabel, group := c.groupChanged, c.params.Group.Name
	c.groupChanged = false
	c.mu.Unlock()
	if l.ranDo {
		if relabel {
			c.relabel(group)
		}
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
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(contextOrBackground(c.params.Context)))
	defer cancel(nil)
	// From here on the run context's fields hold the StopFunc's context,
	// so that expireStop cancels it with cancelRunCtxLocked.
	c.runCtx, c.runCtxCancel = ctx, cancel
	if c.stopExpired {
		cancel(causeStopDeadline.err())
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
	c.logStopFailure(ctx, err, stack)
	if health != nil {
		c.reportHealth(ctx, health, err)
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
