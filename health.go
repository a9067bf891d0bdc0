// health.go: what healthy means, and the Health of a Manager.

package controller

import (
	"errors"
	"fmt"
	"slices"
	"time"
)

// A controller is healthy unless it is failing or stuck; the package
// documentation states the rule for users ("Observing controllers"). Every
// output that says healthy or not takes it from the two functions below,
// read under the controller's lock: Health and HealthHandler (healthOf),
// the status's Stuck field with its consecutive failure count (fillStatus),
// which FormatStatus, the text, JSON and HTML of StatusHandler and its
// failing=1 read (ControllerStatus.healthy), and controllers_unhealthy
// (scrapeManagers).
//
//   - failing: the consecutive failure count is above zero. The same rule
//     keeps controllers_failing (setConsecutiveLocked).
//   - stuck: the running DoFunc has run longer than its limit (stuckLocked).

// failingLocked reports whether c is failing. The caller holds c.mu.
func (c *Controller) failingLocked() bool { return c.consecutiveFailures > 0 }

// stuckLocked reports whether c is stuck at now (Unix nanoseconds): its
// running DoFunc has run longer than its RunTimeout, or, without one, than
// its Manager's WithStuckAfter threshold (0: none). It also returns how long
// the DoFunc has run (0: none runs), the limit and what sets it. The
// caller holds c.mu.
func (c *Controller) stuckLocked(now int64) (stuck bool, ran, limit time.Duration, what string) {
	start := c.runningSinceLocked()
	if start == 0 {
		return false, 0, 0, ""
	}
	limit, what = c.params.RunTimeout, "its RunTimeout"
	if limit <= 0 {
		limit, what = c.mgr.stuckAfter, "the Manager's stuck threshold"
	}
	ran = time.Duration(now - start)
	return limit > 0 && ran > limit, ran, limit, what
}

// ErrRunStuck is wrapped by the error [Manager.Health] returns for a
// controller whose DoFunc has run too long; check for it with errors.Is.
var ErrRunStuck = errors.New("run stuck")

// Health returns nil when none of the Manager's controllers is failing or
// stuck, else one error per unhealthy controller, sorted by name and
// joined with [errors.Join]: one line each, the lines of a multi-line
// error joined with "; " as [FormatStatus] joins them. A failing one's
// names its consecutive failures and wraps its last error; a stuck one's
// wraps [ErrRunStuck] and says how long DoFunc has run, and the limit; one
// both failing and stuck says both, joined with "; ":
//
//	controller "sync-to-k8s": 4 consecutive failures: connection refused
//	controller "watch": run stuck: DoFunc has run for 1h0m0s, over its RunTimeout of 30s
//	controller "push": 1 consecutive failure: timeout; run stuck: DoFunc has run for 2m0s, over its RunTimeout of 1m0s
//
// Failing and stuck are the package documentation's: the same rule as
// [FormatStatus]'s healthy count, [StatusHandler], [HealthHandler] and the
// controllers_unhealthy metric. With a RunTimeout, DoFunc's context ended
// at the timeout: a stuck DoFunc ignores it.
func (m *Manager) Health() error {
	m.mu.Lock()
	cs := m.installedLocked(make([]*Controller, 0, len(m.controllers)))
	m.mu.Unlock()
	return healthOf(cs, time.Now())
}

// healthOf returns the Health of cs, each judged by its own Manager's
// threshold, at now.
func healthOf(cs []*Controller, now time.Time) error {
	type unhealthy struct {
		c   *Controller
		err error
	}
	var us []unhealthy
	for _, c := range cs {
		c.mu.Lock()
		failing, n, last, msg := c.failingLocked(), c.consecutiveFailures, c.lastErr, c.lastErrMsg
		stuck, ran, limit, what := c.stuckLocked(now.UnixNano())
		c.mu.Unlock()
		// One error per controller, on one line, however many reasons:
		// /healthz has a line per controller.
		var e *healthError
		if failing {
			// The message recorded with the error, on one line: a
			// multi-line one (an errors.Join) would break that too.
			e = &healthError{msg: fmt.Sprintf("controller %q: %s: %s", c.name, count(n, "consecutive failure"), oneLine(msg))}
			if last != nil {
				e.errs = append(e.errs, last)
			}
		}
		if stuck {
			why := fmt.Sprintf("%s: DoFunc has run for %s, over %s of %s", ErrRunStuck, ran.Round(time.Millisecond), what, limit)
			if e == nil {
				e = &healthError{msg: fmt.Sprintf("controller %q: %s", c.name, why)}
			} else {
				e.msg += "; " + why
			}
			e.errs = append(e.errs, ErrRunStuck)
		}
		if e != nil {
			us = append(us, unhealthy{c, e})
		}
	}
	if len(us) == 0 {
		return nil
	}
	slices.SortStableFunc(us, func(a, b unhealthy) int { return compareController(a.c, b.c) })
	errs := make([]error, len(us))
	for i, u := range us {
		errs[i] = u.err
	}
	return errors.Join(errs...)
}

// healthError is Health's error for an unhealthy controller: a message on
// one line, wrapping the controller's last error when it is failing and
// ErrRunStuck when it is stuck.
type healthError struct {
	msg  string
	errs []error
}

func (e *healthError) Error() string { return e.msg }

func (e *healthError) Unwrap() []error { return e.errs }

// count returns n and noun, plural unless n is 1: "1 consecutive
// failure", "3 consecutive failures".
func count[N int | int64](n N, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
