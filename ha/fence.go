// The fence: the local deadline past which a replica runs nothing, moved
// forward only by answered keepalives.

package ha

import (
	"context"
	"errors"
	"sync"
	"time"
)

// ErrFencePassed is the cause of the cancellation of every DoFunc and
// StopFunc context of a replica whose fence passed: etcd did not answer a
// keepalive in time, or showed the lease ended, so the replica can no
// longer be sure its lease, and with it its claims, still live. Read it
// with context.Cause.
var ErrFencePassed = errors.New("ha: fence passed: no renewal answered in time, the claims may be lost")

// errLeaseLost is why a fence passes early: etcd answered that the lease
// no longer exists (it expired, or someone revoked it). It is logged; the
// controllers' contexts end with ErrFencePassed all the same.
var errLeaseLost = errors.New("ha: lease lost: the store no longer knows it")

// errLeaseEnded is why a fence passes early when the watch shows the
// lease's keys deleted together while the replica renews it: the server
// ended the lease before its TTL (a revoke by another client, a stale
// etcd leader waking up). The fence passes at once, without waiting for
// the next keepalive to be refused.
var errLeaseEnded = errors.New("ha: lease ended early: its keys were deleted together on the server")

// cancelLead is how much earlier than (send time) + TTL − Margin the fence
// passes: it pays for the package's own delay between the fence's deadline
// and a DoFunc's context being done (the timer firing late, the
// cancellations, the DoFunc's goroutine being scheduled), so that the
// whole Margin is left to the DoFunc once it sees its cancel (rule 4).
// TestCancelDelayMeasurement measures that delay; with -canceldelay it
// reports the distribution under -race, GC and busy cores (the figures
// are in the package documentation, rule 3). Options refuse
// a Margin below minMargin, twice the lead.
const cancelLead = 100 * time.Millisecond

// fence is one lease's local deadline. Its context is cancelled once the
// deadline passes, or at once by expire; after that it never reopens (a
// new lease gets a new fence).
//
// The deadline only ever moves forward, and only by extend, which the
// keepalive loop calls with (send time of an answered request) + TTL −
// Margin − cancelLead. The server counts the lease's TTL from when it
// received that request, which is later than its send time, so the fence
// passes at least Margin + cancelLead before the lease can expire on the
// server (clock drift aside, which Margin must cover).
//
// As it passes, the fence calls every hooked cancel function itself, on
// the goroutine that passes it, before it cancels its own context: a
// goroutine per controller (context.AfterFunc) would put the scheduler's
// delay, at 100,000 names, between the deadline and the DoFuncs.
type fence struct {
	ctx    context.Context         // immutable; done once the fence passed
	cancel context.CancelCauseFunc // immutable

	mu       sync.Mutex
	deadline time.Time                          // guarded by mu; never moves back
	timer    *time.Timer                        // guarded by mu; runs check; stopped by stop
	hooks    map[uint64]context.CancelCauseFunc // guarded by mu; nil once passed
	nextHook uint64                             // guarded by mu
}

// newFence returns a fence that passes at deadline, unless extended. Its
// timer's function runs on a goroutine of the runtime's; stop ends it.
func newFence(deadline time.Time) *fence {
	f := &fence{deadline: deadline, hooks: make(map[uint64]context.CancelCauseFunc)}
	f.ctx, f.cancel = context.WithCancelCause(context.Background())
	f.mu.Lock()
	defer f.mu.Unlock()
	f.timer = time.AfterFunc(time.Until(deadline), f.check)
	return f
}

// check passes the fence when its deadline has come, or re-arms the timer
// for a deadline that was extended meanwhile.
func (f *fence) check() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if left := time.Until(f.deadline); left > 0 {
		f.timer.Reset(left)
		return
	}
	f.passLocked(ErrFencePassed)
}

// passLocked passes the fence with cause: the hooked functions first,
// with ErrFencePassed, then the fence's own context with cause.
func (f *fence) passLocked(cause error) {
	if f.hooks == nil {
		return
	}
	for _, cancel := range f.hooks {
		cancel(ErrFencePassed)
	}
	f.hooks = nil
	f.cancel(cause)
}

// hook makes the fence call cancel with ErrFencePassed as it passes, or
// at once if it has passed. unhook stops that; it reports whether cancel
// was still hooked.
func (f *fence) hook(cancel context.CancelCauseFunc) (unhook func() bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.hooks == nil {
		cancel(ErrFencePassed)
		return func() bool { return false }
	}
	id := f.nextHook
	f.nextHook++
	f.hooks[id] = cancel
	return func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		_, ok := f.hooks[id]
		delete(f.hooks, id)
		return ok
	}
}

// extend moves the deadline to d when d is later, unless the fence has
// passed already. It reports whether the fence is still open.
func (f *fence) extend(d time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.hooks == nil {
		return false
	}
	if d.After(f.deadline) {
		f.deadline = d // the timer notices when it fires
	}
	return true
}

// expire passes the fence now, with cause.
func (f *fence) expire(cause error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.passLocked(cause)
}

// open reports whether the fence has not passed yet. The clock is read as
// well as the context, so a fence whose timer has not fired yet (a busy
// runtime) is not taken for open.
func (f *fence) open() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.hooks != nil && time.Now().Before(f.deadline)
}

// remaining returns the time left before the fence passes, 0 if it has.
func (f *fence) remaining() time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.hooks == nil {
		return 0
	}
	return max(time.Until(f.deadline), 0)
}

// passedAt returns when the fence passes, or passed, by its deadline: the
// lease cannot expire on the server before passedAt() + Margin (+
// cancelLead).
func (f *fence) passedAt() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.deadline
}

// stop passes the fence (if it has not) and stops its timer.
func (f *fence) stop(cause error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.timer.Stop()
	f.passLocked(cause)
}
