// cancelcause.go: why a run context was cancelled: the causes a DoFunc
// reads with context.Cause, and the small code a run context keeps for
// them.

package controller

import (
	"errors"
	"fmt"
)

// The causes of a cancelled run context, as [context.Cause] returns them
// to a DoFunc (ctx.Err() stays [context.Canceled], or
// [context.DeadlineExceeded] for a timeout). Check them with errors.Is:
//
//	<-ctx.Done()
//	switch cause := context.Cause(ctx); {
//	case errors.Is(cause, controller.ErrControllerRemoved):   // RemoveController, RemoveAll, …
//	case errors.Is(cause, controller.ErrManagerShutDown):     // Manager.Shutdown
//	case errors.Is(cause, controller.ErrControllerUpdated):   // an update (CancelDoFuncOnUpdate, or a new Context)
//	case errors.Is(cause, controller.ErrControllerTriggered): // a trigger, with CancelDoFuncOnUpdate
//	case errors.Is(cause, controller.ErrRunTimeout):          // the run lasted its RunTimeout
//	default: // params.Context ended: cause is its own cause
//	}
//
// When params.Context ends, the cause is that context's own, passed on
// untouched: [context.Canceled] or [context.DeadlineExceeded] for a
// context ended without one, and whatever its owner gave
// [context.WithCancelCause] otherwise (a replica of
// github.com/bgctl/controller/ha gives ErrFencePassed). Whichever cause
// comes first stays: a run cancelled by an update and then removed reads
// ErrControllerUpdated.
var (
	// ErrControllerRemoved is the cause of the run context of a removed
	// controller: RemoveController, RemoveControllerAndWait, RemoveAll or
	// RemoveAllAndWait.
	ErrControllerRemoved = errors.New("controller removed")
	// ErrControllerUpdated is the cause of the run context an update
	// cancelled: with CancelDoFuncOnUpdate, or an update that brought a
	// different Context.
	ErrControllerUpdated = errors.New("controller updated")
	// ErrControllerTriggered is the cause of the run context a trigger
	// cancelled, with CancelDoFuncOnUpdate.
	ErrControllerTriggered = errors.New("controller triggered")
)

// errStopDeadline is the cause of a StopFunc's context that a Shutdown
// deadline cancelled.
var errStopDeadline = fmt.Errorf("%w: its deadline passed before the StopFunc returned", ErrManagerShutDown)

// cancelCause is a cause as a run context without a parent (lazyCtx)
// keeps it: in the 4 bytes its flag took, where the error itself would
// take 16 and push the Controller, which holds one, out of its size class
// (TestControllerStaysInItsSizeClass).
type cancelCause uint32

const (
	notCancelled cancelCause = iota
	causeRemoved
	causeShutDown
	causeUpdated
	causeTriggered
	causeStopDeadline
)

var causeErrors = [...]error{
	causeRemoved:      ErrControllerRemoved,
	causeShutDown:     ErrManagerShutDown,
	causeUpdated:      ErrControllerUpdated,
	causeTriggered:    ErrControllerTriggered,
	causeStopDeadline: errStopDeadline,
}

// err returns the error a DoFunc reads for c; nil for notCancelled.
func (c cancelCause) err() error { return causeErrors[c] }

// removalCause returns the cause a removal whose state bits are st gives
// the run context.
func removalCause(st uint32) cancelCause {
	if st&stClosed != 0 {
		return causeShutDown
	}
	return causeRemoved
}
