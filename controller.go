// controller.go: the Controller, its state bits and fields, what its
// Manager does to it, and what it tells its readers.

package controller

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
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
	// The fields are grouped by how they are guarded. Within that, they
	// are ordered and sized for an idle controller to cost as little
	// memory as possible (a process may hold a million of them): the
	// struct fills its 416-byte size class to the last byte, which
	// TestControllerStaysInItsSizeClass guards.

	// Immutable after construction.
	name string
	// uuid holds the raw bytes, formatted on demand (UUID, the statuses,
	// the log sink once): 20 bytes less than the 36-byte text, which pay
	// for runStart and params.RunTimeout.
	uuid [16]byte

	// Atomic. state leaves 4 bytes free before logs: the one hole in
	// the struct, for a future 4-byte field.
	state atomic.Uint32           // the st* bits; see the table below
	logs  atomic.Pointer[logSink] // the Manager's sink with the name and uuid added, built on first use
	// runStart is when the running DoFunc started, Unix nanoseconds; it
	// means something only while stRunning is set (runningSinceLocked).
	// An exception to the grouping: it is guarded by mu, and set by the
	// loop in begin as a run starts, and in scheduleLocked, as it arms the
	// timer, to the moment the timer is due. So a timed run, which the loop
	// claims without the lock, finds its start set already, and a run costs
	// no store to publish it; the start it shows is when the run was due,
	// earlier than when DoFunc was called by the scheduler's latency. It
	// sits here, after 32 bytes, to be 64-bit aligned on 32-bit platforms
	// too.
	runStart int64

	// Immutable after construction.
	mgr    *Manager      // the owner; its release is the loop's last act
	met    *Metrics      // the Manager's metrics (nil: off), fixed here so a run does not look them up
	signal chan struct{} // capacity 1; see wakeLocked

	// cohort is the stop cohort the controller joined when it was
	// removed: set under the Manager's lock before the removal, read by
	// the loop once it has seen the removal (which orders the two).
	cohort *stopCohort

	// mu guards every field below. Exceptions: runCtxLazy has a lock of
	// its own; newController and FakeManager call …Locked methods without
	// mu on a controller no other goroutine can see yet.
	mu sync.Mutex

	// timer wakes the loop from a timed wait (stTimed): made by the loop
	// on its first timed wait, reset by the loop to arm it and by
	// wakeLocked to fire it at once, and replaced by the loop after such a
	// wake-up under GODEBUG=asynctimerchan=1 (armTimerLocked). The loop
	// reads it without mu to wait on it: only the loop writes it.
	timer *time.Timer

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

	// The run context (rule 2), the context DoFunc gets; every name of
	// it starts with runCtx (the loop's copy is loop.runCtx). Derived
	// from params.Context; nil after replaceRunCtxLocked cancelled it for
	// an update or trigger, until the loop makes the next one before a
	// run (newRunCtxLocked). When params.Context is nil or Background it
	// is a *lazyCtx, the first one being runCtxLazy, which is part of the
	// Controller (runCtxLazyUsed says it has served); otherwise it comes
	// from context.WithCancelCause and runCtxCancel cancels it. Once the loop
	// has ended, runCtx and runCtxCancel hold the StopFunc's context
	// instead, so that expireStop cancels that one; and before the loop
	// starts, runCtx holds the context that carries the goroutine's pprof
	// labels, which the loop takes (takeLabelsLocked).
	runCtx       context.Context
	runCtxCancel context.CancelCauseFunc
	runCtxLazy   lazyCtx
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

	// Flags, packed at the end where they fill the struct's padding.
	cancelOnUpdate bool // CancelDoFuncOnUpdate of the running DoFunc's params
	attached       bool // installed: counted in controllers_failing while failing
	stopExpired    bool // a Shutdown deadline passed: StopFunc's context is cancelled
	runCtxLazyUsed bool // runCtxLazy has served as a run context
	timerPoked     bool // a change reset timer to wake the loop
	groupChanged   bool // the group changed since the goroutine's pprof labels were set (labels.go)
	fake           bool // immutable: made by FakeManager, no goroutine
}

// invalidParams are parameters that failed validation, kept for the
// status.
type invalidParams struct {
	err    error
	params ControllerParams
	next   *invalidParams // the next unreported ones; guarded by the controller's mu
}

// The bits of Controller.state, the run loop's state machine. Every change
// happens under mu, with one exception: the loop's lock-free claim of a
// timed run.
//
//	bit        set by                                cleared by
//	stRunning  the loop: begin (Store), or the       the loop: after the run
//	           lock-free claim (CAS stTimed→it)       (Store)
//	stUpdate   update, invalid ones too (Or)         the loop: begin (Store)
//	stTrigger  trigger (Or)                          the loop: begin (Store)
//	stRemoved  remove (Or)                           never
//	stDone     the loop's last act; remove for a     never
//	           fake controller (Or)
//	stTimed    the loop, arming the timer with       the loop: begin (And), or
//	           nothing else pending (Store)           the lock-free claim (CAS)
//	stClosed   remove, with stRemoved, when the      never
//	           Manager was shut down (Or)
//	stHeld     the loop, holding a run an update or  the loop: begin (And)
//	           trigger asked for until the debounce
//	           window ends (Store, with their bits;
//	           it waits on timer)
//
// Others only ever add bits, with Or: a Load followed by a Store could undo
// the claim. Every change a run depends on (new parameters, a trigger, a
// removal, a cancelled run context) sets a bit, and the loop stores stTimed
// alone. So when the timer fires and CompareAndSwap(stTimed, stRunning)
// succeeds, nothing changed since the loop armed the timer, and what it
// cached under mu (DoFunc, HealthReporter, group, run context) is still
// current: the run needs no lock. The one change that sets no bit, the end
// of params.Context, the loop checks before claiming.
const (
	stRunning uint32 = 1 << iota // a DoFunc is running
	stUpdate                     // an update is pending
	stTrigger                    // a trigger is pending
	stRemoved                    // removed from its Manager
	stDone                       // the loop and StopFunc are done
	stTimed                      // the loop waits on timer
	stClosed                     // removed by Shutdown: the run context's cause (cancelcause.go)
	stHeld                       // the loop waits on timer for a debounce window to end, a run pending (debounce.go)
)

// Name returns the name the controller was installed under.
func (c *Controller) Name() string { return c.name }

// UUID returns the controller's unique id, a random (version 4) UUID. It
// stays the same across updates; a controller installed again under the
// same name after a removal gets a new one.
//
// Each call formats the string anew (one allocation): the Controller
// keeps only the 16 raw bytes.
func (c *Controller) UUID() string {
	var b [36]byte
	formatUUID(b[:], c.uuid)
	return string(b[:])
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

// runningSinceLocked returns when the running DoFunc started, Unix
// nanoseconds; 0 when none runs. The caller holds mu.
func (c *Controller) runningSinceLocked() int64 {
	if c.state.Load()&stRunning == 0 {
		return 0
	}
	return c.runStart
}

// runningSince is runningSinceLocked for a caller without mu.
func (c *Controller) runningSince() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.runningSinceLocked()
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
	c.fillStatus(s, s.Configuration, s.Status, c.UUID(), time.Now().UnixNano())
	return s
}

// fillStatus fills a status of c at now (Unix nanoseconds) into s, cfg and
// st, which are zero; uuid is c's UUID, formatted by the caller (a whole
// list's into one string, for statusesOf). It sets field by field: a composite literal would be built
// aside and copied in, through write barriers while the GC marks.
func (c *Controller) fillStatus(s *ControllerStatus, cfg *ControllerStatusConfiguration, st *ControllerStatusStatus, uuid string, now int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := &c.params
	if c.invalid != nil {
		p = &c.invalid.params
	}
	cfg.ErrorRetry = !p.NoErrorRetry
	cfg.ErrorRetryBase = Duration(p.retryBase())
	cfg.Interval = Duration(p.RunInterval)
	cfg.Group = p.Group.Name
	cfg.MaxRetryInterval = Duration(p.MaxRetryInterval)
	cfg.Backoff = p.Backoff
	cfg.MaxRetries = int64(p.MaxRetries)
	cfg.Jitter = Duration(p.Jitter)
	cfg.RunTimeout = Duration(p.RunTimeout)

	st.SuccessCount = c.successCount
	st.FailureCount = c.failureCount
	st.ConsecutiveFailureCount = c.consecutiveFailures
	st.LastFailureMsg = c.lastErrMsg
	st.LastFailureTimestamp = statusTime(c.lastErrTime)
	st.LastSuccessTimestamp = statusTime(c.lastSuccessTime)
	st.LastRunDuration = Duration(c.lastRunDuration)
	if start := c.runningSinceLocked(); start != 0 {
		t := statusTime(start)
		st.RunningSince = &t
		st.Stuck, _, _, _ = c.stuckLocked(now)
	}

	s.Name, s.UUID, s.Configuration, s.Status = c.name, uuid, cfg, st
}

// newController returns a controller for params, not yet started. verr is
// params.Validate(); group holds the metrics children of params.Group. The
// caller holds m.mu. It calls setParamsLocked without c.mu: no other
// goroutine can see c yet.
func newController(m *Manager, name string, params ControllerParams, verr error, group *groupHandles) *Controller {
	if !m.sinkSet {
		m.sink, m.sinkSet = m.newSink(), true
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
	c.runCtx, c.groupChanged = labelsContext(name, c.params.Group.Name), false
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
		c.groupChanged = c.groupChanged || params.Group.Name != c.params.Group.Name
		c.params, c.invalid = params, nil
	}
	if cancelRun {
		c.replaceRunCtxLocked(causeUpdated)
	}
	return old
}

// trigger asks for a run at once, keeping the retry step.
func (c *Controller) trigger() {
	c.mu.Lock()
	old := c.state.Or(stTrigger)
	c.wakeLocked(old)
	if old&stRunning != 0 && c.cancelOnUpdate {
		c.replaceRunCtxLocked(causeTriggered)
	}
	c.mu.Unlock()
}

// remove stops the controller: the running DoFunc is cancelled, no other
// one starts, and the loop goes on to the StopFunc. The caller holds the
// Manager's lock and has taken c out of the Manager; shutDown says the
// Manager was shut down, which the run context's cause tells.
func (c *Controller) remove(shutDown bool) {
	bits, cause := stRemoved, causeRemoved
	if shutDown {
		bits, cause = stRemoved|stClosed, causeShutDown
	}
	c.mu.Lock()
	old := c.state.Or(bits)
	c.wakeLocked(old)
	if old&stHeld != 0 {
		c.pokeTimerLocked() // the held run is not to be: the removal wins
	}
	if c.attached && c.consecutiveFailures > 0 {
		c.met.addFailing(-1)
	}
	c.attached = false
	c.cancelRunCtxLocked(cause)
	if c.fake {
		c.markDoneLocked()
	}
	c.mu.Unlock()
}

// expireStop cancels the StopFunc's context, now or when it starts.
func (c *Controller) expireStop() {
	c.mu.Lock()
	c.stopExpired = true
	c.cancelRunCtxLocked(causeStopDeadline) // the run context, or the StopFunc's once it runs
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

// wakeLocked wakes the loop after a state change; old is the state before
// it. A timed wait is woken by firing the timer now, any other wait by the
// signal channel; but for a run held to the end of a debounce window
// (stHeld), which an update or trigger joins without waking the loop (a
// removal fires the timer: remove).
func (c *Controller) wakeLocked(old uint32) {
	switch {
	case old&stTimed != 0:
		c.pokeTimerLocked()
	case old&stHeld != 0:
	default:
		select {
		case c.signal <- struct{}{}:
		default:
		}
	}
}

// pokeTimerLocked fires the timer the loop waits on now.
func (c *Controller) pokeTimerLocked() {
	c.timer.Reset(0)
	c.timerPoked = true
}
