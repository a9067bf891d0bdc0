// runs.go: Runs, a HealthReporter that counts runs for a test to wait on.

package controllertest

import (
	"context"
	"sync"

	"github.com/bgctl/controller"
)

// Runs is a [controller.HealthReporter] that counts what each controller
// tells it, so that a test can wait for a number of runs without polling.
// Give it as the Health of the parameters under test:
//
//	runs := &controllertest.Runs{}
//	m.UpdateController("sync", controller.ControllerParams{DoFunc: sync, Health: runs})
//	err := runs.Wait(ctx, "sync", 3) // the first three runs have ended
//
// A controller tells its HealthReporter after every run (OK after a
// success or an ExitReason, Degraded after a failure), after a failed
// StopFunc, and when it is given invalid parameters; each counts as one.
// Runs never blocks the controller that tells it: the count goes up under
// a short lock and waiters are woken by closing a channel. Inside a
// testing/synctest bubble, Wait is a durable block, so the bubble's clock
// moves on to the controller's next run while the test waits.
//
// The zero Runs is ready to use. Next, when set before first use, is told
// everything as well, after the count: a test can keep the reporter the
// code under test installs.
type Runs struct {
	Next controller.HealthReporter

	mu      sync.Mutex
	counts  map[string]runCount // by controller name
	changed chan struct{}       // closed and replaced at every report; nil until someone waits
}

type runCount struct {
	ok, degraded int
	lastErr      error
}

// OK implements [controller.HealthReporter].
func (r *Runs) OK(name string) {
	r.add(name, nil)
	if r.Next != nil {
		r.Next.OK(name)
	}
}

// Degraded implements [controller.HealthReporter].
func (r *Runs) Degraded(name string, err error) {
	r.add(name, err)
	if r.Next != nil {
		r.Next.Degraded(name, err)
	}
}

func (r *Runs) add(name string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.counts == nil {
		r.counts = make(map[string]runCount)
	}
	rc := r.counts[name]
	if err == nil {
		rc.ok++
	} else {
		rc.degraded++
	}
	rc.lastErr = err
	r.counts[name] = rc
	if r.changed != nil {
		close(r.changed)
		r.changed = nil
	}
}

// Count returns how many times the named controller has reported: its
// successes and failures so far.
func (r *Runs) Count(name string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	rc := r.counts[name]
	return rc.ok + rc.degraded
}

// Failures returns how many of the named controller's reports were
// failures, and the error of its last report (nil after a success).
func (r *Runs) Failures(name string) (n int, last error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rc := r.counts[name]
	return rc.degraded, rc.lastErr
}

// Wait blocks until the named controller has reported at least n times, or
// ctx ends; then it returns ctx's error.
func (r *Runs) Wait(ctx context.Context, name string, n int) error {
	for {
		r.mu.Lock()
		rc := r.counts[name]
		if rc.ok+rc.degraded >= n {
			r.mu.Unlock()
			return nil
		}
		if r.changed == nil {
			r.changed = make(chan struct{})
		}
		ch := r.changed
		r.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
