// Package otel traces the runs of github.com/bgctl/controller's
// controllers with OpenTelemetry: one span per run of a DoFunc, with the
// controller's name and group, the failures in a row before the run and
// the run's outcome as attributes, and the error recorded on a failure.
//
// It is a module of its own, so that the core keeps its few dependencies:
// only a program that imports this package pulls in OpenTelemetry. Its
// name clashes with go.opentelemetry.io/otel's; import it under another:
//
//	import ctlotel "github.com/bgctl/controller/otel"
//
//	mgr := controller.NewManager(controller.WithRunMiddleware(ctlotel.Middleware()))
//
// [Middleware] is a [controller.RunMiddleware]: the Manager wraps each
// DoFunc once per set of parameters, and each run then starts a span from
// the run's context, so a params.Context that carries a span makes the
// runs its children. StopFuncs are not traced.
//
// # Span names
//
// A run's span is named after its controller: the span name is the
// controller's name. Tracing backends index and group spans by name, so
// controllers named per resource ("endpoint-12-sync", one per endpoint)
// make one span name per resource, a cardinality most backends charge for
// or cap. [WithSpanName] names the spans from something of a small fixed
// set instead, such as the controller's group; the controller.name
// attribute still says which controller ran:
//
//	ctlotel.Middleware(ctlotel.WithSpanName(func(info controller.RunInfo) string {
//		return "controller " + info.Group.Name
//	}))
//
// # Attributes
//
// Every span has controller.name and, when the controller has a group,
// controller.group; controller.consecutive_failures is the number of
// failures in a row before the run (0 after a success; n before the
// (n+1)-th attempt). When the run ends, controller.outcome says how:
//
//   - success: DoFunc returned nil.
//   - exit: it returned an [controller.ExitReason] (or an error wrapping
//     one); controller.exit_reason holds its message.
//   - cancelled: it returned an error after its context was cancelled;
//     controller.cancel_cause holds the cause (see controller's
//     ErrControllerRemoved and the others). The controller records an
//     ExitReason, not a failure.
//   - timeout: the run's RunTimeout ended its context before anything
//     else cancelled it (its cause is controller.ErrRunTimeout); the span's
//     status is Error, as the controller counts a failure, and the error
//     recorded is the one the controller records, a
//     [controller.RunTimeoutError] ("run timed out: DoFunc ran for its
//     RunTimeout of 5s: context deadline exceeded"), not what DoFunc
//     returned alone.
//   - failure: any other error, or a panic (recorded as "panic: <value>",
//     and passed on to the controller, which recovers it); the error is
//     recorded and the span's status is Error.
//
// These follow the controller's own rule 3 (see the package documentation
// of github.com/bgctl/controller), seen from inside the run: a timeout
// followed by a removal is a timeout in both, a removal followed by a
// timeout a cancelled run in both. One limit: the span reads the context
// as DoFunc returns, and the controller also counts as timed out a run
// that lasted its RunTimeout while the context's timer had not yet
// cancelled it; a DoFunc that ignores its context and returns at the very
// instant its RunTimeout passes may be a timeout in the controller's
// status and a success (or a failure) here.
package otel
