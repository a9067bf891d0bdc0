package controller

import (
	"context"
	crand "crypto/rand"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/google/uuid"
	"github.com/sirupsen/logrus"
)

// Controller is one named, retrying background task installed in a
// [Manager] with [Manager.UpdateController]. It runs its DoFunc in a
// goroutine of its own until it succeeds, re-runs it on its interval, and
// runs its StopFunc when it is removed.
//
// A Controller is owned by its Manager: the methods here only read it, and
// are safe for concurrent use. Keep the *Controller only to read its
// statistics; change it through the Manager, by name.
type Controller struct {
	// The fields are ordered and sized for an idle controller to cost as
	// little memory as possible: a process may hold a million of them.

	name string
	uuid [36]byte // immutable; UUID() views it as a string

	// state holds the st* bits. It is written under mu, except for the
	// loop's lock-free claim of a timed run (CompareAndSwap), so the
	// bits others set must be set with Or: a Load followed by a Store
	// could undo the claim.
	state atomic.Uint32

	mgr *Manager
	log atomic.Pointer[logrus.Entry] // built on first use, once
	// The Manager's metrics (nil: off), fixed when the controller is made
	// so a run does not look them up.
	met *Metrics
	// cohort is the stop cohort the controller joined when it was
	// removed: set under the Manager's lock before the removal, read by
	// the loop once it has seen the removal.
	cohort *stopCohort

	// signal wakes the run loop from an untimed wait after state or a
	// field under mu changed. Its capacity of one coalesces wake-ups; the
	// loop reads the state. During a timed wait (stTimed) the loop waits
	// on timer instead, and a change resets the timer to fire at once:
	// the loop always waits on a single channel, which is cheaper than a
	// select.
	signal chan struct{}
	timer  *time.Timer // made by the loop on its first timed wait

	mu sync.Mutex

	// params are the newest valid parameters: what runs, what StopFunc
	// and the run context come from. When the newest parameters are
	// invalid, invalid holds them with the validation error; DoFunc does
	// not run until an update repairs them.
	params  ControllerParams
	invalid *invalidParams
	group   *groupHandles // metrics children of the newest group
	// unreported lists, oldest first, the invalid parameters the loop has
	// yet to log and tell their HealthReporter about, also those an
	// update superseded.
	unreported *invalidParams

	// The run context (rule 2): derived from params.Context, replaced
	// lazily by the loop after it was cancelled for an update or trigger
	// (then runCtx is nil). It is a *runContext when params.Context is nil
	// or Background, the first one being rctx; otherwise it comes from
	// context.WithCancel and runCancel cancels it. Once the loop has
	// ended, they hold the StopFunc's context instead.
	runCtx    context.Context
	runCancel context.CancelFunc
	rctx      runContext
	// terminated is made on demand and closed once the loop and the
	// StopFunc are done (stDone).
	terminated chan struct{}

	// Statistics. Times are Unix nanoseconds, 0 for never.
	successCount        int64
	failureCount        int64
	consecutiveFailures int64
	lastErr             error
	lastErrMsg          string
	lastErrTime         int64
	lastSuccessTime     int64
	lastRunDuration     time.Duration

	cancelOnUpdate bool // CancelDoFuncOnUpdate of the running DoFunc's params
	attached       bool // installed: counted in controllers_failing while failing
	stopExpired    bool // a Shutdown deadline passed: StopFunc's context is cancelled
	fake           bool // made by FakeManager: no goroutine
	rctxUsed       bool // rctx has served as a run context
	timerPoked     bool // a change reset timer to wake the loop
}

// invalidParams are parameters that failed validation, kept for the
// status.
type invalidParams struct {
	err    error
	params ControllerParams
	next   *invalidParams // the next unreported ones; guarded by the controller's mu
}

// Bits of Controller.state.
const (
	stRunning uint32 = 1 << iota // a DoFunc is running
	stUpdate                     // an update is pending
	stTrigger                    // a trigger is pending
	stRemoved                    // removed from its Manager
	stDone                       // the loop and StopFunc are done
	stTimed                      // the loop waits on timer
)

// Name returns the name the controller was installed under.
func (c *Controller) Name() string { return c.name }

// UUID returns the controller's unique id, a random (version 4) UUID. It
// stays the same across updates; a controller installed again under the
// same name after a removal gets a new one.
func (c *Controller) UUID() string {
	// The bytes never change after construction, so a string may share
	// them: UUID and GetStatusModel cost no allocation.
	return unsafe.String(&c.uuid[0], len(c.uuid))
}

// GetSuccessCount returns the number of successful runs, runs that ended
// with an [ExitReason] included.
func (c *Controller) GetSuccessCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return int(c.successCount)
}

// GetFailureCount returns the number of failed runs, failed StopFuncs and
// invalid parameters the controller was given, over its whole life.
func (c *Controller) GetFailureCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return int(c.failureCount)
}

// GetConsecutiveFailureCount returns the number of failures since the last
// success. The controller is failing while it is above zero.
func (c *Controller) GetConsecutiveFailureCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return int(c.consecutiveFailures)
}

// GetLastError returns the error of the last failure, or the [ExitReason]
// of the last run; nil after a plain success.
func (c *Controller) GetLastError() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lastErr
}

// GetLastErrorTimestamp returns when the last failure was recorded; the zero
// time if it never failed.
func (c *Controller) GetLastErrorTimestamp() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return unixTime(c.lastErrTime)
}

// GetLastSuccessTimestamp returns when the last successful run returned; the
// zero time if none did.
func (c *Controller) GetLastSuccessTimestamp() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return unixTime(c.lastSuccessTime)
}

func unixTime(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// statusTime is a time as the status shows it: in UTC, so that it survives
// a JSON round trip unchanged.
func statusTime(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns).UTC()
}

// GetStatusModel returns a snapshot of the controller's configuration and
// statistics, in the form of Cilium's REST model.
func (c *Controller) GetStatusModel() *ControllerStatus {
	s := &ControllerStatus{
		Configuration: &ControllerStatusConfiguration{},
		Status:        &ControllerStatusStatus{},
	}
	c.fillStatus(s, s.Configuration, s.Status)
	return s
}

func (c *Controller) fillStatus(s *ControllerStatus, cfg *ControllerStatusConfiguration, st *ControllerStatusStatus) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := &c.params
	if c.invalid != nil {
		p = &c.invalid.params
	}
	*cfg = ControllerStatusConfiguration{
		ErrorRetry:       !p.NoErrorRetry,
		ErrorRetryBase:   Duration(p.retryBase()),
		Interval:         Duration(p.RunInterval),
		Group:            p.Group.Name,
		MaxRetryInterval: Duration(p.MaxRetryInterval),
		MaxRetries:       int64(p.MaxRetries),
		Jitter:           Duration(p.Jitter),
	}
	*st = ControllerStatusStatus{
		SuccessCount:            c.successCount,
		FailureCount:            c.failureCount,
		ConsecutiveFailureCount: c.consecutiveFailures,
		LastFailureMsg:          c.lastErrMsg,
		LastFailureTimestamp:    statusTime(c.lastErrTime),
		LastSuccessTimestamp:    statusTime(c.lastSuccessTime),
		LastRunDuration:         Duration(c.lastRunDuration),
	}
	*s = ControllerStatus{Name: c.name, UUID: c.UUID(), Configuration: cfg, Status: st}
}

// newController returns a controller for params, not yet started. verr is
// params.Validate(); group holds the metrics children of params.Group. The
// caller holds m.mu.
func newController(m *Manager, name string, params ControllerParams, verr error, group *groupHandles) *Controller {
	if m.levels == nil {
		m.levels = m.logger().Logger
	}
	c := &Controller{
		name:     name,
		mgr:      m,
		met:      m.metricsOrDefault(),
		signal:   make(chan struct{}, 1),
		attached: true,
	}
	newUUID(&c.uuid)
	c.setParamsLocked(params, verr, group)
	return c
}

// update applies new parameters: DoFunc runs at once and the retry step
// restarts (rule 5).
func (c *Controller) update(params ControllerParams, verr error, group *groupHandles) {
	c.mu.Lock()
	c.wakeLocked(c.setParamsLocked(params, verr, group))
	c.mu.Unlock()
}

// setParamsLocked applies params and marks an update pending. It returns
// the state before, for the caller to wake the loop; a new controller's
// loop needs no waking.
func (c *Controller) setParamsLocked(params ControllerParams, verr error, group *groupHandles) (old uint32) {
	old = c.state.Or(stUpdate)
	c.group = group
	cancelRun := old&stRunning != 0 && c.cancelOnUpdate
	if verr != nil {
		c.invalid = &invalidParams{err: verr, params: params}
		last := &c.unreported
		for *last != nil {
			last = &(*last).next
		}
		*last = c.invalid
		c.recordFailureLocked(verr, verr.Error(), time.Now().UnixNano())
	} else {
		if !sameContext(params.Context, c.params.Context) {
			cancelRun = true
		}
		c.params, c.invalid = params, nil
	}
	if cancelRun {
		c.cancelRunLocked()
	}
	return old
}

// trigger asks for a run at once, keeping the retry step.
func (c *Controller) trigger() {
	c.mu.Lock()
	old := c.state.Or(stTrigger)
	c.wakeLocked(old)
	if old&stRunning != 0 && c.cancelOnUpdate {
		c.cancelRunLocked()
	}
	c.mu.Unlock()
}

// remove stops the controller: the running DoFunc is cancelled, no other
// one starts, and the loop goes on to the StopFunc. The caller holds the
// Manager's lock and has taken c out of the Manager.
func (c *Controller) remove() {
	c.mu.Lock()
	old := c.state.Or(stRemoved)
	c.wakeLocked(old)
	if c.attached && c.consecutiveFailures > 0 {
		c.met.addFailing(-1)
	}
	c.attached = false
	c.cancelRunCtxLocked()
	if c.fake {
		c.markDoneLocked()
	}
	c.mu.Unlock()
}

// expireStop cancels the StopFunc's context, now or when it starts.
func (c *Controller) expireStop() {
	c.mu.Lock()
	c.stopExpired = true
	c.cancelRunCtxLocked() // the run context, or the StopFunc's once it runs
	c.mu.Unlock()
}

// done reports whether the controller has terminated.
func (c *Controller) done() bool { return c.state.Load()&stDone != 0 }

// terminationChannel returns the channel closed on termination, making it
// on first use.
func (c *Controller) terminationChannel() chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.terminated == nil {
		c.terminated = make(chan struct{})
		if c.done() {
			close(c.terminated)
		}
	}
	return c.terminated
}

func (c *Controller) markDoneLocked() {
	c.state.Or(stDone)
	if c.terminated != nil {
		close(c.terminated)
	}
}

func (c *Controller) cancelRunLocked() {
	c.cancelRunCtxLocked()
	c.runCtx, c.runCancel = nil, nil
}

// cancelRunCtxLocked cancels the current run context, if any.
func (c *Controller) cancelRunCtxLocked() {
	switch {
	case c.runCancel != nil:
		c.runCancel()
	case c.runCtx != nil:
		c.runCtx.(*runContext).cancel()
	}
}

// newRunCtxLocked makes the run context for a run under parent.
func (c *Controller) newRunCtxLocked(parent context.Context) {
	if parent != context.Background() {
		c.runCtx, c.runCancel = context.WithCancel(parent)
		return
	}
	rc := &c.rctx
	if c.rctxUsed {
		rc = new(runContext) // replaced after CancelDoFuncOnUpdate: rare
	}
	c.rctxUsed = true
	c.runCtx, c.runCancel = rc, nil
}

// wakeLocked wakes the loop after a state change; old is the state before
// it. A timed wait is woken by firing the timer now, any other wait by the
// signal channel.
func (c *Controller) wakeLocked(old uint32) {
	if old&stTimed != 0 {
		c.timer.Reset(0)
		c.timerPoked = true
		return
	}
	select {
	case c.signal <- struct{}{}:
	default:
	}
}

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

// reportInvalid logs invalid parameters and tells their HealthReporter,
// from the controller's goroutine.
func (c *Controller) reportInvalid(inv *invalidParams) {
	c.logInvalid(inv.err)
	if inv.params.Health != nil {
		c.reportHealth(inv.params.Health, inv.err)
	}
}

func (c *Controller) logInvalid(err error) {
	defer recoverLog(c.name)
	c.logger().WithError(err).Error("invalid controller parameters; DoFunc will not run until an update brings valid ones")
}

// mayBeCancelled reports whether the run context may have been cancelled:
// only a removal, an update or a trigger (which leave their bit in the
// state) or the end of params.Context cancel it. It spares a failed run the
// question to the context.
func (c *Controller) mayBeCancelled(l *loop) bool {
	return l.ends || c.state.Load()&(stRemoved|stUpdate|stTrigger) != 0
}

// afterRun records the outcome of a run (rule 3), arms the timer for the
// next one (rule 4), and reports the run to metrics, the HealthReporter and
// the log.
//
//go:noinline
func (c *Controller) afterRun(l *loop, err error, stack []byte, took time.Duration, end int64) {
	o := outcomeSuccess
	var msg string
	switch {
	case err == nil:
	case stack != nil:
		o = outcomeFailure // a panic is a failure, cancelled or not
		msg = err.Error()  // our own panicError
	case c.mayBeCancelled(l) && l.ctx.Err() != nil:
		err, msg, o = errContextCanceled, errContextCanceled.Error(), outcomeExit
	default:
		returned := err
		// The same value as the last failure is a failure again, without
		// asking its chain; its message is read anew all the same.
		again := identical(err, l.lastFailure)
		var exit bool
		err, msg, exit = inspectError(err, !again)
		_, unreadable := err.(*unreadableError)
		switch {
		case exit:
			o = outcomeExit
		case unreadable:
			o = outcomeFailure // and inspected in full next time too
		default:
			o = outcomeFailure
			l.lastFailure = returned
		}
	}
	if o == outcomeFailure {
		l.step++
	} else {
		l.step = 0
		l.lastFailure = nil
	}

	c.mu.Lock()
	c.lastRunDuration = took
	ev := c.recordLocked(o, err, msg, end)
	p := &c.params
	var jitter time.Duration
	if p.Jitter > 0 {
		jitter = rand.N(p.Jitter)
	}
	wait, timed := nextWait(o, p, l.step, jitter)
	ev.gaveUp = o == outcomeFailure && !p.NoErrorRetry && p.MaxRetries > 0 && l.step == p.MaxRetries
	// Arm the timer only when nothing is pending: a signal that came
	// during the run is already in the signal channel.
	st := c.state.Load() &^ stRunning
	l.timed = timed && st == 0
	if l.timed {
		switch {
		case c.timer == nil:
			c.timer = time.NewTimer(wait)
		case c.timerPoked:
			// A wake-up may have fired after the loop stopped waiting.
			// Go's timers drop it on Reset, unless the program runs with
			// GODEBUG=asynctimerchan=1: then it must be drained here, or
			// the next wait would end at once.
			if !c.timer.Stop() {
				select {
				case <-c.timer.C:
				default:
				}
			}
			c.timerPoked = false
			c.timer.Reset(wait)
		default:
			c.timer.Reset(wait)
		}
		st = stTimed
	}
	c.state.Store(st)
	c.mu.Unlock()

	c.met.observeRun(l.group, o == outcomeFailure, took)
	if stack != nil {
		c.met.countPanic(l.group)
	}
	if l.health != nil {
		if o == outcomeFailure {
			c.reportHealth(l.health, err)
		} else {
			c.reportHealth(l.health, nil)
		}
	}
	if ev.any() || c.mgr.levels.IsLevelEnabled(logrus.DebugLevel) {
		c.logRun(o, err, ev, stack, l.step, took)
	}
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

func (c *Controller) logStopFailure(err error, stack []byte) {
	defer recoverLog(c.name)
	if stack != nil {
		c.logger().WithError(err).WithField("stack", string(stack)).Error("StopFunc panicked")
	} else {
		c.logger().WithError(err).Warn("StopFunc failed")
	}
}

// recoverLog, deferred around logging on a controller's goroutine, keeps a
// panicking logrus hook or formatter from ending that goroutine, and the
// program with it. The panic goes to standard error, where logrus reports
// a hook that fails.
func recoverLog(name string) {
	if r := recover(); r != nil {
		fmt.Fprintf(os.Stderr, "controller %q: logging panicked: %v\n", name, r)
	}
}

// runEvent is what a recorded run changed, for the log lines after it.
type runEvent struct {
	recoveredAfter int64 // a streak of this many failures just ended
	streakStart    bool  // the first failure of a streak
	msgChanged     bool  // a failure within a streak, with a new message
	gaveUp         bool  // the retry step reached MaxRetries
}

func (ev runEvent) any() bool {
	return ev.recoveredAfter > 0 || ev.streakStart || ev.msgChanged || ev.gaveUp
}

// recordLocked records the outcome of a run (rule 3); msg is err's
// message. Parameters that became invalid while the run went on stay
// visible as the last error.
func (c *Controller) recordLocked(o outcome, err error, msg string, now int64) runEvent {
	var ev runEvent
	if o == outcomeFailure {
		ev.streakStart = c.consecutiveFailures == 0
		ev.msgChanged = c.recordFailureLocked(err, msg, now) && !ev.streakStart
	} else {
		c.successCount++
		c.lastSuccessTime = now
		ev.recoveredAfter = c.consecutiveFailures
		c.setConsecutiveLocked(0)
		c.lastErr, c.lastErrMsg = nil, ""
		if o == outcomeExit {
			c.lastErr, c.lastErrMsg = err, msg
		}
	}
	if c.invalid != nil {
		ev.recoveredAfter = 0
		c.setConsecutiveLocked(max(c.consecutiveFailures, 1))
		c.lastErr, c.lastErrMsg = c.invalid.err, c.invalid.err.Error()
	}
	return ev
}

// recordFailureLocked records a failure with err, whose message is msg, and
// reports whether the last error's message changed. The message is read
// anew for every failure, never assumed from the error value: an error
// value may be reused with a new text.
func (c *Controller) recordFailureLocked(err error, msg string, now int64) (msgChanged bool) {
	c.failureCount++
	c.setConsecutiveLocked(c.consecutiveFailures + 1)
	msgChanged = msg != c.lastErrMsg // the same string, as a reused message is, compares by pointer first
	c.lastErr, c.lastErrMsg, c.lastErrTime = err, msg, now
	return msgChanged
}

// inspectError reads err's message and, when classify is set, whether it
// is an [ExitReason]. Both ask err's own methods (Error, and Unwrap or As
// along its chain), which may panic: a typed nil pointer returned as an
// error is the classic case. Such a panic is recovered, and err is replaced
// by an error whose message says so and names err's type, so that one
// buggy DoFunc cannot end the process. It allocates only then.
func inspectError(err error, classify bool) (read error, msg string, exit bool) {
	method := "Error"
	defer func() {
		if r := recover(); r != nil {
			u := &unreadableError{msg: fmt.Sprintf("error of type %T: its %s method panicked: %v", err, method, r)}
			read, msg, exit = u, u.msg, false
		}
	}()
	if classify {
		method = "Unwrap or As"
		exit = isExitReason(err)
		method = "Error"
	}
	return err, err.Error(), exit
}

// unreadableError stands in for an error whose methods panicked.
type unreadableError struct{ msg string }

func (e *unreadableError) Error() string { return e.msg }

// identical reports whether a and b are the very same error value: the same
// dynamic type and the same pointer. Unlike ==, it never panics on an
// incomparable type, and it says false for equal values stored apart. It
// only spares the loop classifying an error value it has classified
// already; it says nothing of the message, which a reused error value may
// have changed (so the message is read every time). A reused value whose
// chain gains or loses an ExitReason between returns keeps its first
// classification for as long as it keeps failing.
func identical(a, b error) bool {
	return a != nil && *(*[2]unsafe.Pointer)(unsafe.Pointer(&a)) == *(*[2]unsafe.Pointer)(unsafe.Pointer(&b))
}

// setConsecutiveLocked keeps controllers_failing in step with the failing
// state, so the gauge agrees with Health and FormatStatus.
func (c *Controller) setConsecutiveLocked(n int64) {
	if c.attached && (c.consecutiveFailures > 0) != (n > 0) {
		c.failingChanged(n > 0)
	}
	c.consecutiveFailures = n
}

// failingChanged moves controllers_failing as the controller starts or
// stops failing. It is kept out of line so that setConsecutiveLocked, on
// every run's path, is small enough to inline.
//
//go:noinline
func (c *Controller) failingChanged(failing bool) {
	if failing {
		c.met.addFailing(1)
	} else {
		c.met.addFailing(-1)
	}
}

// logRun logs what a run changed: at Debug every run, at Warn the start of
// a failure streak and a new message within one, at Info a recovery and
// giving up, at Error a panic (once per streak or message).
//
//go:noinline
func (c *Controller) logRun(o outcome, err error, ev runEvent, stack []byte, step int, took time.Duration) {
	defer recoverLog(c.name)
	if c.mgr.levels.IsLevelEnabled(logrus.DebugLevel) {
		c.logger().WithFields(logrus.Fields{
			"duration": took,
			"outcome":  outcomeNames[o],
			"error":    err,
		}).Debug("controller run")
	}
	switch {
	case stack != nil && (ev.streakStart || ev.msgChanged):
		c.logger().WithError(err).WithField("stack", string(stack)).Error("DoFunc panicked")
	case ev.streakStart:
		c.logger().WithError(err).Warn("controller failed; retrying")
	case ev.msgChanged:
		c.logger().WithError(err).Warn("controller still failing with a new error")
	case ev.recoveredAfter > 0:
		c.logger().Infof("recovered after %d consecutive failures", ev.recoveredAfter)
	}
	if ev.gaveUp {
		c.logger().WithError(err).Infof("giving up retrying after %d failures; next run on an update, a trigger or the RunInterval", step)
	}
}

var outcomeNames = [...]string{outcomeSuccess: "success", outcomeExit: "exit", outcomeFailure: "failure"}

// reportHealth calls h.OK (err nil) or h.Degraded, recovering a panic.
func (c *Controller) reportHealth(h HealthReporter, err error) {
	defer func() {
		if r := recover(); r != nil {
			c.logHealthPanic(r)
		}
	}()
	if err == nil {
		h.OK(c.name)
	} else {
		h.Degraded(c.name, err)
	}
}

func (c *Controller) logHealthPanic(r any) {
	defer recoverLog(c.name)
	c.logger().WithField("panic", r).WithField("stack", string(debug.Stack())).Error("HealthReporter panicked")
}

// logger returns the controller's log entry, building it on first use.
func (c *Controller) logger() *logrus.Entry {
	if e := c.log.Load(); e != nil {
		return e
	}
	e := c.mgr.logger().WithFields(logrus.Fields{"name": c.name, "uuid": c.UUID()})
	if !c.log.CompareAndSwap(nil, e) {
		e = c.log.Load()
	}
	return e
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

func contextOrBackground(ctx context.Context) context.Context {
	if ctx == nil {
		return context.Background()
	}
	return ctx
}

// sameContext reports whether a and b are the same parent context (nil
// being Background), without panicking on a context type that is not
// comparable.
func sameContext(a, b context.Context) (same bool) {
	defer func() {
		if recover() != nil {
			same = false
		}
	}()
	return contextOrBackground(a) == contextOrBackground(b)
}

// ids hands out the random bytes of UUIDs from a buffer refilled from
// crypto/rand, so creating a controller does not cost a system call. It
// changes no setting of the uuid package.
var ids struct {
	sync.Mutex
	buf  [16 * 256]byte
	left int // UUIDs left in buf
}

// newUUID writes a random (version 4) UUID in its canonical form to dst.
func newUUID(dst *[36]byte) {
	var u uuid.UUID
	ids.Lock()
	if ids.left == 0 {
		_, _ = crand.Read(ids.buf[:]) // never fails (crypto/rand.Read, Go ≥ 1.24)
		ids.left = len(ids.buf) / 16
	}
	ids.left--
	copy(u[:], ids.buf[ids.left*16:])
	ids.Unlock()
	u[6] = u[6]&0x0f | 0x40 // version 4
	u[8] = u[8]&0x3f | 0x80 // RFC 4122 variant
	formatUUID(dst, u)
}

// formatUUID writes u as xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx.
func formatUUID(dst *[36]byte, u uuid.UUID) {
	const hexDigits = "0123456789abcdef"
	j := 0
	for i, b := range u {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			dst[j] = '-'
			j++
		}
		dst[j], dst[j+1] = hexDigits[b>>4], hexDigits[b&0x0f]
		j += 2
	}
}

// runContext is the run context of a controller whose params.Context is
// nil or Background: a cancellable context that costs no allocation while
// DoFunc only asks Err. The first call that needs more (Done, Value) makes
// a context.WithCancel and delegates to it from then on, so children,
// context.Cause and context.AfterFunc work through the standard machinery,
// with no goroutine.
type runContext struct {
	mu          sync.Mutex
	cancelled   atomic.Bool     // set under mu; read without it by Err
	hasInner    atomic.Bool     // inner is made: Err asks it, as Done does
	inner       context.Context // made on demand
	cancelInner context.CancelFunc
}

func (r *runContext) innerCtx() context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.inner == nil {
		r.inner, r.cancelInner = context.WithCancel(context.Background())
		if r.cancelled.Load() {
			r.cancelInner()
		}
		r.hasInner.Store(true)
	}
	return r.inner
}

func (r *runContext) cancel() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cancelled.Store(true)
	if r.cancelInner != nil {
		r.cancelInner()
	}
}

// Deadline implements [context.Context]: a run context has none.
func (r *runContext) Deadline() (time.Time, bool) { return time.Time{}, false }

// Done implements [context.Context].
func (r *runContext) Done() <-chan struct{} { return r.innerCtx().Done() }

// Err implements [context.Context].
func (r *runContext) Err() error {
	if r.hasInner.Load() {
		// Done's channel may not be closed yet while cancel runs: Err
		// must not say cancelled before it is.
		return r.inner.Err()
	}
	if r.cancelled.Load() {
		return context.Canceled
	}
	return nil
}

// Value implements [context.Context]. It carries no values of its own; it
// answers for the context it delegates to once that exists, which is how
// the context package finds it to attach children and causes.
func (r *runContext) Value(key any) any {
	r.mu.Lock()
	inner := r.inner
	r.mu.Unlock()
	if inner == nil {
		return nil
	}
	return inner.Value(key)
}

// String names the context in debugging output.
func (r *runContext) String() string { return "controller.runContext" }
