// runcontext.go: the context a DoFunc gets, and the one its StopFunc
// gets.

package controller

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// The run context is cancelled in one of two ways, and which one matters:
//
//   - cancelRunCtxLocked cancels it and keeps it: the loop, which still
//     holds it, sees it cancelled, and so does the next run if there is
//     one. For a removal (no run follows) and a Shutdown deadline (it
//     cancels the StopFunc's context, which the same fields hold by then).
//     A removal that comes before the first run cancels it in begin,
//     once it is made.
//   - replaceRunCtxLocked cancels it and drops it: the running DoFunc is
//     cancelled, and the loop makes a fresh run context before the next
//     run (begin, newRunCtxLocked). For an update or trigger with
//     CancelDoFuncOnUpdate, and an update that brings a different
//     params.Context.
//
// Both take the cause the context ends with (cancelcause.go).

// Before the loop starts, the run context's field holds the context that
// carries the goroutine's pprof labels (labels.go): the installer makes
// it, so that the goroutine does not allocate them below its loop's frame,
// and the loop takes it as it starts. A removal or update before that
// finds no run context to cancel or drop: hasRunCtxLocked says so.

// hasRunCtxLocked reports whether runCtx holds a run context (or, once
// the loop has ended, the StopFunc's), rather than nothing or the labels'.
func (c *Controller) hasRunCtxLocked() bool {
	if c.runCtxCancel != nil {
		return true
	}
	_, lazy := c.runCtx.(*lazyCtx)
	return lazy
}

// takeLabelsLocked returns the context that carries the goroutine's
// labels, which newController left in runCtx, and clears runCtx.
func (c *Controller) takeLabelsLocked() context.Context {
	labels := c.runCtx
	c.runCtx = nil
	return labels
}

// cancelRunCtxLocked cancels the run context, if any, with cause, and
// keeps it.
func (c *Controller) cancelRunCtxLocked(cause cancelCause) {
	switch {
	case c.runCtxCancel != nil:
		c.runCtxCancel(cause.err())
	case c.hasRunCtxLocked():
		c.runCtx.(*lazyCtx).cancel(cause)
	}
}

// replaceRunCtxLocked cancels the run context, if any, and drops it, so
// that the next run gets a new one.
func (c *Controller) replaceRunCtxLocked(cause cancelCause) {
	if c.hasRunCtxLocked() {
		c.cancelRunCtxLocked(cause)
		c.runCtx, c.runCtxCancel = nil, nil
	}
}

// newRunCtxLocked makes the run context for a run under parent.
func (c *Controller) newRunCtxLocked(parent context.Context) {
	if parent != context.Background() {
		c.runCtx, c.runCtxCancel = context.WithCancelCause(parent)
		return
	}
	rc := &c.runCtxLazy
	if c.runCtxLazyUsed {
		rc = new(lazyCtx) // replaced after CancelDoFuncOnUpdate: rare
	}
	c.runCtxLazyUsed = true
	c.runCtx, c.runCtxCancel = rc, nil
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

// lazyCtx is the run context of a controller whose params.Context is
// nil or Background: a cancellable context that costs no allocation while
// DoFunc only asks Err. The first call that needs more (Done, or Value
// once it is cancelled) makes a context.WithCancelCause and delegates to
// it from then on, so children, context.Cause and context.AfterFunc work
// through the standard machinery, with no goroutine.
//
// Its fields are guarded by mu, with two exceptions for Err, which takes
// no lock: cancelled and hasInner are atomic, and Err reads inner without
// mu once it has seen hasInner set. That read is safe because inner is
// written once, before hasInner is stored (under mu, in innerCtx), and
// never again: the atomic load that sees hasInner true also sees inner.
type lazyCtx struct {
	mu          sync.Mutex
	cancelled   atomic.Uint32           // a cancelCause, set once under mu; read without it by Err and Value
	hasInner    atomic.Bool             // set under mu, after inner: Err asks inner, as Done does
	inner       context.Context         // made on demand, once; see above
	cancelInner context.CancelCauseFunc // made with inner
}

func (r *lazyCtx) innerCtx() context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.inner == nil {
		r.inner, r.cancelInner = context.WithCancelCause(context.Background())
		if cause := cancelCause(r.cancelled.Load()); cause != notCancelled {
			r.cancelInner(cause.err())
		}
		r.hasInner.Store(true) // after inner: Err reads inner once it sees this
	}
	return r.inner
}

// cancel cancels r with cause, unless it was cancelled already: the
// first cause stays, as it does for a context.WithCancelCause.
func (r *lazyCtx) cancel(cause cancelCause) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cancelled.CompareAndSwap(uint32(notCancelled), uint32(cause))
	if r.cancelInner != nil {
		r.cancelInner(cancelCause(r.cancelled.Load()).err())
	}
}

// Deadline implements [context.Context]: a run context has none.
func (r *lazyCtx) Deadline() (time.Time, bool) { return time.Time{}, false }

// Done implements [context.Context].
func (r *lazyCtx) Done() <-chan struct{} { return r.innerCtx().Done() }

// Err implements [context.Context].
func (r *lazyCtx) Err() error {
	if r.hasInner.Load() {
		// Done's channel may not be closed yet while cancel runs: Err
		// must not say cancelled before it is.
		return r.inner.Err()
	}
	if r.cancelled.Load() != uint32(notCancelled) {
		return context.Canceled
	}
	return nil
}

// Value implements [context.Context]. It carries no values of its own; it
// answers for the context it delegates to once that exists, which is how
// the context package finds it to attach children and causes. Once r is
// cancelled it makes that context if need be: context.Cause asks Value
// for the cause, and a DoFunc that only asked Err must read the right
// one.
func (r *lazyCtx) Value(key any) any {
	r.mu.Lock()
	inner := r.inner
	r.mu.Unlock()
	if inner == nil {
		if r.cancelled.Load() == uint32(notCancelled) {
			return nil
		}
		inner = r.innerCtx()
	}
	return inner.Value(key)
}

// String names the context in debugging output.
func (r *lazyCtx) String() string { return "controller.lazyCtx" }
