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
// keepalive in time, so the replica can no longer be sure its lease, and
// with it its claims, still live. Read it with context.Cause.
var ErrFencePassed = errors.New("ha: fence passed: no keepalive answered in time, the claims may be lost")

// errLeaseLost is why a fence passes early: etcd answered that the lease
// no longer exists (it expired, or someone revoked it). It is logged; the
// controllers' contexts end with ErrFencePassed all the same.
var errLeaseLost = errors.New("ha: lease lost: etcd no longer knows it")

// fence is one lease's local deadline. Its context is cancelled once the
// deadline passes, or at once by expire; after that it never reopens (a
// new lease gets a new fence).
//
// The deadline only ever moves forward, and only by extend, which the
// keepalive loop calls with (send time of an answered request) + TTL −
// Margin. The server counts the lease's TTL from when it received that
// request, which is later than its send time, so the fence passes at
// least Margin before the lease can expire on the server (clock drift
// aside, which Margin must cover).
type fence struct {
	ctx    context.Context         // immutable; done once the fence passed
	cancel context.CancelCauseFunc // immutable

	mu       sync.Mutex
	deadline time.Time   // guarded by mu; never moves back
	timer    *time.Timer // guarded by mu; runs check; stopped by stop
}

// newFence returns a fence that passes at deadline, unless extended. Its
// timer's function runs on a goroutine of the runtime's; stop ends it.
func newFence(deadline time.Time) *fence {
	f := &fence{deadline: deadline}
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
	f.cancel(ErrFencePassed)
}

// extend moves the deadline to d when d is later, unless the fence has
// passed already. It reports whether the fence is still open.
func (f *fence) extend(d time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ctx.Err() != nil {
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
	f.cancel(cause)
}

// open reports whether the fence has not passed yet. The clock is read as
// well as the context, so a fence whose timer has not fired yet (a busy
// runtime) is not taken for open.
func (f *fence) open() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ctx.Err() == nil && time.Now().Before(f.deadline)
}

// remaining returns the time left before the fence passes, 0 if it has.
func (f *fence) remaining() time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ctx.Err() != nil {
		return 0
	}
	return max(time.Until(f.deadline), 0)
}

// passedAt returns when the fence passes, or passed, by its deadline: the
// lease cannot expire on the server before passedAt() + Margin.
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
	f.cancel(cause)
}
