// Package controller runs retrying background controllers: named tasks that
// call a function until it succeeds, back off linearly between failures,
// re-run on an interval, and can be updated, triggered and removed while
// they run. It has the API of Cilium's pkg/controller without Cilium.
//
// # When to use it
//
// Use a controller for work that must eventually happen and be kept true:
// push state to a store until the store accepts it, renew a lease every
// few seconds, garbage-collect something once a minute. Each controller is
// one goroutine with its own schedule and statistics; an owner (say a
// network endpoint) embeds a [Manager] and removes all its controllers when
// it dies. For a queue of many keys processed by a fixed pool of workers,
// a work queue fits better.
//
// # Lifecycle
//
// [Manager.UpdateController] installs a controller and starts its goroutine,
// which calls DoFunc at once. What follows depends on the outcome:
//
//   - nil: a success. The controller runs again after RunInterval, or,
//     when RunInterval is 0, waits for an update or trigger.
//   - an error: a failure, retried after n × ErrorRetryBaseDuration for the
//     n-th failure in a row (capped by MaxRetryInterval, plus Jitter).
//   - an [ExitReason]: done; counted as a success, and the controller waits
//     for an update or trigger.
//
// Calling UpdateController again with the same name updates the parameters
// and runs DoFunc at once; [Manager.TriggerController] runs it at once with
// the same parameters. [Manager.RemoveController] cancels DoFunc's context;
// once DoFunc has returned, StopFunc runs once, and the controller is gone.
//
// # The DoFunc and StopFunc contract
//
// DoFunc SHOULD do one atomic step of work and return: nil when the state
// it maintains is in place, an error to be retried. It MAY be called many
// times over the controller's life, never two at once, so it SHOULD be
// idempotent. Its context is cancelled when the controller is removed (and
// on updates, with CancelDoFuncOnUpdate); it SHOULD return promptly then,
// and whatever it returns after cancellation is not counted as a failure.
// A panic is recovered and counted as a failure.
//
// StopFunc runs at most once, after the last DoFunc returned, and only if
// DoFunc ran at least once. Its context keeps the values of the controller's
// Context but is not cancelled by the removal; it is cancelled when a
// [Manager.Shutdown] deadline passes, and StopFunc SHOULD return then.
//
// # Observing controllers
//
// [Manager.GetStatusModel] and [GetGlobalStatus] return statuses whose JSON
// is Cilium's REST model; [FormatStatus] prints them as a table;
// [Manager.Health] names the failing ones; [Metrics] exports Prometheus
// metrics; logs go to logrus, with a Warn at the start of a failure streak
// rather than on every failed run.
package controller
