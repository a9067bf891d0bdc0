// middleware.go: the run middleware that starts a span per run, and how
// it names a run's outcome.

package otel

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/bgctl/controller"
	otelglobal "go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of the tracer the middleware
// asks its TracerProvider for.
const ScopeName = "github.com/bgctl/controller/otel"

// The attributes of a run's span; see the package documentation.
const (
	NameKey                = attribute.Key("controller.name")
	GroupKey               = attribute.Key("controller.group")
	ConsecutiveFailuresKey = attribute.Key("controller.consecutive_failures")
	OutcomeKey             = attribute.Key("controller.outcome")
	ExitReasonKey          = attribute.Key("controller.exit_reason")
	CancelCauseKey         = attribute.Key("controller.cancel_cause")
)

// The values of OutcomeKey.
const (
	OutcomeSuccess   = "success"
	OutcomeFailure   = "failure"
	OutcomeExit      = "exit"
	OutcomeCancelled = "cancelled"
	OutcomeTimeout   = "timeout"
)

// Option configures [Middleware].
type Option func(*config)

type config struct {
	provider trace.TracerProvider            // nil: the global one, asked at each wrap
	spanName func(controller.RunInfo) string // nil: the controller's name
}

// WithTracerProvider makes the middleware start its spans from tp.
// Default (and for a nil tp): the global provider, otel.GetTracerProvider,
// asked each time a DoFunc is wrapped, so one set later still applies to
// the controllers updated after.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) { c.provider = tp }
}

// WithSpanName makes the middleware name each run's span name(info)
// instead of the controller's name, info.Name. A tracing backend indexes
// and groups by span name, so controllers named per resource
// ("endpoint-12-sync", one per endpoint) make as many span names as there
// are resources; name them from a small fixed set, such as their group,
// and find a controller by its controller.name attribute, which every
// span keeps. name is called once per set of parameters (when the
// Manager wraps a DoFunc), never per run; an empty result, or a nil name,
// leaves the controller's name.
func WithSpanName(name func(info controller.RunInfo) string) Option {
	return func(c *config) { c.spanName = name }
}

// Middleware returns a [controller.RunMiddleware] that starts a span for
// every run, named after the controller (or as [WithSpanName] says), ends
// it when DoFunc returns, and
// records the run's outcome on it (see the package documentation).
// Install it with [controller.WithRunMiddleware].
func Middleware(opts ...Option) controller.RunMiddleware {
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	return func(info controller.RunInfo, do controller.ControllerFunc) controller.ControllerFunc {
		tp := cfg.provider
		if tp == nil {
			tp = otelglobal.GetTracerProvider()
		}
		r := &runTracer{
			tracer:  tp.Tracer(ScopeName),
			name:    info.Name,
			timeout: info.RunTimeout,
			ctl:     info.Controller,
			do:      do,
		}
		if cfg.spanName != nil {
			if name := cfg.spanName(info); name != "" {
				r.name = name
			}
		}
		// Made once per wrap, not per run.
		attrs := []attribute.KeyValue{NameKey.String(info.Name)}
		if info.Group.Name != "" {
			attrs = append(attrs, GroupKey.String(info.Group.Name))
		}
		r.start = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(attrs...)}
		return r.run
	}
}

// runTracer wraps one DoFunc. Its fields are set once, by the wrap, and
// only read by the runs, which never overlap.
type runTracer struct {
	tracer  trace.Tracer
	name    string        // the span's
	timeout time.Duration // the parameters' RunTimeout
	start   []trace.SpanStartOption
	ctl     *controller.Controller // nil: no failure count
	do      controller.ControllerFunc
}

// run is the wrapped DoFunc: a span around one call of do.
func (r *runTracer) run(ctx context.Context) (err error) {
	ctx, span := r.tracer.Start(ctx, r.name, r.start...)
	if r.ctl != nil && span.IsRecording() {
		span.SetAttributes(ConsecutiveFailuresKey.Int(r.ctl.GetConsecutiveFailureCount()))
	}
	returned := false
	defer func() {
		if returned {
			return
		}
		// A panic: record it and end the span (so the SDK does not
		// record it a second time), then pass it on to the controller,
		// which recovers it and counts a failure.
		p := recover()
		if p == nil {
			// runtime.Goexit (since Go 1.21, panic(nil) recovers as a
			// *runtime.PanicNilError): let it go on.
			span.End()
			return
		}
		perr, ok := p.(error)
		if ok {
			perr = fmt.Errorf("panic: %w", perr)
		} else {
			perr = fmt.Errorf("panic: %v", p)
		}
		recordFailure(span, OutcomeFailure, perr)
		span.End()
		panic(p)
	}()
	err = r.do(ctx)
	returned = true
	if span.IsRecording() {
		r.recordOutcome(ctx, span, err)
	}
	span.End()
	return err
}

// recordOutcome sets the outcome of a run that returned err, and what
// goes with it, on span. A timed-out run's error is the one the
// controller records, a [controller.RunTimeoutError] naming the
// RunTimeout (and DoFunc's error, if any), not what DoFunc returned
// alone, which is often just "context deadline exceeded" or nil.
func (r *runTracer) recordOutcome(ctx context.Context, span trace.Span, err error) {
	switch outcome, detail := outcomeOf(ctx, err); outcome {
	case OutcomeSuccess:
		span.SetAttributes(OutcomeKey.String(outcome))
	case OutcomeExit:
		span.SetAttributes(OutcomeKey.String(outcome), ExitReasonKey.String(detail))
	case OutcomeCancelled:
		span.SetAttributes(OutcomeKey.String(outcome), CancelCauseKey.String(detail))
	case OutcomeTimeout:
		te := &controller.RunTimeoutError{Timeout: r.timeout}
		if err != nil {
			// Its message, read safely, as the controller reads it.
			te.Err = errors.New(message(err))
		}
		recordFailure(span, outcome, te)
	default:
		recordFailure(span, outcome, err)
	}
}

// recordFailure marks span as a failed run, with err recorded.
func recordFailure(span trace.Span, outcome string, err error) {
	msg := message(err)
	span.SetAttributes(OutcomeKey.String(outcome))
	// RecordError reads err's message itself: give it the one read
	// safely, so a panicking Error method cannot end the controller's
	// goroutine here.
	span.RecordError(errors.New(msg))
	span.SetStatus(codes.Error, msg)
}

// outcomeOf names what a run that returned err was, as the controller
// decides it (rule 3), with the exit reason or the cancellation's cause.
// A DoFunc's error may have methods that panic (a typed nil pointer): the
// controller counts that as a failure, and so does this.
func outcomeOf(ctx context.Context, err error) (outcome, detail string) {
	defer func() {
		if recover() != nil {
			outcome, detail = OutcomeFailure, ""
		}
	}()
	cancelled := ctx.Err() != nil
	cause := context.Cause(ctx)
	switch {
	case cancelled && errors.Is(cause, controller.ErrRunTimeout):
		return OutcomeTimeout, ""
	case err == nil:
		return OutcomeSuccess, ""
	case cancelled:
		return OutcomeCancelled, message(cause)
	case errors.As(err, new(controller.ExitReason)):
		return OutcomeExit, message(err)
	}
	return OutcomeFailure, ""
}

// message returns err's message, or, when its Error method panics, a
// message that says so and names its type.
func message(err error) (msg string) {
	if err == nil {
		return ""
	}
	defer func() {
		if r := recover(); r != nil {
			msg = fmt.Sprintf("error of type %T: its Error method panicked: %v", err, r)
		}
	}()
	return err.Error()
}
