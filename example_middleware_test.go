// Runnable examples of run middleware, shown on pkg.go.dev.

package controller_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/bgctl/controller"
)

// A run middleware wraps every DoFunc of a Manager once per set of
// parameters. This one prints each run with the failures in a row before
// it, as a tracer would record them; the OpenTelemetry module
// github.com/bgctl/controller/otel is built the same way.
func ExampleWithRunMiddleware() {
	printRuns := func(info controller.RunInfo, do controller.ControllerFunc) controller.ControllerFunc {
		fmt.Println("wrapping", info.Name, "of group", info.Group.Name)
		return func(ctx context.Context) error {
			before := info.Controller.GetConsecutiveFailureCount()
			err := do(ctx)
			fmt.Printf("%s: failures in a row before the run: %d; it returned %v\n", info.Name, before, err)
			return err
		}
	}
	mgr := controller.NewManager(controller.WithRunMiddleware(printRuns))

	attempts := 0
	done := make(chan struct{})
	mgr.UpdateController("push-config", controller.ControllerParams{
		Group: controller.NewGroup("config"),
		DoFunc: func(ctx context.Context) error {
			if attempts++; attempts < 3 {
				return errors.New("store unavailable")
			}
			close(done)
			return nil
		},
		ErrorRetryBaseDuration: time.Millisecond,
	})
	<-done
	_ = mgr.RemoveControllerAndWait("push-config")
	// Output:
	// wrapping push-config of group config
	// push-config: failures in a row before the run: 0; it returned store unavailable
	// push-config: failures in a row before the run: 1; it returned store unavailable
	// push-config: failures in a row before the run: 2; it returned <nil>
}
