// A runnable example of the trigger debounce, shown on pkg.go.dev.

package controller_test

import (
	"context"
	"fmt"
	"time"

	"github.com/bgctl/controller"
)

// With a debounce, a trigger that comes right after a run is held until
// the window has passed, then runs: it is never dropped.
func ExampleWithTriggerDebounce() {
	const window = 50 * time.Millisecond
	mgr := controller.NewManager(controller.WithTriggerDebounce(window))
	ran := make(chan time.Time)
	mgr.UpdateController("regenerate", controller.ControllerParams{
		DoFunc: func(ctx context.Context) error {
			ran <- time.Now()
			return nil
		},
	})
	first := <-ran // the first run is never held
	mgr.TriggerController("regenerate")
	second := <-ran
	_ = mgr.RemoveControllerAndWait("regenerate")
	fmt.Println("the triggered run waited out the window:", second.Sub(first) >= window)
	// Output:
	// the triggered run waited out the window: true
}
