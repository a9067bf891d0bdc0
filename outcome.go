// outcome.go: what a run's result means (the outcome, how a result is
// classified into one, and its name in the log), and recording it in the
// controller's statistics.

package controller

import (
	"errors"
	"fmt"
	"time"
	"unsafe"
)

// outcome is what a run's result means (rule 3), reduced to what the
// schedule, the statistics and the log tell apart. classify makes one.
type outcome uint8

const (
	outcomeSuccess outcome = iota // DoFunc returned nil
	outcomeExit                   // an ExitReason, or an error after cancellation
	outcomeFailure                // any other error, a panic, or a run that lasted its RunTimeout
)

// outcomeNames are the outcomes as the log's outcome field shows them.
var outcomeNames = [...]string{outcomeSuccess: "success", outcomeExit: "exit", outcomeFailure: "failure"}

// String returns the outcome's name in the log.
func (o outcome) String() string { return outcomeNames[o] }

// mayBeCancelled reports whether the run context may have been cancelled:
// only a removal, an update or a trigger (which leave their bit in the
// state) or the end of params.Context cancel it. It spares a failed run the
// question to the context.
func (c *Controller) mayBeCancelled(l *loop) bool {
	return l.ends || c.state.Load()&(stRemoved|stUpdate|stTrigger) != 0
}

// classify decides what a run that returned err (and panicked with stack,
// if not nil) was, by rule 3, and reads the error's message; timedOut
// says the run's RunTimeout ended it before anything else cancelled it
// (afterRun). The error it returns is the one to
// record: err, errContextCanceled for a cancelled run, a
// *RunTimeoutError, or an unreadableError for an error whose methods
// panicked. It keeps l.lastFailure, the value of the last failure, so
// that the same value returned again is not classified anew.
func (c *Controller) classify(l *loop, err error, stack []byte, timedOut bool) (outcome, error, string) {
	switch {
	case err == nil && !timedOut:
		l.lastFailure = nil
		return outcomeSuccess, nil, ""
	case stack != nil:
		// A panic is a failure, cancelled or not; panicError's message is
		// our own.
		return outcomeFailure, err, err.Error()
	case timedOut:
		// The timeout came first: a removal or update after it does
		// not make the run a cancelled one.
		l.lastFailure = nil
		if err != nil {
			err, _, _ = inspectError(err, false)
		}
		te := &RunTimeoutError{Timeout: l.timeout, Err: err}
		return outcomeFailure, te, te.Error()
	case err != nil && c.mayBeCancelled(l) && l.runCtx.Err() != nil:
		// A removal or update cancelled the run, before any timeout.
		l.lastFailure = nil
		return outcomeExit, errContextCanceled, errContextCanceled.Error()
	}
	returned := err
	// The same value as the last failure is a failure again, without
	// asking its chain; its message is read anew all the same.
	classified := identical(err, l.lastFailure)
	err, msg, exit := inspectError(err, !classified)
	_, unreadable := err.(*unreadableError)
	switch {
	case exit:
		l.lastFailure = nil
		return outcomeExit, err, msg
	case !unreadable: // an unreadable one is inspected in full every time
		l.lastFailure = returned
	}
	return outcomeFailure, err, msg
}

// runEvent is what a recorded run changed, for the log lines after it.
//
// It keeps to four fields so that report gets it in registers: Go's amd64
// calling convention has nine for integers, and report's arguments before
// stack take all nine. A fifth field (a timeout flag, counted in afterRun
// instead) made it go through memory and cost a run 4–5 %
// (BenchmarkRunSuccess, BenchmarkRunFailure).
type runEvent struct {
	recoveredAfter int64 // a streak of this many failures just ended
	streakStart    bool  // the first failure of a streak
	msgChanged     bool  // a failure within a streak, with a new message
	gaveUp         bool  // the retry step reached MaxRetries
}

func (ev runEvent) any() bool {
	return ev.recoveredAfter > 0 || ev.streakStart || ev.msgChanged || ev.gaveUp
}

// recordLocked records the outcome of a run (rule 3); msg is err's
// message. Parameters that became invalid while the run went on stay
// visible as the last error.
func (c *Controller) recordLocked(o outcome, err error, msg string, now int64) runEvent {
	var ev runEvent
	if o == outcomeFailure {
		ev.streakStart = c.consecutiveFailures == 0
		ev.msgChanged = c.recordFailureLocked(err, msg, now) && !ev.streakStart
	} else {
		c.successCount++
		c.lastSuccessTime = now
		ev.recoveredAfter = c.consecutiveFailures
		c.setConsecutiveLocked(0)
		c.lastErr, c.lastErrMsg = nil, ""
		if o == outcomeExit {
			c.lastErr, c.lastErrMsg = err, msg
		}
	}
	if c.invalid != nil {
		ev.recoveredAfter = 0
		c.setConsecutiveLocked(max(c.consecutiveFailures, 1))
		c.lastErr, c.lastErrMsg = c.invalid.err, c.invalid.err.Error()
	}
	return ev
}

// recordFailureLocked records a failure with err, whose message is msg, and
// reports whether the last error's message changed. The message is read
// anew for every failure, never assumed from the error value: an error
// value may be reused with a new text.
func (c *Controller) recordFailureLocked(err error, msg string, now int64) (msgChanged bool) {
	c.failureCount++
	c.setConsecutiveLocked(c.consecutiveFailures + 1)
	msgChanged = msg != c.lastErrMsg // the same string, as a reused message is, compares by pointer first
	c.lastErr, c.lastErrMsg, c.lastErrTime = err, msg, now
	return msgChanged
}

// inspectError reads err's message and, when classify is set, whether it
// is an [ExitReason]. Both ask err's own methods (Error, and Unwrap or As
// along its chain), which may panic: a typed nil pointer returned as an
// error is the classic case. Such a panic is recovered, and err is replaced
// by an error whose message says so and names err's type, so that one
// buggy DoFunc cannot end the process. It allocates only then.
func inspectError(err error, classify bool) (read error, msg string, exit bool) {
	method := "Error"
	defer func() {
		if r := recover(); r != nil {
			u := &unreadableError{msg: fmt.Sprintf("error of type %T: its %s method panicked: %v", err, method, r)}
			read, msg, exit = u, u.msg, false
		}
	}()
	if classify {
		method = "Unwrap or As"
		exit = isExitReason(err)
		method = "Error"
	}
	return err, err.Error(), exit
}

// ErrRunTimeout is wrapped by the error recorded for a run that lasted its
// [ControllerParams.RunTimeout], and is the cause ([context.Cause]) of that
// run's context, which ends then; check for it with errors.Is.
var ErrRunTimeout = errors.New("run timed out")

// RunTimeoutError is the error recorded for a run that lasted its
// RunTimeout, whatever DoFunc returned. It wraps [ErrRunTimeout] and the
// error DoFunc returned, if any:
//
//	run timed out: DoFunc ran for its RunTimeout of 5s: context deadline exceeded
type RunTimeoutError struct {
	Timeout time.Duration // the RunTimeout of the run
	Err     error         // what DoFunc returned; nil for nil
}

// Error names the timeout, then DoFunc's error.
func (e *RunTimeoutError) Error() string {
	msg := fmt.Sprintf("%v: DoFunc ran for its RunTimeout of %s", ErrRunTimeout, e.Timeout)
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Unwrap returns ErrRunTimeout and DoFunc's error.
func (e *RunTimeoutError) Unwrap() []error {
	if e.Err == nil {
		return []error{ErrRunTimeout}
	}
	return []error{ErrRunTimeout, e.Err}
}

// unreadableError stands in for an error whose methods panicked.
type unreadableError struct{ msg string }

func (e *unreadableError) Error() string { return e.msg }

// identical reports whether a and b are the very same error value: the same
// dynamic type and the same pointer. Unlike ==, it never panics on an
// incomparable type, and it says false for equal values stored apart. It
// only spares the loop classifying an error value it has classified
// already; it says nothing of the message, which a reused error value may
// have changed (so the message is read every time). A reused value whose
// chain gains or loses an ExitReason between returns keeps its first
// classification for as long as it keeps failing.
func identical(a, b error) bool {
	return a != nil && *(*[2]unsafe.Pointer)(unsafe.Pointer(&a)) == *(*[2]unsafe.Pointer)(unsafe.Pointer(&b))
}

// setConsecutiveLocked keeps controllers_failing in step with the failing
// state, so the gauge agrees with Health and FormatStatus.
func (c *Controller) setConsecutiveLocked(n int64) {
	if c.attached && (c.consecutiveFailures > 0) != (n > 0) {
		c.failingChanged(n > 0)
	}
	c.consecutiveFailures = n
}

// failingChanged moves controllers_failing as the controller starts or
// stops failing. It is kept out of line so that setConsecutiveLocked, on
// every run's path, is small enough to inline.
//
//go:noinline
func (c *Controller) failingChanged(failing bool) {
	if failing {
		c.met.addFailing(1)
	} else {
		c.met.addFailing(-1)
	}
}
