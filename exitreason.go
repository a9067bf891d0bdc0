// exitreason.go: ExitReason, the error that ends a controller's runs
// without failing.

package controller

import "errors"

// ExitReason is an error a DoFunc returns to say "done, nothing more to do":
// the run counts as a success (success count and last-success time), the
// reason stays visible as the controller's last error (last-failure-msg in
// the status), and the controller then waits for an update, a trigger or its
// removal instead of running again on its interval.
//
// The controller recognises an ExitReason anywhere in the error's chain, so
// a DoFunc may wrap one:
//
//	return fmt.Errorf("annotating %s: %w", ep, controller.NewExitReason("annotation applied"))
type ExitReason struct {
	err error
}

// NewExitReason returns an ExitReason whose message is reason.
func NewExitReason(reason string) ExitReason {
	return ExitReason{err: errors.New(reason)}
}

// Error returns the reason.
func (e ExitReason) Error() string {
	if e.err == nil {
		return "exit reason"
	}
	return e.err.Error()
}

// Unwrap returns the error the ExitReason wraps.
func (e ExitReason) Unwrap() error { return e.err }

// errContextCanceled is what a run that returned an error after its context
// was cancelled is recorded as.
var errContextCanceled = NewExitReason("controller context canceled")

// isExitReason reports whether errors.As(err, &ExitReason{}) holds. The
// common cases are decided without errors.As, which allocates.
func isExitReason(err error) bool {
	switch err.(type) {
	case ExitReason:
		return true
	case interface{ Unwrap() error }, interface{ Unwrap() []error }, interface{ As(any) bool }:
		var e ExitReason
		return errors.As(err, &e)
	}
	return false
}
