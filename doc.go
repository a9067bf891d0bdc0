// Package controller runs retrying background controllers: named tasks that
// call a function until it succeeds, back off linearly between failures,
// re-run on an interval, and can be updated, triggered and removed while
// they run. It has the API of Cilium's pkg/controller without Cilium, and
// without the bugs listed in the README.
//
// # When to use it
//
// Use a controller for a piece of state that must eventually be made true
// and then kept true for as long as some owner lives: push an endpoint to a
// store until the store accepts it, renew a lease every few seconds,
// garbage-collect something once a minute, create a pod in a provider and
// keep it in step. Each controller is one goroutine with its own schedule,
// its own statistics and its own entry in the status output, so an operator
// can see which piece of state is stuck and why. The owner (a network
// endpoint, a node, a pod) embeds a [Manager] and removes all its
// controllers when it goes away.
//
// A controller is not a work queue. When many keys share a fixed pool of
// workers and a per-key rate limit, and there is no per-key status to show,
// client-go's workqueue (or a channel and a few goroutines) fits better;
// when a set of goroutines must finish together and report the first
// error, use golang.org/x/sync/errgroup. Controllers suit a moderate number
// of long-lived tasks, each of which deserves a name.
//
// # A controller's life
//
// [Manager.UpdateController] installs a controller under a name and starts
// its goroutine, which calls DoFunc at once: always, even when the
// controller is removed before the goroutine gets to run (DoFunc then gets
// a context that is already cancelled). What comes next depends on what
// DoFunc returned:
//
//   - nil: a success. The controller runs again after RunInterval; with a
//     RunInterval of 0 it waits for an update or a trigger.
//   - an [ExitReason], or an error wrapping one: done. It counts as a
//     success, the reason stays visible as the last error, and the
//     controller waits for an update or a trigger.
//   - any error, after DoFunc's context was cancelled: recorded as the
//     ExitReason "controller context canceled", never as a failure.
//   - any other error, or a panic: a failure, retried after a wait that
//     grows linearly with the number of failures in a row.
//
// The wait after the n-th failure since the last success or update is
//
//	min(n × ErrorRetryBaseDuration, MaxRetryInterval) + a random [0, Jitter)
//
// measured from the moment DoFunc returned. ErrorRetryBaseDuration
// defaults to 1s, MaxRetryInterval of 0 means no cap and Jitter of 0 no
// jitter, so by default a controller that keeps failing waits 1s, 2s, 3s,
// 4s, …. Jitter is added after the cap, and to RunInterval waits as well,
// but never to the first run or to a run caused by an update or trigger.
// With MaxRetries > 0 the retries stop after that many failures since the
// last success or update, and with NoErrorRetry there are none: the
// controller then runs again only after RunInterval (if > 0), or on an
// update or trigger.
//
// While a controller waits, three things can happen to it:
//
//   - [Manager.UpdateController] with the same name gives it new
//     parameters. DoFunc runs at once with them and the backoff starts
//     again at n = 1; the controller keeps its UUID and its statistics.
//   - [Manager.TriggerController] makes DoFunc run at once with the same
//     parameters; the backoff goes on where it was.
//   - [Manager.RemoveController] (or RemoveControllerAndWait, RemoveAll,
//     RemoveAllAndWait, Shutdown) cancels DoFunc's context. Once the running
//     DoFunc has returned, StopFunc runs, the termination channel
//     ([Manager.TerminationChannel]) is closed, and the goroutine ends.
//
// Updates and triggers that arrive while DoFunc runs are not lost: they are
// coalesced into one more run, with the newest parameters. When a removal
// arrives with them, the removal wins.
//
// # The DoFunc and StopFunc contract
//
// A DoFunc SHOULD do one step of work and return: nil when the state it
// maintains is in place, an error when it is not yet. It SHOULD NOT loop,
// sleep or retry on its own; returning an error is how it asks for a retry,
// and RunInterval is how it asks to be called again.
//
// A DoFunc MAY be called many times over the controller's life: after every
// RunInterval, after every failure, and on every update or trigger. It is
// never called twice at once, and never while the StopFunc runs, so state
// that only the DoFunc and the StopFunc touch needs no lock. It SHOULD be
// idempotent: a run may repeat work a failed run already half did.
//
// DoFunc's context is cancelled when the controller is removed, when the
// parameters' Context ends, when an update brings a different Context, and,
// with CancelDoFuncOnUpdate, when an update or trigger wants a fresh run.
// Cancellation means "stop, nobody needs the result": DoFunc SHOULD pass
// the context to whatever it blocks on and return promptly once it is
// done. Whatever it returns then is not counted as a failure.
//
// A DoFunc SHOULD return an ExitReason when there is nothing more to do,
// rather than nil with a RunInterval that would run it again. It SHOULD NOT
// panic: a panic is recovered, counted as a failure ("panic: <value>") and
// logged with its stack, but the work it interrupted stays half done.
//
// A DoFunc MUST NOT wait for its own controller to stop: calling
// RemoveControllerAndWait on its own name, or RemoveAllAndWait or Shutdown
// on its own Manager, waits for the DoFunc itself to return, for ever.
// RemoveController, UpdateController and TriggerController are fine.
//
// A StopFunc runs at most once, when the controller is removed, after its
// last DoFunc has returned, and only if a DoFunc ran: a controller that
// never ran (its parameters were invalid from the start) runs no StopFunc.
// It is the StopFunc of the newest valid parameters. Its context keeps the
// values of the parameters' Context but is not cancelled by the removal;
// it is cancelled when the deadline of a [Manager.Shutdown] passes, and the
// StopFunc SHOULD return then. A StopFunc error is recorded as a failure
// and logged; it is not retried.
//
// A [HealthReporter] is called on the controller's goroutine after every
// run, once the outcome is recorded. It SHOULD return quickly: the next run
// waits for it.
//
// # Writing controllers
//
// Make each run an atomic step. A run either brings the world one
// consistent step closer to the goal or fails without leaving it in a state
// the next run cannot read. Split a long job into several runs (or several
// controllers), keep the progress in the owner, and let the next run pick
// it up from there.
//
// Lock the owner, briefly. A DoFunc runs on its own goroutine, alongside the
// owner's other methods and its other controllers. Take the owner's lock to
// read what the run needs or to record what it did, and do not hold it
// across slow calls to a store or a network, or one stuck request stalls
// the owner. Never hold a lock that a DoFunc or StopFunc takes while calling
// RemoveControllerAndWait, RemoveAllAndWait or Shutdown: they wait for those
// functions to return.
//
// Bind controllers to the owner's lifetime. Embed a Manager in the owner
// (the zero Manager is ready to use), name its controllers after the owner
// ("endpoint-12-sync-to-store"), and tear the owner down with
// [Manager.Shutdown] and a deadline, or RemoveAllAndWait: when they return,
// no DoFunc or StopFunc of the owner is running or will run. Passing an
// owner's context as the parameters' Context stops DoFunc runs when that
// context ends, but the controllers stay installed until they are removed.
//
// Use a [Group] from a small fixed set ("endpoint-sync", "pod-gc"), never
// one derived from a resource id: the group is a metrics label.
//
// # Observing controllers
//
// [Manager.GetStatusModel] and [GetGlobalStatus] return statuses whose JSON
// is Cilium's REST model; [FormatStatus] prints them as a table;
// [Manager.Health] names the failing controllers; [Metrics] exports
// Prometheus metrics, registered where the program chooses. Logs go to
// logrus: a Warn at the start of a failure streak and when its error
// changes, an Info on recovery and on giving up after MaxRetries, an Error
// for panics and invalid parameters, never one line per failed run.
// A controller is failing while its consecutive failure count is above
// zero; the status table, Health and the controllers_failing metric all use
// that rule.
//
// # Goroutines
//
// Each controller has one goroutine, started by UpdateController or
// CreateController and owned by the Manager. Join it with
// RemoveControllerAndWait, RemoveAllAndWait or Shutdown, or wait on its
// TerminationChannel after removing it. The package starts no other
// goroutine (but for what the context package starts when a parameters'
// Context is of a type of its own).
package controller
