// report.go: telling others about runs: the log and the HealthReporter.

package controller

import (
	"context"
	"runtime/debug"
	"time"
)

// reportInvalid logs invalid parameters and tells their HealthReporter,
// from the controller's goroutine.
func (c *Controller) reportInvalid(inv *invalidParams) {
	ctx := inv.params.Context
	c.logInvalid(ctx, inv.err)
	if inv.params.Health != nil {
		c.reportHealth(ctx, inv.params.Health, inv.err)
	}
}

func (c *Controller) logInvalid(ctx context.Context, err error) {
	c.log(&logLine{ctx: ctx, level: levelError, msg: "invalid controller parameters; DoFunc will not run until an update brings valid ones", err: err})
}

// logStopFailure logs a StopFunc's failure; ctx is the StopFunc's.
func (c *Controller) logStopFailure(ctx context.Context, err error, stack []byte) {
	if stack != nil {
		c.log(&logLine{ctx: ctx, level: levelError, msg: "StopFunc panicked", err: err, stack: stack})
	} else {
		c.log(&logLine{ctx: ctx, level: levelWarn, msg: "StopFunc failed", err: err})
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
			c.reportHealth(l.runCtx, l.health, err)
		} else {
			c.reportHealth(l.runCtx, l.health, nil)
		}
	}
	if ev.any() || c.mgr.sink.enabled(l.runCtx, levelDebug) {
		c.logRun(l.runCtx, o, err, ev, stack, l.step, took)
	}
}

// logRun logs what a run changed: at Debug every run, at Warn the start of
// a failure streak and a new message within one, at Info a recovery and
// giving up, at Error a panic (once per streak or message). ctx is the
// run's context, which the handler gets.
//
//go:noinline
func (c *Controller) logRun(ctx context.Context, o outcome, err error, ev runEvent, stack []byte, step int, took time.Duration) {
	if c.mgr.sink.enabled(ctx, levelDebug) {
		c.log(&logLine{ctx: ctx, level: levelDebug, msg: "controller run", err: err, duration: took, timed: true, outcome: o.String()})
	}
	switch {
	case stack != nil && (ev.streakStart || ev.msgChanged):
		c.log(&logLine{ctx: ctx, level: levelError, msg: "DoFunc panicked", err: err, stack: stack})
	case ev.streakStart:
		c.log(&logLine{ctx: ctx, level: levelWarn, msg: "controller failed; retrying", err: err})
	case ev.msgChanged:
		c.log(&logLine{ctx: ctx, level: levelWarn, msg: "controller still failing with a new error", err: err})
	case ev.recoveredAfter > 0:
		c.log(&logLine{ctx: ctx, level: levelInfo, msg: "recovered after " + count(ev.recoveredAfter, "consecutive failure")})
	}
	if ev.gaveUp {
		c.log(&logLine{ctx: ctx, level: levelInfo, msg: "giving up retrying after " + count(step, "failure") + "; next run on an update, a trigger or the RunInterval", err: err})
	}
}

// reportHealth calls h.OK (err nil) or h.Degraded, recovering a panic;
// ctx is the context of the run, StopFunc or parameters it reports on,
// for the log.
func (c *Controller) reportHealth(ctx context.Context, h HealthReporter, err error) {
	defer func() {
		if r := recover(); r != nil {
			c.logHealthPanic(ctx, r)
		}
	}()
	if err == nil {
		h.OK(c.name)
	} else {
		h.Degraded(c.name, err)
	}
}

func (c *Controller) logHealthPanic(ctx context.Context, r any) {
	c.log(&logLine{ctx: ctx, level: levelError, msg: "HealthReporter panicked", panicked: r, hasPanic: true, stack: debug.Stack()})
}

// log writes line to the controller's sink, which it builds on first use.
func (c *Controller) log(line *logLine) {
	s := c.logs.Load()
	if s == nil {
		s = c.mgr.sink.forController(c.name, c.UUID())
		if !c.logs.CompareAndSwap(nil, s) {
			s = c.logs.Load()
		}
	}
	s.write(c.name, line)
}
