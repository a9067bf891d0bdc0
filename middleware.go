// middleware.go: run middleware, which wraps the DoFunc of every
// controller of a Manager once per set of parameters, never per run.

package controller

import (
	"fmt"
	"runtime/debug"
	"time"
)

// RunMiddleware wraps a controller's DoFunc: it gets the controller and
// the function to call, and returns the function to run in its place,
// which calls do (or not) with the context it was given. A tracer starts a
// span around do; a rate limiter waits before it; a test counts the runs.
// [WithRunMiddleware] installs it in a Manager.
//
// A RunMiddleware is called once for each set of parameters a controller
// runs with: before the first run after an install or an update (updates
// that come together are wrapped once), never per run, and never for a
// set of parameters that does not run. It is called on the controller's
// own goroutine, outside any lock of this package, so it may read the
// controller's statistics and call the Manager; the function it returns
// runs where DoFunc would, under the same contract (see [ControllerFunc]
// and the package documentation), and what it returns is the run's
// result. A nil result leaves do unwrapped, for a middleware that serves
// some controllers only. A panic while wrapping is recovered and logged at
// Error; the DoFunc then runs without that middleware.
//
// StopFuncs are not wrapped: a RunMiddleware sees runs, each with an
// outcome that the retries follow, and a StopFunc is no run. Wrap a
// StopFunc in its parameters to trace or time it.
type RunMiddleware func(info RunInfo, do ControllerFunc) ControllerFunc

// RunInfo tells a [RunMiddleware] whose DoFunc it wraps.
type RunInfo struct {
	// Name is the controller's name.
	Name string
	// Group is the group of the parameters the DoFunc came with.
	Group Group
	// RunTimeout is the RunTimeout of those parameters (0: none), which
	// the [RunTimeoutError] of a timed-out run names.
	RunTimeout time.Duration
	// Controller is the controller itself, whose methods read its
	// statistics: GetConsecutiveFailureCount, called as a run starts, is
	// the number of failures in a row before it.
	Controller *Controller
}

// WithRunMiddleware makes the Manager wrap the DoFunc of each of its
// controllers with mws, the first one outermost: WithRunMiddleware(a, b)
// runs a(b(DoFunc)). A second WithRunMiddleware adds its middleware inside
// those of the first. Nil middleware is skipped. Default: none, and then
// the run loop is exactly what it is without this option.
//
// A replica of github.com/bgctl/controller/ha passes its ManagerOptions
// to its inner Manager, so a middleware given there wraps the DoFuncs
// the replica runs; the context they get carries the replica's claim.
func WithRunMiddleware(mws ...RunMiddleware) Option {
	return func(m *Manager) {
		for _, mw := range mws {
			if mw != nil {
				m.middleware = append(m.middleware, mw)
			}
		}
	}
}

// wrapDo returns do wrapped by the Manager's middleware for the
// parameters of group and timeout, innermost first. The loop calls it,
// outside mu, once per set of parameters (loop.stale).
func (c *Controller) wrapDo(do ControllerFunc, group Group, timeout time.Duration) ControllerFunc {
	mws := c.mgr.middleware
	info := RunInfo{Name: c.name, Group: group, RunTimeout: timeout, Controller: c}
	for i := len(mws) - 1; i >= 0; i-- {
		if w := c.applyMiddleware(mws[i], info, do); w != nil {
			do = w
		}
	}
	return do
}

// applyMiddleware calls mw, recovering a panic: it then logs it and
// returns nil, so that the DoFunc runs without mw.
func (c *Controller) applyMiddleware(mw RunMiddleware, info RunInfo, do ControllerFunc) (wrapped ControllerFunc) {
	defer func() {
		if r := recover(); r != nil {
			c.log(&logLine{level: levelError, msg: fmt.Sprintf("run middleware panicked; DoFunc runs without it: %v", r), panicked: r, hasPanic: true, stack: debug.Stack()})
			wrapped = nil
		}
	}()
	return mw(info, do)
}
