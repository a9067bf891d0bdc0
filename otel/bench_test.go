// The benchmark behind the figures of docs/operating.md and
// docs/performance.md for the cost of tracing a run.

package otel_test

import (
	"context"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bgctl/controller"
	ctlotel "github.com/bgctl/controller/otel"
	"github.com/sirupsen/logrus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// BenchmarkRun is the cost of one steady-state successful run of a
// controller that re-runs every nanosecond, as the core's
// BenchmarkRunSuccess measures it (metrics on, logrus at Info writing
// nowhere), without the middleware and with it over three providers:
// OpenTelemetry's no-op one, the SDK sampling nothing, and the SDK
// recording every span (to a processor that drops it, so that only the
// span's own cost counts).
//
//	go test -run XXX -bench . -benchmem -count 6
func BenchmarkRun(b *testing.B) {
	for _, bc := range []struct {
		name       string
		middleware controller.RunMiddleware
	}{
		{"bare", nil},
		{"noop-provider", ctlotel.Middleware(ctlotel.WithTracerProvider(noop.NewTracerProvider()))},
		{"sdk-not-sampled", ctlotel.Middleware(ctlotel.WithTracerProvider(
			sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample())))),
		},
		{"sdk-recorded", ctlotel.Middleware(ctlotel.WithTracerProvider(
			sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithSpanProcessor(dropSpans{})))),
		},
	} {
		b.Run(bc.name, func(b *testing.B) {
			logger := logrus.New()
			logger.SetOutput(io.Discard)
			logger.SetLevel(logrus.InfoLevel)
			m := controller.NewManager(controller.WithLogger(logger), controller.WithMetrics(controller.NewMetrics(controller.MetricsOpts{})),
				controller.WithRunMiddleware(bc.middleware))
			var left atomic.Int64
			left.Store(int64(b.N))
			done := make(chan struct{})
			b.ReportAllocs()
			b.ResetTimer()
			m.UpdateController("bench", controller.ControllerParams{
				DoFunc: func(context.Context) error {
					if left.Add(-1) == 0 {
						close(done)
					}
					return nil
				},
				RunInterval: time.Nanosecond,
				Group:       controller.NewGroup("bench"),
			})
			<-done
			b.StopTimer()
			m.RemoveAllAndWait()
		})
	}
}

// dropSpans is a span processor that drops every span it is given.
type dropSpans struct{}

func (dropSpans) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (dropSpans) OnEnd(sdktrace.ReadOnlySpan)                     {}
func (dropSpans) Shutdown(context.Context) error                  { return nil }
func (dropSpans) ForceFlush(context.Context) error                { return nil }
