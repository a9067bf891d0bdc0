// Package controller runs retrying background controllers: named tasks that
// call a function until it succeeds, back off between failures (linearly,
// as Cilium's do, exponentially or by a constant), re-run on an interval,
// and can be updated, triggered and removed while they run. It has the
// API of Cilium's pkg/controller without Cilium, and without the bugs
// listed in docs/coming-from.md.
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
// # A controller's life: the run-loop rules
//
// [Manager.UpdateController] installs a controller under a name and starts
// its goroutine. From then on the controller obeys eight rules. They are
// numbered once, here; the code and the tests cite them as "rule N".
//
// Rule 1, the first run. A new controller calls DoFunc at once, on its own
// goroutine: always, even when it is removed before that goroutine gets to
// run (DoFunc then gets a context that is already cancelled). A
// controller whose parameters are invalid from the start makes no run.
//
// Rule 2, the run context. DoFunc gets the controller's run context:
// derived from the parameters' Context (nil means Background), cancelled on
// removal, and replaced, the old one cancelled, on an update or trigger
// when CancelDoFuncOnUpdate is set, or on an update that brings a
// different Context. Otherwise it is reused from run to run. With a
// RunTimeout, each run gets a child of it that ends after RunTimeout.
// Whoever cancels it gives the cause ([context.Cause]):
// [ErrControllerRemoved], [ErrManagerShutDown], [ErrControllerUpdated],
// [ErrControllerTriggered] or [ErrRunTimeout]; when the parameters'
// Context ends, its own cause passes through untouched.
//
// Rule 3, what a run's result means:
//
//   - nil: a success. The success count goes up, the last-success time is
//     set, the consecutive failures go back to 0 and the last error is
//     cleared.
//   - an [ExitReason], or an error wrapping one: done. It counts as a
//     success, the reason stays visible as the last error, and the
//     controller waits for an update, a trigger or its removal.
//   - any error, after the run context was cancelled: recorded as the
//     ExitReason "controller context canceled", never as a failure. Once
//     the parameters' Context itself has ended, the controller parks: no
//     DoFunc runs on timers or triggers until an update brings a live
//     Context.
//   - anything, nil included, from a run that lasted the parameters'
//     RunTimeout (when it is above zero; DoFunc's context ended then): a
//     failure whose error wraps [ErrRunTimeout] and what DoFunc returned,
//     and names the timeout, counted in controllers_run_timeouts_total
//     as well. The first cause wins: a removal, update or trigger that
//     cancelled the run, or the end of the parameters' Context, before
//     the RunTimeout passed makes the run one of the cases above (nil a
//     success, an error a cancelled run), and one that came after it
//     leaves it a timeout.
//   - any other error, or a panic (recovered; its error reads
//     "panic: <value>" and the stack goes to the log): a failure. The
//     failure count and the consecutive failures go up, and the last
//     error and its time are set. An error whose own methods panic (a
//     typed nil pointer returned as an error) is recorded as a failure
//     whose message says so and names its type.
//
// Rule 4, the wait after a run, measured from the moment DoFunc returned.
// After a success it is RunInterval; with a RunInterval of 0 the
// controller waits for an update or a trigger. After the n-th failure
// since the last success or update (n = 1, 2, 3, …) it is
//
//	wait(n) = min(backoff(n), MaxRetryInterval) + random[0, Jitter)
//
// where backoff(n) is the parameters' [Backoff] policy, with the unit
// b = ErrorRetryBaseDuration (1s when 0):
//
//	LinearBackoff (the default, Cilium's)  n × ErrorRetryBaseDuration  waits of 1s, 2s, 3s, 4s, …
//	ExponentialBackoff                     b × 2^(n−1)                 waits of 1s, 2s, 4s, 8s, …
//	ConstantBackoff                        b                           waits of 1s, 1s, 1s, 1s, …
//
// The cap applies only when MaxRetryInterval > 0, and the jitter, when
// Jitter > 0, comes after the cap (a wait may exceed MaxRetryInterval by
// less than Jitter). The arithmetic saturates at the largest
// [time.Duration]. With the defaults a controller that keeps failing runs
// at
//
//	0s, 1s, 3s, 6s, 10s, 15s, …   (waits of 1s, 2s, 3s, 4s, 5s)
//
// with MaxRetryInterval 3s at 0s, 1s, 3s, 6s, 9s, 12s, …, and with
// ExponentialBackoff at 0s, 1s, 3s, 7s, 15s, 31s, …. With
// NoErrorRetry, or once n has reached MaxRetries > 0, no retry is
// scheduled: the next run comes after RunInterval (if > 0), or on an
// update or trigger; never in a busy loop. Jitter is added to every timed
// wait (retries and RunInterval), never to the first run or to a run an
// update or trigger asked for.
//
// Rule 5, while waiting. A removal ([Manager.RemoveController] and the
// others) ends the loop. An update ([Manager.UpdateController] with the
// same name) runs DoFunc at once with the new parameters and starts the
// backoff again at n = 1. A trigger ([Manager.TriggerController]) runs
// DoFunc at once and keeps n. Updates and triggers that arrive while
// DoFunc runs are not lost: they are coalesced into one more run, with the
// newest parameters. When a removal arrives with them, the removal wins
// and no further DoFunc starts. With CancelDoFuncOnUpdate, the value in the
// parameters the running DoFunc started with decides whether an update or
// trigger cancels it. With a Manager's [WithTriggerDebounce] window d, "at
// once" becomes "at once, or d after the previous run ended if that is
// later": the run is held, never dropped, and the updates and triggers
// that come meanwhile coalesce into it; a removal still ends the wait at
// once, and a timed run due sooner still comes on time.
//
// Rule 6, no overlap. At most one DoFunc of a controller runs at a time,
// and DoFunc never overlaps its StopFunc.
//
// Rule 7, removal. The run context is cancelled; the loop ends once the
// running DoFunc has returned; then, if DoFunc ran at least once, StopFunc
// runs exactly once, with a context that keeps the values of the
// parameters' Context, is not cancelled by the removal, and is cancelled
// when a [Manager.Shutdown] deadline passes. A StopFunc error or panic is
// recorded as a failure and logged. Then the termination channel
// ([Manager.TerminationChannel]) is closed and the goroutine ends.
//
// Rule 8, identity. An update keeps the controller's UUID and its
// counters; the group and every other setting follow the newest
// parameters, metrics included.
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
// with CancelDoFuncOnUpdate, when an update or trigger wants a fresh run;
// context.Cause tells which (rule 2), should the DoFunc care, say to
// release a lock on removal but keep it across an update.
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
// no DoFunc or StopFunc of the owner is running or will run. Shutdown ends
// the Manager's life: from the moment it is called, installs are refused
// (logged at Warn), so a late event handler cannot bring a dead owner's
// controllers back. RemoveAllAndWait empties the Manager and leaves it
// usable, as Cilium's does. Passing an
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
// [Manager.Health] names the controllers that are not healthy; [Metrics]
// exports Prometheus metrics, registered where the program chooses. Logs
// go to logrus, or to log/slog with [WithSlog]: a Warn at the start of a
// failure streak and when its error changes, an Info on recovery and on
// giving up after MaxRetries, an Error for panics and invalid parameters,
// never one line per failed run. Every line carries subsys=controller,
// and a controller's its name and UUID: on logrus under Cilium's keys,
// name and uuid, so that a query written for Cilium's logs still finds
// them; on slog in the group controller (controller.name and
// controller.uuid in a text handler's output), so that a logger made with
// With("name", …) keeps its own name. Every controller's goroutine carries the
// pprof labels controller=<name> and group=<group> ([ControllerLabel]), so
// a CPU profile and a goroutine dump say which controller each goroutine
// serves; they are the goroutine's, not the run context's, so a DoFunc
// that calls pprof.Do with its context leaves the goroutine without them
// unless the parameters' Context carries them ([ControllerLabel] says
// how).
//
// Healthy has one meaning, stated here. A controller is healthy unless it
// is failing or stuck:
//
//   - failing: its consecutive failure count is above zero (a failed run,
//     a failed StopFunc or invalid parameters since the last success);
//   - stuck: its running DoFunc has run longer than its RunTimeout, or,
//     without one, than the Manager's [WithStuckAfter] threshold (off by
//     default).
//
// Every output counts by that rule: [FormatStatus]'s "healthy" line and
// its all=false table, [StatusHandler] in every format and with failing=1
// (the status's "stuck" field says which runs are stuck), [Manager.Health],
// [HealthHandler], and the controllers_unhealthy metric. The
// controllers_failing metric counts the failing ones alone, as Cilium's
// does.
//
// # Wrapping every run
//
// [WithRunMiddleware] gives a Manager a [RunMiddleware]: a function that
// wraps the DoFunc of each of its controllers, once per set of parameters
// and never per run, to trace, time or limit the runs. The module
// github.com/bgctl/controller/otel is one: a span per run, with the
// outcome. StopFuncs are not wrapped. Without middleware the run loop is
// unchanged.
//
// # Testing your controllers
//
// testing/synctest makes tests of controllers exact and instant: inside a
// bubble, time moves only when every goroutine is blocked, so retries come
// at exactly 1s, 3s, 6s, … and the test takes no time. Make the Manager, or
// at least install the controllers, inside the bubble; call synctest.Wait
// before reading a status, so every controller has done what it could at
// this instant; and end with RemoveAllAndWait or Shutdown, so that
// go.uber.org/goleak finds no goroutine left behind. To wait for a number
// of runs without polling, give the controller a
// github.com/bgctl/controller/controllertest.Runs as its HealthReporter: it
// never blocks the controller, as a reporter sending on an unbuffered
// channel would. [WithJitterSource] makes jittered waits the same on every
// run, and [FakeManager] serves code that only reads statuses.
// docs/testing.md shows each of these as a test.
//
// # Goroutines
//
// Each controller has one goroutine, started by UpdateController or
// CreateController and owned by the Manager. Join it with
// RemoveControllerAndWait, RemoveAllAndWait or Shutdown, or wait on its
// TerminationChannel after removing it. The package starts no other
// goroutine (but for what the context package starts when a parameters'
// Context is of a type of its own, and the short-lived one of each
// Manager's timer that warns of controllers slow to stop).
//
// # Stuck work
//
// Failures are not the only trouble an operator looks for. A running
// DoFunc shows in its status (running-since) and in the
// controllers_longest_running_seconds gauge; Health names a run that
// outlasted its RunTimeout, or the Manager's [WithStuckAfter] threshold. A
// removed controller whose DoFunc or StopFunc has not returned is listed by
// [Manager.GetStoppingStatus] and [GetGlobalStoppingStatus], and counted in
// controllers_stopping, until it terminates, also after a Shutdown
// deadline; after a minute ([WithSlowStopWarning]) it is logged at Warn,
// once. [StatusHandler] and [HealthHandler] serve all of this over HTTP.
package controller
