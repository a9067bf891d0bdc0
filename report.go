// report.go: telling others about runs: the log and the HealthReporter.

package controller

import (
	"fmt"
	"os"
	"runtime/debug"
	"time"

	"github.com/sirupsen/logrus"
)

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

// report tells the metrics, the HealthReporter and the log about a run
// that ended with o, after it was recorded.
func (c *Controller) report(l *loop, o outcome, err error, ev runEvent, stack []byte, took time.Duration) {
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
