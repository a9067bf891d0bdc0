// A runnable example of the tracing middleware, shown on pkg.go.dev.

package otel_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/bgctl/controller"
	"github.com/bgctl/controller/controllertest"
	ctlotel "github.com/bgctl/controller/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// A Manager whose runs are traced: each run is a span named after its
// controller. Here the spans go to the SDK's in-memory recorder; a program
// gives its own TracerProvider, or sets the global one.
func ExampleMiddleware() {
	recorder := tracetest.NewSpanRecorder()
	provider := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(recorder))
	defer provider.Shutdown(context.Background())

	mgr := controller.NewManager(controller.WithRunMiddleware(
		ctlotel.Middleware(ctlotel.WithTracerProvider(provider))))
	attempts := 0
	runs := &controllertest.Runs{} // told after each run, once its span has ended
	mgr.UpdateController("push-config", controller.ControllerParams{
		Group: controller.NewGroup("config"),
		DoFunc: func(ctx context.Context) error {
			if attempts++; attempts < 3 {
				return errors.New("store unavailable")
			}
			return controller.NewExitReason("config pushed")
		},
		ErrorRetryBaseDuration: time.Millisecond,
		Health:                 runs,
	})
	_ = runs.Wait(context.Background(), "push-config", 3)
	_ = mgr.RemoveControllerAndWait("push-config")

	for _, span := range recorder.Ended() {
		fmt.Print(span.Name())
		for _, a := range span.Attributes() {
			switch a.Key {
			case ctlotel.GroupKey, ctlotel.ConsecutiveFailuresKey, ctlotel.OutcomeKey, ctlotel.ExitReasonKey:
				fmt.Printf(" %s=%s", a.Key, a.Value.Emit())
			}
		}
		if st := span.Status(); st.Description != "" {
			fmt.Printf(" status=%s(%s)", st.Code, st.Description)
		}
		fmt.Println()
	}
	// Output:
	// push-config controller.group=config controller.consecutive_failures=0 controller.outcome=failure status=Error(store unavailable)
	// push-config controller.group=config controller.consecutive_failures=1 controller.outcome=failure status=Error(store unavailable)
	// push-config controller.group=config controller.consecutive_failures=2 controller.outcome=exit controller.exit_reason=config pushed
}

// Controllers named per resource, one per endpoint, would make one span
// name per endpoint; named after their group instead, their spans share
// one name, and controller.name still says which controller ran.
func ExampleWithSpanName() {
	recorder := tracetest.NewSpanRecorder()
	provider := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(recorder))
	defer provider.Shutdown(context.Background())

	mgr := controller.NewManager(controller.WithRunMiddleware(ctlotel.Middleware(
		ctlotel.WithTracerProvider(provider),
		ctlotel.WithSpanName(func(info controller.RunInfo) string {
			return "controller " + info.Group.Name
		}))))
	for _, name := range []string{"endpoint-12-sync", "endpoint-13-sync"} {
		mgr.UpdateController(name, controller.ControllerParams{
			Group:  controller.NewGroup("endpoint-sync"),
			DoFunc: controller.NoopFunc,
		})
		_ = mgr.RemoveControllerAndWait(name) // its one run has ended
	}

	for _, span := range recorder.Ended() {
		for _, a := range span.Attributes() {
			if a.Key == ctlotel.NameKey {
				fmt.Printf("%s: %s=%s\n", span.Name(), a.Key, a.Value.Emit())
			}
		}
	}
	// Output:
	// controller endpoint-sync: controller.name=endpoint-12-sync
	// controller endpoint-sync: controller.name=endpoint-13-sync
}
