// Runnable examples of the common paths, shown on pkg.go.dev.

package controller_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/bgctl/controller"
)

// healthSignal is a HealthReporter that passes on the outcome of every run:
// nil for a success, else the error. The controller calls it after it has
// recorded the outcome, so whoever receives from it sees the statistics of
// that run.
type healthSignal chan error

// OK passes on a success.
func (h healthSignal) OK(string) { h <- nil }

// Degraded passes on a failure.
func (h healthSignal) Degraded(_ string, err error) { h <- err }

// A controller calls its DoFunc until it succeeds. Here the store refuses
// the first two writes; the retries come after 1ms and 2ms.
func ExampleManager_UpdateController() {
	var mgr controller.Manager // the zero Manager is ready to use
	attempts := 0              // only the DoFunc touches it: runs never overlap
	done := make(chan struct{})
	c := mgr.UpdateController("push-config", controller.ControllerParams{
		DoFunc: func(ctx context.Context) error {
			attempts++
			if attempts < 3 {
				fmt.Println("attempt", attempts, "failed")
				return errors.New("store unavailable")
			}
			fmt.Println("attempt", attempts, "succeeded")
			close(done)
			return nil
		},
		ErrorRetryBaseDuration: time.Millisecond,
	})

	<-done
	_ = mgr.RemoveControllerAndWait("push-config")
	fmt.Println("successes:", c.GetSuccessCount(), "failures:", c.GetFailureCount())
	// Output:
	// attempt 1 failed
	// attempt 2 failed
	// attempt 3 succeeded
	// successes: 1 failures: 2
}

// With a RunInterval the controller runs again after every success, until
// it is removed. Removal cancels the context of the running DoFunc.
func ExampleControllerParams_runInterval() {
	var mgr controller.Manager
	runs := make(chan int)
	n := 0
	mgr.UpdateController("garbage-collect", controller.ControllerParams{
		RunInterval: time.Millisecond,
		DoFunc: func(ctx context.Context) error {
			n++
			select {
			case runs <- n:
			case <-ctx.Done(): // removed: nobody is listening any more
			}
			return nil
		},
	})

	for range 3 {
		fmt.Println("run", <-runs)
	}
	_ = mgr.RemoveControllerAndWait("garbage-collect")
	// Output:
	// run 1
	// run 2
	// run 3
}

// Without a RunInterval a controller runs until it succeeds and then waits;
// TriggerController makes it run again at once.
func ExampleManager_TriggerController() {
	var mgr controller.Manager
	runs := make(chan int)
	n := 0
	mgr.UpdateController("resync", controller.ControllerParams{
		DoFunc: func(ctx context.Context) error {
			n++
			select {
			case runs <- n:
			case <-ctx.Done():
			}
			return nil
		},
	})

	fmt.Println("run", <-runs)
	fmt.Println("triggered:", mgr.TriggerController("resync"))
	fmt.Println("run", <-runs)
	fmt.Println("triggered:", mgr.TriggerController("no-such-controller"))
	_ = mgr.RemoveControllerAndWait("resync")
	// Output:
	// run 1
	// triggered: true
	// run 2
	// triggered: false
}

// Calling UpdateController again with the same name updates the controller:
// the new DoFunc runs at once, and the controller keeps its identity and
// its statistics.
func ExampleManager_UpdateController_update() {
	var mgr controller.Manager
	said := make(chan string)
	greeter := func(greeting string) controller.ControllerParams {
		return controller.ControllerParams{
			DoFunc: func(ctx context.Context) error {
				select {
				case said <- greeting:
				case <-ctx.Done():
				}
				return nil
			},
		}
	}

	first := mgr.UpdateController("greeter", greeter("hello"))
	fmt.Println(<-said)
	second := mgr.UpdateController("greeter", greeter("bonjour"))
	fmt.Println(<-said)
	_ = mgr.RemoveControllerAndWait("greeter")

	fmt.Println("same controller:", first == second && first.UUID() == second.UUID())
	fmt.Println("successes:", second.GetSuccessCount())
	// Output:
	// hello
	// bonjour
	// same controller: true
	// successes: 2
}

// A DoFunc returns an ExitReason (wrapped or not) to say it is done: the
// run counts as a success, the reason stays visible as the last error, and
// the controller runs again only on an update or trigger, even with a
// RunInterval.
func ExampleExitReason() {
	var mgr controller.Manager
	outcomes := make(healthSignal, 1)
	runs := 0
	c := mgr.UpdateController("annotate-endpoint", controller.ControllerParams{
		RunInterval: time.Millisecond,
		DoFunc: func(ctx context.Context) error {
			runs++
			return fmt.Errorf("endpoint 7: %w", controller.NewExitReason("annotation applied"))
		},
		Health: outcomes,
	})

	fmt.Println("outcome:", <-outcomes)
	_ = mgr.RemoveControllerAndWait("annotate-endpoint")

	var exit controller.ExitReason
	fmt.Println("runs:", runs)
	fmt.Println("successes:", c.GetSuccessCount(), "failures:", c.GetFailureCount())
	fmt.Println("last error:", c.GetLastError(), "/ an ExitReason:", errors.As(c.GetLastError(), &exit))
	// Output:
	// outcome: <nil>
	// runs: 1
	// successes: 1 failures: 0
	// last error: endpoint 7: annotation applied / an ExitReason: true
}

// StopFunc runs once, after the last DoFunc returned, when the controller is
// removed; RemoveControllerAndWait returns after it.
func ExampleControllerParams_stopFunc() {
	var mgr controller.Manager
	started := make(chan struct{})
	mgr.UpdateController("hold-lease", controller.ControllerParams{
		DoFunc: func(ctx context.Context) error {
			fmt.Println("lease acquired")
			close(started)
			return nil
		},
		StopFunc: func(ctx context.Context) error {
			fmt.Println("lease released")
			return nil
		},
	})

	<-started
	_ = mgr.RemoveControllerAndWait("hold-lease")
	fmt.Println("removed")
	// Output:
	// lease acquired
	// lease released
	// removed
}

// FormatStatus prints a table of statuses, all of them or only the failing
// ones. The statuses usually come from GetStatusModel or GetGlobalStatus;
// these are written out without timestamps, so the times read "never".
func ExampleFormatStatus() {
	statuses := controller.ControllerStatuses{
		{Name: "sync-to-store", Status: &controller.ControllerStatusStatus{
			FailureCount: 3, ConsecutiveFailureCount: 3, LastFailureMsg: "store unavailable",
		}},
		{Name: "annotate", Status: &controller.ControllerStatusStatus{
			SuccessCount: 1, LastFailureMsg: "annotation applied",
		}},
		{Name: "regenerate", Status: &controller.ControllerStatusStatus{SuccessCount: 12}},
	}

	_ = controller.FormatStatus(os.Stdout, statuses, true)
	fmt.Println()
	_ = controller.FormatStatus(os.Stdout, statuses, false)
	// Output:
	// Controller Status: 2/3 healthy
	// Name            Last success   Last error   Count   Message
	// annotate        never          never        0       [exit reason] annotation applied
	// regenerate      never          never        0       no error
	// sync-to-store   never          never        3       store unavailable
	//
	// Controller Status: 2/3 healthy
	// Name            Last success   Last error   Count   Message
	// sync-to-store   never          never        3       store unavailable
}

// Health names every failing controller, or returns nil. Here the
// controller fails once (NoErrorRetry: no retry), then succeeds when
// triggered.
func ExampleManager_Health() {
	var mgr controller.Manager
	var storeDown atomic.Bool
	storeDown.Store(true)
	outcomes := make(healthSignal, 1)
	mgr.UpdateController("sync-to-k8s", controller.ControllerParams{
		DoFunc: func(ctx context.Context) error {
			if storeDown.Load() {
				return errors.New("connection refused")
			}
			return nil
		},
		NoErrorRetry: true,
		Health:       outcomes,
	})

	<-outcomes
	fmt.Println(mgr.Health())
	storeDown.Store(false)
	mgr.TriggerController("sync-to-k8s")
	<-outcomes
	fmt.Println(mgr.Health())
	_ = mgr.RemoveControllerAndWait("sync-to-k8s")
	// Output:
	// controller "sync-to-k8s": 1 consecutive failure: connection refused
	// <nil>
}

// FakeManager gives tests of code that reads statuses a Manager with
// failing controllers that run nothing.
func ExampleFakeManager() {
	mgr := controller.FakeManager(2)
	fmt.Println(mgr.Health())
	for _, s := range mgr.GetStatusModel() {
		fmt.Println(s.Name, s.Status.ConsecutiveFailureCount, s.Status.LastFailureMsg)
	}
	mgr.RemoveAllAndWait()
	// Output:
	// controller "controller-0": 1 consecutive failure: controller failed
	// controller "controller-1": 1 consecutive failure: controller failed
	// controller-0 1 controller failed
	// controller-1 1 controller failed
}
