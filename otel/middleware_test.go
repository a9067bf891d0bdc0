// Tests of the tracing middleware, against the SDK's in-memory span
// recorder, in testing/synctest bubbles: spans start and end at the exact
// times of the runs.

package otel_test

import (
	"context"
	"errors"
	"io"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/bgctl/controller"
	ctlotel "github.com/bgctl/controller/otel"
	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	otelglobal "go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// tracing is a Manager whose runs are traced into an in-memory recorder.
type tracing struct {
	m        *controller.Manager
	rec      *tracetest.SpanRecorder
	provider *sdktrace.TracerProvider
}

func newTracing(t *testing.T, opts ...sdktrace.TracerProviderOption) *tracing {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(append([]sdktrace.TracerProviderOption{sdktrace.WithSpanProcessor(rec)}, opts...)...)
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	quiet := logrus.New()
	quiet.SetOutput(io.Discard)
	m := controller.NewManager(
		controller.WithLogger(quiet),
		controller.WithMetrics(nil),
		controller.WithRunMiddleware(ctlotel.Middleware(ctlotel.WithTracerProvider(tp))),
	)
	return &tracing{m: m, rec: rec, provider: tp}
}

// run is what a test reads of one ended span.
type run struct {
	Name     string
	At       time.Duration // when it started, from the test's start
	Took     time.Duration
	Outcome  string
	Failures int64  // controller.consecutive_failures
	Detail   string // the exit reason, or the cancellation's cause
	Status   codes.Code
	Error    string // the status description, and the exception event's message
}

// runs returns the ended spans, oldest first, as runs timed from start.
func (tr *tracing) runs(t *testing.T, start time.Time) []run {
	t.Helper()
	var out []run
	for _, s := range tr.rec.Ended() {
		r := run{Name: s.Name(), At: s.StartTime().Sub(start), Took: s.EndTime().Sub(s.StartTime()), Status: s.Status().Code}
		for _, a := range s.Attributes() {
			switch a.Key {
			case ctlotel.OutcomeKey:
				r.Outcome = a.Value.AsString()
			case ctlotel.ConsecutiveFailuresKey:
				r.Failures = a.Value.AsInt64()
			case ctlotel.ExitReasonKey, ctlotel.CancelCauseKey:
				r.Detail = a.Value.AsString()
			}
		}
		if r.Status == codes.Error {
			r.Error = s.Status().Description
			require.Len(t, s.Events(), 1, "%+v", s.Events())
			ev := s.Events()[0]
			assert.Equal(t, "exception", ev.Name)
			assert.Contains(t, ev.Attributes, attribute.String("exception.message", r.Error))
		}
		out = append(out, r)
	}
	return out
}

var errBoom = errors.New("boom")

// Every run is a span named after the controller, from the moment DoFunc
// is called to the moment it returns, with its group, the failures in a
// row before it, and its outcome; a failure records its error.
func TestASpanPerRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTracing(t)
		start := time.Now()
		results := []error{errBoom, errBoom, nil, controller.NewExitReason("all synced")}
		n := 0
		c := tr.m.UpdateController("sync", controller.ControllerParams{
			Group: controller.NewGroup("store"),
			DoFunc: func(context.Context) error {
				time.Sleep(100 * time.Millisecond)
				n++
				return results[n-1]
			},
			RunInterval: 10 * time.Second,
		})
		time.Sleep(time.Minute)
		tr.m.RemoveAllAndWait()
		// Runs at 0, then 1s and 2s after the failures ended, then 10s
		// after the success.
		const took = 100 * time.Millisecond
		assert.Equal(t, []run{
			{"sync", 0, took, "failure", 0, "", codes.Error, "boom"},
			{"sync", 1100 * time.Millisecond, took, "failure", 1, "", codes.Error, "boom"},
			{"sync", 3200 * time.Millisecond, took, "success", 2, "", codes.Unset, ""},
			{"sync", 13300 * time.Millisecond, took, "exit", 0, "all synced", codes.Unset, ""},
		}, tr.runs(t, start))
		for _, s := range tr.rec.Ended() {
			assert.Contains(t, s.Attributes(), ctlotel.GroupKey.String("store"))
			assert.Contains(t, s.Attributes(), ctlotel.NameKey.String("sync"))
			assert.Equal(t, ctlotel.ScopeName, s.InstrumentationScope().Name)
		}
		assert.Equal(t, 2, c.GetSuccessCount(), "the controller counts the same runs")
		assert.Equal(t, 2, c.GetFailureCount())
	})
}

// A run cancelled by a removal, an update or its RunTimeout, and one that
// panics: the outcome the span shows is the one the controller records,
// and so is a failure's error, a timed-out run's included (the span's
// status says "run timed out: …", not DoFunc's "context deadline
// exceeded").
func TestSpanOutcomesAgreeWithTheController(t *testing.T) {
	cases := []struct {
		name   string
		params controller.ControllerParams
		do     func(ctx context.Context) error
		act    func(m *controller.Manager)
		want   run
		// what the controller then shows
		failures, successes int
		lastErr             string
	}{
		{name: "removed while running",
			do:   func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() },
			act:  func(m *controller.Manager) { _ = m.RemoveController("c") },
			want: run{Outcome: "cancelled", Detail: "controller removed"}, successes: 1, lastErr: "controller context canceled"},
		{name: "cancelled by an update", params: controller.ControllerParams{CancelDoFuncOnUpdate: true},
			do: func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() },
			act: func(m *controller.Manager) {
				m.UpdateController("c", controller.ControllerParams{DoFunc: func(ctx context.Context) error { <-ctx.Done(); return nil }})
			},
			want: run{Outcome: "cancelled", Detail: "controller updated"}, successes: 1, lastErr: "controller context canceled"},
		{name: "timed out", params: controller.ControllerParams{RunTimeout: time.Second},
			do:   func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() },
			act:  func(*controller.Manager) { time.Sleep(time.Second) },
			want: run{Outcome: "timeout", Status: codes.Error, Error: "run timed out: DoFunc ran for its RunTimeout of 1s: context deadline exceeded"}, failures: 1,
			lastErr: "run timed out: DoFunc ran for its RunTimeout of 1s: context deadline exceeded"},
		{name: "timed out, returning nil", params: controller.ControllerParams{RunTimeout: time.Second},
			do:   func(ctx context.Context) error { <-ctx.Done(); return nil },
			act:  func(*controller.Manager) { time.Sleep(time.Second) },
			want: run{Outcome: "timeout", Status: codes.Error, Error: "run timed out: DoFunc ran for its RunTimeout of 1s"}, failures: 1,
			lastErr: "run timed out: DoFunc ran for its RunTimeout of 1s"},
		{name: "timed out, with an error whose Error method panics", params: controller.ControllerParams{RunTimeout: time.Second},
			do:   func(ctx context.Context) error { <-ctx.Done(); var e *brokenError; return e },
			act:  func(*controller.Manager) { time.Sleep(time.Second) },
			want: run{Outcome: "timeout", Status: codes.Error, Error: "run timed out: DoFunc ran for its RunTimeout of 1s: error of type *otel_test.brokenError: its Error method panicked: runtime error: invalid memory address or nil pointer dereference"}, failures: 1,
			lastErr: "run timed out: DoFunc ran for its RunTimeout of 1s: error of type *otel_test.brokenError: its Error method panicked: runtime error: invalid memory address or nil pointer dereference"},
		{name: "panicked",
			do:   func(context.Context) error { panic("kaboom") },
			want: run{Outcome: "failure", Status: codes.Error, Error: "panic: kaboom"}, failures: 1, lastErr: "panic: kaboom"},
		{name: "an error whose Error method panics",
			do:       func(context.Context) error { var e *brokenError; return e },
			want:     run{Outcome: "failure", Status: codes.Error, Error: "error of type *otel_test.brokenError: its Error method panicked: runtime error: invalid memory address or nil pointer dereference"},
			failures: 1, lastErr: "error of type *otel_test.brokenError: its Error method panicked: runtime error: invalid memory address or nil pointer dereference"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tr := newTracing(t)
				p := tc.params
				calls := 0
				p.DoFunc = func(ctx context.Context) error {
					if calls++; calls > 1 {
						return nil // the retry, or the update's run
					}
					return tc.do(ctx)
				}
				c := tr.m.UpdateController("c", p)
				synctest.Wait()
				if tc.act != nil {
					tc.act(tr.m)
				}
				synctest.Wait()
				assert.Equal(t, tc.failures, c.GetFailureCount())
				assert.Equal(t, tc.successes, c.GetSuccessCount())
				if assert.Error(t, c.GetLastError()) {
					assert.Equal(t, tc.lastErr, c.GetLastError().Error())
				}
				tr.m.RemoveAllAndWait()
				got := tr.runs(t, time.Now())[0]
				got.Name, got.At, got.Took = "", 0, 0
				assert.Equal(t, tc.want, got)
			})
		})
	}
}

// The span name is the controller's by default; WithSpanName names it
// instead, once per set of parameters, from what RunInfo holds, and an
// empty name leaves the controller's. Every span keeps controller.name.
func TestWithSpanName(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := tracetest.NewSpanRecorder()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
		defer func() { _ = tp.Shutdown(context.Background()) }()
		var mu sync.Mutex
		var named []string // guarded by mu: each controller wraps on its own goroutine
		m := controller.NewManager(controller.WithMetrics(nil), controller.WithRunMiddleware(
			ctlotel.Middleware(ctlotel.WithTracerProvider(tp), ctlotel.WithSpanName(func(info controller.RunInfo) string {
				mu.Lock()
				named = append(named, info.Name)
				mu.Unlock()
				if info.Group.Name == "" {
					return ""
				}
				return "controller " + info.Group.Name
			})),
			ctlotel.Middleware(ctlotel.WithTracerProvider(tp), ctlotel.WithSpanName(nil)),
		))
		for _, name := range []string{"endpoint-12-sync", "endpoint-13-sync"} {
			m.UpdateController(name, controller.ControllerParams{Group: controller.NewGroup("endpoint-sync"), DoFunc: controller.NoopFunc, RunInterval: time.Second})
		}
		m.UpdateController("gc", controller.ControllerParams{DoFunc: controller.NoopFunc})
		time.Sleep(time.Second + time.Millisecond)
		m.RemoveAllAndWait()

		got := map[string][]string{} // controller.name: its span names, outer (WithSpanName) then inner (nil) per run
		for _, s := range rec.Ended() {
			for _, a := range s.Attributes() {
				if a.Key == ctlotel.NameKey {
					got[a.Value.AsString()] = append(got[a.Value.AsString()], s.Name())
				}
			}
		}
		assert.Equal(t, map[string][]string{
			"endpoint-12-sync": {"endpoint-12-sync", "controller endpoint-sync", "endpoint-12-sync", "controller endpoint-sync"},
			"endpoint-13-sync": {"endpoint-13-sync", "controller endpoint-sync", "endpoint-13-sync", "controller endpoint-sync"},
			"gc":               {"gc", "gc"},
		}, got, "the inner span ends first")
		mu.Lock()
		defer mu.Unlock()
		assert.ElementsMatch(t, []string{"endpoint-12-sync", "endpoint-13-sync", "gc"}, named, "one call per set of parameters, not per run")
	})
}

// brokenError's Error method dereferences its nil receiver.
type brokenError struct{ msg string }

func (e *brokenError) Error() string { return e.msg }

// A params.Context that carries a span makes every run's span its child.
func TestRunSpansAreChildrenOfTheParamsContextSpan(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTracing(t)
		ctx, parent := tr.provider.Tracer("test").Start(context.Background(), "endpoint-12")
		tr.m.UpdateController("c", controller.ControllerParams{Context: ctx, DoFunc: controller.NoopFunc, RunInterval: time.Second})
		time.Sleep(2*time.Second + time.Millisecond)
		tr.m.RemoveAllAndWait()
		parent.End()
		spans := tr.rec.Ended()
		require.Len(t, spans, 4, "three runs and the parent")
		for _, s := range spans[:3] {
			assert.Equal(t, parent.SpanContext().SpanID(), s.Parent().SpanID())
			assert.Equal(t, parent.SpanContext().TraceID(), s.SpanContext().TraceID())
		}
	})
}

// Without WithTracerProvider, the global provider serves; a provider that
// samples nothing records nothing and the runs go on.
func TestProviders(t *testing.T) {
	t.Run("global", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			rec := tracetest.NewSpanRecorder()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
			saved := otelglobal.GetTracerProvider()
			otelglobal.SetTracerProvider(tp)
			defer otelglobal.SetTracerProvider(saved)
			m := controller.NewManager(controller.WithMetrics(nil), controller.WithRunMiddleware(ctlotel.Middleware()))
			m.UpdateController("c", controller.ControllerParams{DoFunc: controller.NoopFunc})
			synctest.Wait()
			m.RemoveAllAndWait()
			require.NoError(t, tp.Shutdown(context.Background()))
			require.Len(t, rec.Ended(), 1)
			assert.Equal(t, "c", rec.Ended()[0].Name())
		})
	})
	t.Run("never sampled", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			tr := newTracing(t, sdktrace.WithSampler(sdktrace.NeverSample()))
			c := tr.m.UpdateController("c", controller.ControllerParams{DoFunc: func(context.Context) error { return errBoom }})
			time.Sleep(3*time.Second + time.Millisecond)
			tr.m.RemoveAllAndWait()
			assert.Empty(t, tr.rec.Ended())
			assert.Equal(t, 3, c.GetFailureCount(), "runs at 0, 1s and 3s")
		})
	})
}

// The documented limit: a DoFunc that ignores its context and returns
// nil at the very instant its RunTimeout ends is a timeout in the
// controller's record (it lasted its RunTimeout), and in the span only
// when the context's timer cancelled the context before the middleware
// read it; a DoFunc that saw its context ended makes it one in both.
func TestSpanOutcomeOfARunEndingAtItsDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTracing(t)
		var sawEnd bool
		c := tr.m.UpdateController("c", controller.ControllerParams{
			RunTimeout: time.Second,
			DoFunc: func(ctx context.Context) error {
				time.Sleep(time.Second) // ignores ctx
				sawEnd = ctx.Err() != nil
				return nil
			},
		})
		time.Sleep(time.Second)
		synctest.Wait()
		tr.m.RemoveAllAndWait()
		require.ErrorIs(t, c.GetLastError(), controller.ErrRunTimeout, "the controller's record")
		got := tr.runs(t, time.Now())
		require.NotEmpty(t, got)
		if sawEnd {
			assert.Equal(t, "timeout", got[0].Outcome, "the span's outcome, the context ended")
		} else {
			assert.Contains(t, []string{"timeout", "success"}, got[0].Outcome, "the span's outcome, the context live at return")
		}
	})
}

// The run timed out at 1s, was removed at 1.5s, and returned an error at
// 2s: the first cause wins, so the span and the controller both call it a
// timeout.
func TestSpanOutcomeOfATimeoutThenRemoval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTracing(t)
		c := tr.m.UpdateController("c", controller.ControllerParams{
			RunTimeout: time.Second,
			DoFunc: func(ctx context.Context) error {
				time.Sleep(2 * time.Second) // ignores ctx
				return errors.New("late")
			},
		})
		time.Sleep(1500 * time.Millisecond)
		require.NoError(t, tr.m.RemoveControllerAndWait("c"))
		got := tr.runs(t, time.Now())
		require.Len(t, got, 1)
		assert.Equal(t, "timeout", got[0].Outcome, "the span's outcome")
		assert.ErrorIs(t, c.GetLastError(), controller.ErrRunTimeout, "the controller's record")
	})
}
