// params.go: the parameters a controller runs with, and their validation.

package controller

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"
)

// ControllerFunc is the signature of a controller's DoFunc and StopFunc.
//
// The context is cancelled when the controller is removed, and, for DoFunc,
// when an update or trigger asks for the running call to be cancelled (see
// [ControllerParams.CancelDoFuncOnUpdate]); [context.Cause] says why
// (rule 2 of the package documentation). A function should return promptly
// once its context is done; whatever it returns then is not counted as a
// failure.
type ControllerFunc func(ctx context.Context) error

// NoopFunc is a [ControllerFunc] that does nothing and returns nil. It is
// handy as a placeholder DoFunc for a controller that only needs a StopFunc.
func NoopFunc(ctx context.Context) error { return nil }

// Group names a family of controllers for the metrics label group_name. Use
// a small fixed set of groups ("endpoint-sync", "ipcache-gc", ...): a group
// must never be derived from a resource id, or the metrics' cardinality grows
// with the resources. The zero Group is "no group": such controllers are left
// out of the per-group metrics.
type Group struct {
	// Name is the value of the group_name label.
	Name string
}

// NewGroup returns the Group with the given name.
func NewGroup(name string) Group { return Group{Name: name} }

// HealthReporter receives the outcome of every run of a controller: the
// reporter of the parameters a run started with is told its outcome. Both
// methods are called from the controller's own goroutine (never two at
// once), after the outcome has been recorded and outside any lock of this
// package, so they may call back into the [Manager]. A panic in a
// HealthReporter is recovered and logged; the controller goes on.
type HealthReporter interface {
	// OK is called after a successful run, including one that ended with
	// an [ExitReason].
	OK(controllerName string)
	// Degraded is called after a failed run, after a failed StopFunc and
	// when a controller is given invalid parameters (then the reporter of
	// those parameters is told, even when an update replaced them at once).
	Degraded(controllerName string, err error)
}

// ControllerParams configures a controller. The zero value of every field
// but DoFunc is a valid choice; the comment on each field says what its zero
// value means.
//
// The wait after a run, and the retry formula that RunInterval,
// ErrorRetryBaseDuration, MaxRetryInterval, NoErrorRetry, Backoff,
// MaxRetries and Jitter feed, are rule 4 of the package documentation,
// with its defaults and sample sequences.
type ControllerParams struct {
	// Group is the metrics group of the controller. A run counts in the
	// group of the parameters it started with, so after an update the
	// next run counts in the new group. Zero: no group; the controller is
	// left out of controllers_group_runs_total.
	Group Group

	// DoFunc is the work of the controller. Required: a nil DoFunc makes
	// the parameters invalid. See [ControllerFunc].
	DoFunc ControllerFunc

	// StopFunc, when not nil, runs once when the controller is removed,
	// after its last DoFunc returned, provided DoFunc ran at least once.
	// Its context keeps the values of Context, is not cancelled by the
	// removal, and is cancelled when a [Manager.Shutdown] deadline passes.
	// Nil: nothing runs on removal.
	StopFunc ControllerFunc

	// RunInterval is the wait between the end of a run and the start of
	// the next one. Zero: after a success the controller waits for an
	// update or a trigger.
	RunInterval time.Duration

	// ErrorRetryBaseDuration is the unit of the retry backoff (rule 4).
	// Zero means 1s.
	ErrorRetryBaseDuration time.Duration

	// MaxRetryInterval caps the retry wait, before the jitter (rule 4).
	// Zero: no cap.
	MaxRetryInterval time.Duration

	// NoErrorRetry, when true, schedules no retry after a failure: the
	// next run comes after RunInterval if that is > 0, else on an update or
	// trigger. False (the default): failures are retried with backoff.
	NoErrorRetry bool

	// Backoff is how the retry wait grows with the failures in a row
	// (rule 4). Zero: [LinearBackoff], Cilium's. It sits here, after a
	// bool, where it takes no room of its own.
	Backoff Backoff

	// MaxRetries stops the retries once this many failures happened since
	// the last success or update; the controller then behaves as with
	// NoErrorRetry until a success or an update. Zero: retry for ever.
	MaxRetries int

	// Jitter adds a random duration in [0, Jitter) to every timed wait (the
	// retry wait after the cap, and RunInterval), never to the first run or
	// to a run caused by an update or trigger. Zero: no jitter.
	Jitter time.Duration

	// CancelDoFuncOnUpdate, when true, makes an update or a trigger cancel
	// the context of the DoFunc that is running, so the new run starts
	// sooner. False (the default): the running DoFunc is left to finish.
	// The value of the parameters the running DoFunc was started with
	// decides.
	CancelDoFuncOnUpdate bool

	// RunTimeout bounds a run: DoFunc's context ends once the run has
	// lasted this long, and a run that lasts this long is a failure
	// wrapping [ErrRunTimeout], whatever DoFunc returned (rule 3),
	// counted in controllers_run_timeouts_total; unless a removal,
	// update or trigger cancelled it first (the first cause wins). A
	// DoFunc that ignores
	// its context still runs on: [Manager.Health] then names it. Zero:
	// no bound (a run costs one context and one timer when set).
	RunTimeout time.Duration

	// Context is the parent of the context DoFunc gets. When it ends, the
	// running DoFunc is cancelled and the controller stops running DoFunc
	// until an update brings a live context. Nil means
	// context.Background().
	Context context.Context

	// Health, when not nil, is told the outcome of every run. Nil: nothing
	// is told.
	Health HealthReporter
}

// ErrInvalidParams is wrapped by every error [ControllerParams.Validate]
// returns; check for it with errors.Is.
var ErrInvalidParams = errors.New("invalid controller parameters")

// Validate reports whether the parameters can run. It rejects a nil
// DoFunc; a negative RunInterval, ErrorRetryBaseDuration,
// MaxRetryInterval, Jitter, MaxRetries or RunTimeout; a Backoff that is
// none of the policies; and a Group name that is not valid UTF-8, which no
// Prometheus label can hold. The error names every offending field with
// its value and wraps [ErrInvalidParams].
func (p ControllerParams) Validate() error {
	var errs []error
	bad := func(field string, value any) {
		errs = append(errs, fmt.Errorf("%w: %s must not be negative, got %v", ErrInvalidParams, field, value))
	}
	if p.DoFunc == nil {
		errs = append(errs, fmt.Errorf("%w: DoFunc must not be nil", ErrInvalidParams))
	}
	if p.RunInterval < 0 {
		bad("RunInterval", p.RunInterval)
	}
	if p.ErrorRetryBaseDuration < 0 {
		bad("ErrorRetryBaseDuration", p.ErrorRetryBaseDuration)
	}
	if p.MaxRetryInterval < 0 {
		bad("MaxRetryInterval", p.MaxRetryInterval)
	}
	if p.Jitter < 0 {
		bad("Jitter", p.Jitter)
	}
	if p.MaxRetries < 0 {
		bad("MaxRetries", p.MaxRetries)
	}
	if p.RunTimeout < 0 {
		bad("RunTimeout", p.RunTimeout)
	}
	if !p.Backoff.valid() {
		errs = append(errs, fmt.Errorf("%w: Backoff must be LinearBackoff, ExponentialBackoff or ConstantBackoff, got %v", ErrInvalidParams, p.Backoff))
	}
	if !utf8.ValidString(p.Group.Name) {
		errs = append(errs, fmt.Errorf("%w: Group.Name must be valid UTF-8 (it is the metrics label group_name), got %q", ErrInvalidParams, p.Group.Name))
	}
	return errors.Join(errs...)
}
