// A runnable example of the causes a cancelled run context carries.

package controller_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/bgctl/controller"
)

// A DoFunc can tell why its context was cancelled: here it keeps a lease
// across an update, which cancels the running DoFunc for a fresh run, and
// releases it only on removal.
func Example_cancelCause() {
	var mgr controller.Manager
	running := make(chan struct{})
	watch := func(ctx context.Context) error {
		running <- struct{}{}
		<-ctx.Done()
		switch cause := context.Cause(ctx); {
		case errors.Is(cause, controller.ErrControllerUpdated):
			fmt.Println("updated: keep the lease for the next run")
		case errors.Is(cause, controller.ErrControllerRemoved):
			fmt.Println("removed: release the lease")
		default:
			fmt.Println("cancelled:", cause)
		}
		return ctx.Err()
	}
	params := controller.ControllerParams{DoFunc: watch, CancelDoFuncOnUpdate: true}
	mgr.UpdateController("lease", params)
	<-running
	mgr.UpdateController("lease", params) // cancels the running DoFunc, then runs it again
	<-running
	_ = mgr.RemoveControllerAndWait("lease")
	// Output:
	// updated: keep the lease for the next run
	// removed: release the lease
}
