// runcontext.go: the context a DoFunc gets, and the one its StopFunc
// gets.

package controller

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

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

// runContext is the run context of a controller whose params.Context is
// nil or Background: a cancellable context that costs no allocation while
// DoFunc only asks Err. The first call that needs more (Done, Value) makes
// a context.WithCancel and delegates to it from then on, so children,
// context.Cause and context.AfterFunc work through the standard machinery,
// with no goroutine.
//
// Its fields are guarded by mu, with two exceptions for Err, which takes
// no lock: cancelled and hasInner are atomic, and Err reads inner without
// mu once it has seen hasInner set. That read is safe because inner is
// written once, before hasInner is stored (under mu, in innerCtx), and
// never again: the atomic load that sees hasInner true also sees inner.
type runContext struct {
	mu          sync.Mutex
	cancelled   atomic.Bool        // set under mu; read without it by Err
	hasInner    atomic.Bool        // set under mu, after inner: Err asks inner, as Done does
	inner       context.Context    // made on demand, once; see above
	cancelInner context.CancelFunc // made with inner
}

func (r *runContext) innerCtx() context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.inner == nil {
		r.inner, r.cancelInner = context.WithCancel(context.Background())
		if r.cancelled.Load() {
			r.cancelInner()
		}
		r.hasInner.Store(true) // after inner: Err reads inner once it sees this
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
