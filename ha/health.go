// Health: whether a replica is a working member of its group, and why
// not, for a readiness probe.

package ha

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// The reasons [Replica.Health] gives, besides [ErrClosed], [ErrFencePassed]
// and [ErrDuplicateID]; check for them with errors.Is.
var (
	// ErrNoLease: the replica holds no lease. Its fence passed and it is
	// joining again; it runs nothing meanwhile.
	ErrNoLease = errors.New("ha: no lease")
	// ErrMemberKeyMissing: the replica's view lacks its own member key
	// (deleted under its live lease): the other members no longer count
	// it and take its names over, while it writes the key again.
	ErrMemberKeyMissing = errors.New("ha: member key missing")
	// ErrWatchStalled: the watch of the group has delivered nothing,
	// neither an event nor a progress notification, for TTL − Margin:
	// the replica's view of the members and claims may be stale, so
	// names may not move to it, or from it, when they should.
	ErrWatchStalled = errors.New("ha: watch not progressing")
)

// Health returns nil while r is a working member of its group: it holds a
// lease, its fence is open, its view has its own member key, and its
// watch of the group keeps it current. Else it returns one error per
// reason, joined with [errors.Join], each naming the replica and wrapping
// the reason's sentinel: [ErrClosed] after Leave or Close; [ErrNoLease]
// while it joins again after its fence passed, with [ErrFencePassed] and
// the cause ([ErrDuplicateID] when another live replica took its ID), and
// the error of the last attempt to join; [ErrFencePassed] while it stops
// its controllers, the lease still counted as held; [ErrMemberKeyMissing];
// [ErrWatchStalled]. It asks etcd nothing and costs a lock, so a
// readiness probe may call it at any rate ([HealthHandler]).
//
// It says nothing of the controllers' own failures, which the inner
// Manager's status holds ([Replica.GetStatusModel]).
func (r *Replica) Health() error {
	r.mu.Lock()
	v := healthView{
		closed:   r.closed,
		unjoined: r.fence == nil,
		leased:   r.lease != 0,
		joinErr:  r.joinErr,
		listed:   r.viewRev > 0,
		silent:   time.Since(r.heard),
		window:   r.opts.window(),
	}
	_, v.inView = r.members[r.opts.ID]
	if r.fence != nil && !r.fence.open() {
		v.passed = true
		// The fence's cause when it passed early; a stop request's
		// ErrClosed, or none (its timer not fired yet), says no more
		// than that it passed.
		if cause := context.Cause(r.fence.ctx); cause != nil && !errors.Is(cause, ErrFencePassed) && !errors.Is(cause, ErrClosed) {
			v.cause = cause
		}
	}
	r.mu.Unlock()
	return v.err(r.opts.ID)
}

// healthView is what Health decides from, read under Replica.mu.
type healthView struct {
	closed   bool
	unjoined bool          // has never held a lease: no fence exists
	leased   bool          // holds a lease (in an epoch)
	passed   bool          // the last fence has passed
	cause    error         // why it passed, when not by its timer (the lease lost, the ID taken); nil: by its timer
	joinErr  error         // why the last attempt to join again failed
	listed   bool          // the view has been listed in this epoch
	inView   bool          // its own member key is in the view
	silent   time.Duration // since the watch last spoke (or the view was listed, or the epoch began)
	window   time.Duration // TTL − Margin
}

// healthError is one reason Health gives: its text, and the errors it
// wraps for errors.Is.
type healthError struct {
	text    string
	reasons []error
}

func (e *healthError) Error() string   { return e.text }
func (e *healthError) Unwrap() []error { return e.reasons }

// err returns Health's answer for v: the reasons, in the order a reader
// should mend them. An epoch that ended leaves no other reason to tell.
func (v healthView) err(id string) error {
	reason := func(text string, reasons ...error) error {
		return &healthError{text: fmt.Sprintf("ha: replica %q: %s", id, text), reasons: reasons}
	}
	switch {
	case v.closed:
		return reason("closed (Leave or Close was called)", ErrClosed)
	case v.unjoined:
		return reason("no lease: not joined (New without Join, or Join failed)", ErrNoLease)
	case !v.leased:
		text, reasons := "no lease: its fence passed", []error{ErrNoLease, ErrFencePassed}
		if v.cause != nil {
			text += " (" + withoutPrefix(v.cause) + ")"
			reasons = append(reasons, v.cause)
		}
		text += "; joining again"
		if v.joinErr != nil {
			text += ", the last attempt failed: " + withoutPrefix(v.joinErr)
			reasons = append(reasons, v.joinErr)
		}
		return reason(text, reasons...)
	case v.passed:
		text, reasons := "fence passed: stopping its controllers", []error{ErrFencePassed}
		if v.cause != nil {
			text += " (" + withoutPrefix(v.cause) + ")"
			reasons = append(reasons, v.cause)
		}
		return reason(text, reasons...)
	}
	var errs []error
	if v.listed && !v.inView {
		errs = append(errs, reason("member key missing: the other members do not count it; writing it again", ErrMemberKeyMissing))
	}
	if v.silent >= v.window {
		errs = append(errs, reason(fmt.Sprintf("watch not progressing: no event or progress notification for %v (TTL − Margin is %v)", v.silent.Round(time.Millisecond), v.window), ErrWatchStalled))
	}
	return errors.Join(errs...)
}

// withoutPrefix returns err's text without the package's "ha: ", which
// the reason that quotes it has said already.
func withoutPrefix(err error) string {
	return strings.TrimPrefix(err.Error(), "ha: ")
}

// HealthHandler returns an [http.Handler] serving r's [Replica.Health] for
// a readiness probe, as [controller.HealthHandler] serves a Manager's: 200
// and "ok" when it is nil, else 503 and its text, one line per reason.
func HealthHandler(r *Replica) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodGet && req.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		if err := r.Health(); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, err.Error()+"\n")
			return
		}
		io.WriteString(w, "ok\n")
	})
}
