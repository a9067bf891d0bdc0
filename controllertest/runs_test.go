package controllertest_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/bgctl/controller"
	"github.com/bgctl/controller/controllertest"
	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// quietManager returns a Manager that logs nowhere and records no metrics.
func quietManager() *controller.Manager {
	logger, _ := test.NewNullLogger()
	logger.SetLevel(logrus.PanicLevel)
	return controller.NewManager(controller.WithLogger(logger), controller.WithMetrics(nil))
}

// Wait returns once the controller has reported n times, at the exact
// times of its retries, and Count and Failures say what it reported.
func TestRunsWaitsForTheNthRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := quietManager()
		runs := &controllertest.Runs{}
		calls := 0
		m.UpdateController("flaky", controller.ControllerParams{
			DoFunc: func(context.Context) error {
				calls++
				if calls < 3 {
					return fmt.Errorf("attempt %d failed", calls)
				}
				return nil
			},
			Health: runs,
		})
		start := time.Now()
		require.NoError(t, runs.Wait(t.Context(), "flaky", 3))
		assert.Equal(t, 3*time.Second, time.Since(start), "runs at 0s, 1s and 3s")
		assert.Equal(t, 3, runs.Count("flaky"))
		n, last := runs.Failures("flaky")
		assert.Equal(t, 2, n)
		assert.NoError(t, last, "the last report was a success")
		assert.Zero(t, runs.Count("other"))
		m.RemoveAllAndWait()
	})
}

// Wait gives up when its context ends, with the context's error.
func TestRunsWaitEndsWithItsContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		runs := &controllertest.Runs{}
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		err := runs.Wait(ctx, "never", 1)
		assert.ErrorIs(t, err, context.DeadlineExceeded)
	})
}

// Runs never blocks the controller: a controller that runs far more often
// than anyone waits goes on at its interval, and Next is told every
// report after it is counted.
func TestRunsNeverStallsTheController(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := quietManager()
		next := &recordingReporter{}
		runs := &controllertest.Runs{Next: next}
		errBad := errors.New("bad")
		calls := 0
		m.UpdateController("ticker", controller.ControllerParams{
			DoFunc: func(context.Context) error {
				calls++
				if calls%2 == 0 {
					return errBad
				}
				return nil
			},
			RunInterval:            time.Millisecond,
			ErrorRetryBaseDuration: time.Millisecond,
			Health:                 runs,
		})
		time.Sleep(time.Second)
		synctest.Wait()
		assert.Greater(t, runs.Count("ticker"), 600, "nobody waited, and the controller kept running")
		assert.Equal(t, runs.Count("ticker"), next.ok+next.degraded)
		n, _ := runs.Failures("ticker")
		assert.Equal(t, next.degraded, n)
		m.RemoveAllAndWait()
	})
}

type recordingReporter struct{ ok, degraded int }

func (r *recordingReporter) OK(string)              { r.ok++ }
func (r *recordingReporter) Degraded(string, error) { r.degraded++ }

// A test of a controller that retries: wait for its third run, then check
// when it happened and what the status says.
func ExampleRuns() {
	synctest.Test(&testing.T{}, func(t *testing.T) {
		m := controller.NewManager(controller.WithMetrics(nil))
		runs := &controllertest.Runs{}
		attempts := 0
		m.UpdateController("push", controller.ControllerParams{
			DoFunc: func(context.Context) error {
				attempts++
				if attempts < 3 {
					return errors.New("store unavailable")
				}
				return nil
			},
			Health: runs,
		})
		start := time.Now()
		_ = runs.Wait(context.Background(), "push", 3)
		failures, _ := runs.Failures("push")
		fmt.Println("third run after", time.Since(start), "with", failures, "failures before it")
		m.RemoveAllAndWait()
	})
	// Output: third run after 3s with 2 failures before it
}
