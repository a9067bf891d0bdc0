package controller

import (
	"context"
	crand "crypto/rand"
	"fmt"
	"math/rand/v2"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

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
	name    string
	uuid    string
	mgr     *Manager
	metrics *Metrics                     // nil: metrics off
	fake    bool                         // made by FakeManager: no goroutine
	log     atomic.Pointer[logrus.Entry] // built on first use, once

	// signal wakes the run loop after a field under mu changed. Its
	// capacity of one coalesces wake-ups; the loop reads the fields.
	signal chan struct{}
	// terminated is closed once the loop and the StopFunc are done.
	terminated chan struct{}

	mu sync.Mutex

	// What the loop is asked to do.
	params         ControllerParams // the newest, valid or not
	invalid        error            // params.Validate() of the newest params
	pendingUpdate  bool
	pendingTrigger bool
	removed        bool
	// attached: installed in the Manager, so counted in
	// controllers_failing while consecutiveFailures > 0.
	attached bool

	// The run context (rule 2): runCtx is derived from runParent and is
	// replaced lazily, by the loop, after it was cancelled for an update
	// or trigger (then runCtx is nil).
	runParent      context.Context
	runCtx         context.Context
	runCancel      context.CancelFunc
	running        bool // a DoFunc is running
	cancelOnUpdate bool // its params' CancelDoFuncOnUpdate

	// What removal runs: the StopFunc and Context of the newest valid
	// parameters. stopExpired is set when a Shutdown deadline passed.
	stopFunc    ControllerFunc
	stopParent  context.Context
	stopCancel  context.CancelFunc
	stopExpired bool

	// Statistics.
	successCount        int64
	failureCount        int64
	consecutiveFailures int64
	lastErr             error
	lastErrMsg          string
	lastErrTime         time.Time
	lastSuccessTime     time.Time
	lastRunDuration     time.Duration
}

// Name returns the name the controller was installed under.
func (c *Controller) Name() string { return c.name }

// UUID returns the controller's unique id, a random (version 4) UUID. It
// stays the same across updates; a controller installed again under the
// same name after a removal gets a new one.
func (c *Controller) UUID() string { return c.uuid }

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
	return c.lastErrTime
}

// GetLastSuccessTimestamp returns when the last successful run returned; the
// zero time if none did.
func (c *Controller) GetLastSuccessTimestamp() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lastSuccessTime
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
	*s = ControllerStatus{Name: c.name, UUID: c.uuid, Configuration: cfg, Status: st}
}

// statusTime is t as the status shows it: in UTC, without the monotonic
// clock reading, so it survives a JSON round trip unchanged.
func statusTime(t time.Time) time.Time {
	if t.IsZero() {
		return time.Time{}
	}
	return t.Round(0).UTC()
}

// newController returns a controller for params, not yet started.
// verr is params.Validate().
func newController(m *Manager, name string, params ControllerParams, verr error) *Controller {
	c := &Controller{
		name:       name,
		uuid:       newUUID(),
		mgr:        m,
		metrics:    m.metricsOrDefault(),
		signal:     make(chan struct{}, 1),
		terminated: make(chan struct{}),
		attached:   true,
	}
	c.runParent = contextOrBackground(params.Context)
	c.setParamsLocked(params, verr)
	c.pendingUpdate = false // the first run is not an update
	return c
}

// update applies new parameters (rule 5: run at once, retry step reset).
func (c *Controller) update(params ControllerParams, verr error) {
	c.mu.Lock()
	c.setParamsLocked(params, verr)
	c.mu.Unlock()
	c.notify()
}

func (c *Controller) setParamsLocked(params ControllerParams, verr error) {
	c.params, c.invalid, c.pendingUpdate = params, verr, true
	if verr != nil {
		c.recordFailureLocked(verr, time.Now())
		return
	}
	parent := contextOrBackground(params.Context)
	c.stopFunc, c.stopParent = params.StopFunc, parent
	if !sameContext(parent, c.runParent) {
		c.runParent = parent
		c.cancelRunLocked()
	} else if c.running && c.cancelOnUpdate {
		c.cancelRunLocked()
	}
}

// trigger asks for a run at once, keeping the retry step.
func (c *Controller) trigger() {
	c.mu.Lock()
	c.pendingTrigger = true
	if c.running && c.cancelOnUpdate {
		c.cancelRunLocked()
	}
	c.mu.Unlock()
	c.notify()
}

// remove stops the controller: the running DoFunc is cancelled, no other
// one starts, and the loop goes on to the StopFunc. The caller holds the
// Manager's lock and has taken c out of the Manager.
func (c *Controller) remove() {
	c.mu.Lock()
	c.removed = true
	if c.attached && c.consecutiveFailures > 0 {
		c.metrics.addFailing(-1)
	}
	c.attached = false
	if c.runCancel != nil {
		c.runCancel()
	}
	c.mu.Unlock()
	c.notify()
}

// expireStop cancels the StopFunc's context, now or when it starts.
func (c *Controller) expireStop() {
	c.mu.Lock()
	c.stopExpired = true
	if c.stopCancel != nil {
		c.stopCancel()
	}
	c.mu.Unlock()
}

func (c *Controller) cancelRunLocked() {
	if c.runCancel != nil {
		c.runCancel()
	}
	c.runCtx, c.runCancel = nil, nil
}

func (c *Controller) notify() {
	select {
	case c.signal <- struct{}{}:
	default:
	}
}

// run is the controller's goroutine. Its owner is the Manager that
// installed the controller, which joins it through c.terminated
// (RemoveControllerAndWait, RemoveAllAndWait, Shutdown).
//
// The loop only wires signals and the timer; what to wait for after a run is
// decided by nextWait.
func (c *Controller) run() {
	var (
		timer  *time.Timer
		timerC <-chan time.Time // nil while no timed wait is pending
		step   int              // failures since the last success or update
		runNow = true           // rule 1: the first run starts at once
		ranDo  bool             // DoFunc ran at least once
		gm     groupMetrics
	)
	for {
		if !runNow {
			select {
			case <-c.signal:
			case <-timerC:
				timerC, runNow = nil, true
			}
		}

		c.mu.Lock()
		// Removal wins over every other signal, but a valid new controller
		// still makes its first run (rule 1).
		if c.removed && (ranDo || c.invalid != nil) {
			c.mu.Unlock()
			break
		}
		if c.pendingUpdate {
			step = 0
		}
		runNow = runNow || c.pendingUpdate || c.pendingTrigger
		c.pendingUpdate, c.pendingTrigger = false, false
		// Parked until an update: invalid parameters, or an ended
		// params.Context (the first run happens regardless, rule 1).
		park := c.invalid != nil || (ranDo && c.runParent.Err() != nil)
		if park {
			runNow = false
		}
		if (runNow || park) && timerC != nil {
			timer.Stop()
			timerC = nil
		}
		if !runNow {
			c.mu.Unlock()
			continue
		}
		p := c.params
		if c.runCtx == nil {
			c.runCtx, c.runCancel = context.WithCancel(c.runParent)
			if c.removed {
				c.runCancel()
			}
		}
		ctx := c.runCtx
		c.running, c.cancelOnUpdate = true, p.CancelDoFuncOnUpdate
		c.mu.Unlock()

		runNow, ranDo = false, true
		gm.resolve(c.metrics, p.Group.Name)

		start := time.Now()
		err, stack := call(p.DoFunc, ctx)
		end := time.Now()

		o := outcomeSuccess
		switch {
		case err == nil:
		case stack != nil:
			o = outcomeFailure // a panic is a failure, cancelled or not
		case ctx.Err() != nil:
			err, o = errContextCanceled, outcomeExit
		case isExitReason(err):
			o = outcomeExit
		default:
			o = outcomeFailure
		}

		c.mu.Lock()
		c.running = false
		c.lastRunDuration = end.Sub(start)
		ev := c.recordLocked(o, err, end)
		c.mu.Unlock()

		if o == outcomeFailure {
			step++
		} else {
			step = 0
		}
		var jitter time.Duration
		if p.Jitter > 0 {
			jitter = rand.N(p.Jitter)
		}
		if d, timed := nextWait(o, &p, step, jitter); timed {
			if timer == nil {
				timer = time.NewTimer(d)
			} else {
				timer.Reset(d)
			}
			timerC = timer.C
		}

		c.metrics.observeRun(&gm, o == outcomeFailure, end.Sub(start).Seconds())
		if stack != nil {
			c.metrics.countPanic(&gm)
		}
		c.report(&p, o, err, ev, stack, step, end.Sub(start))
	}
	if timer != nil {
		timer.Stop()
	}
	if ranDo {
		c.runStopFunc(&gm)
	}
	// Terminate before leaving m.stopping: a RemoveAllAndWait or Shutdown
	// that no longer finds the controller there must find it terminated,
	// and out of controllers_active.
	c.metrics.addActive(-1)
	close(c.terminated)
	c.mgr.release(c)
}

// runStopFunc runs the StopFunc of the newest valid parameters (rule 7).
func (c *Controller) runStopFunc(gm *groupMetrics) {
	c.mu.Lock()
	stop := c.stopFunc
	if stop == nil {
		c.mu.Unlock()
		return
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(c.stopParent))
	defer cancel()
	c.stopCancel = cancel
	if c.stopExpired {
		cancel()
	}
	c.mu.Unlock()

	err, stack := call(stop, ctx)
	if err == nil {
		return
	}
	now := time.Now()
	c.mu.Lock()
	c.recordFailureLocked(err, now)
	health := c.params.Health
	c.mu.Unlock()
	c.metrics.countStopFailure(gm)
	if stack != nil {
		c.metrics.countPanic(gm)
		c.logger().WithError(err).WithField("stack", string(stack)).Error("StopFunc panicked")
	} else {
		c.logger().WithError(err).Warn("StopFunc failed")
	}
	if health != nil {
		c.reportHealth(health, err)
	}
}

// runEvent is what a recorded run changed, for the log lines after it.
type runEvent struct {
	recoveredAfter int64 // a streak of this many failures just ended
	streakStart    bool  // the first failure of a streak
	msgChanged     bool  // a failure within a streak, with a new message
}

// recordLocked records the outcome of a run (rule 3).
func (c *Controller) recordLocked(o outcome, err error, now time.Time) runEvent {
	var ev runEvent
	if o == outcomeFailure {
		prev := c.lastErrMsg
		ev.streakStart = c.consecutiveFailures == 0
		c.recordFailureLocked(err, now)
		ev.msgChanged = !ev.streakStart && prev != c.lastErrMsg
		return ev
	}
	c.successCount++
	c.lastSuccessTime = now
	ev.recoveredAfter = c.consecutiveFailures
	c.setConsecutiveLocked(0)
	c.lastErr, c.lastErrMsg = nil, ""
	if o == outcomeExit {
		c.lastErr, c.lastErrMsg = err, err.Error()
	}
	return ev
}

func (c *Controller) recordFailureLocked(err error, now time.Time) {
	c.failureCount++
	c.setConsecutiveLocked(c.consecutiveFailures + 1)
	c.lastErr, c.lastErrTime = err, now
	if msg := err.Error(); msg != c.lastErrMsg {
		c.lastErrMsg = msg
	}
}

// setConsecutiveLocked keeps controllers_failing in step with the failing
// state, so the gauge agrees with Health and FormatStatus.
func (c *Controller) setConsecutiveLocked(n int64) {
	was := c.consecutiveFailures > 0
	c.consecutiveFailures = n
	if c.attached && was != (n > 0) {
		if was {
			c.metrics.addFailing(-1)
		} else {
			c.metrics.addFailing(1)
		}
	}
}

// report logs a run and tells the HealthReporter, outside the lock.
func (c *Controller) report(p *ControllerParams, o outcome, err error, ev runEvent, stack []byte, step int, took time.Duration) {
	if c.mgr.debugEnabled() {
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
	if o == outcomeFailure && !p.NoErrorRetry && p.MaxRetries > 0 && step == p.MaxRetries {
		c.logger().WithError(err).Infof("giving up after %d failures; waiting for an update or trigger", step)
	}
	if p.Health != nil {
		if o == outcomeFailure {
			c.reportHealth(p.Health, err)
		} else {
			c.reportHealth(p.Health, nil)
		}
	}
}

var outcomeNames = [...]string{outcomeSuccess: "success", outcomeExit: "exit", outcomeFailure: "failure"}

// reportHealth calls h.OK (err nil) or h.Degraded, recovering a panic.
func (c *Controller) reportHealth(h HealthReporter, err error) {
	defer func() {
		if r := recover(); r != nil {
			c.logger().WithField("panic", r).WithField("stack", string(debug.Stack())).Error("HealthReporter panicked")
		}
	}()
	if err == nil {
		h.OK(c.name)
	} else {
		h.Degraded(c.name, err)
	}
}

// logger returns the controller's log entry, building it on first use.
func (c *Controller) logger() *logrus.Entry {
	if e := c.log.Load(); e != nil {
		return e
	}
	e := c.mgr.logger().WithFields(logrus.Fields{"name": c.name, "uuid": c.uuid})
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
			if e, ok := r.(error); ok {
				err = fmt.Errorf("panic: %w", e)
			} else {
				err = fmt.Errorf("panic: %v", r)
			}
			stack = debug.Stack()
		}
	}()
	return f(ctx), nil
}

func contextOrBackground(ctx context.Context) context.Context {
	if ctx == nil {
		return context.Background()
	}
	return ctx
}

// sameContext reports a == b without panicking on a context type that is
// not comparable.
func sameContext(a, b context.Context) (same bool) {
	defer func() {
		if recover() != nil {
			same = false
		}
	}()
	return a == b
}

// ids hands out the random bytes of UUIDs from a buffer refilled from
// crypto/rand, so creating a controller does not cost a system call. It
// changes no setting of the uuid package.
var ids struct {
	sync.Mutex
	buf  [16 * 64]byte
	left int // UUIDs left in buf
}

func newUUID() string {
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
	return u.String()
}
