// review_test.go: a hostile review's tests of the span per run: the
// outcome a span shows against the one the controller records.

package otel_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/bgctl/controller"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A DoFunc that ignores its context and returns nil exactly when its
// RunTimeout ends: the controller records a timed-out failure (it lasted
// its RunTimeout), but the span says "success" whenever the DoFunc's
// goroutine returns before the context's timer goroutine has cancelled
// the context: the middleware asks ctx.Err(), the controller the clock.
func TestReviewSpanOutcomeOfARunEndingAtItsDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTracing(t)
		c := tr.m.UpdateController("c", controller.ControllerParams{
			RunTimeout: time.Second,
			DoFunc: func(ctx context.Context) error {
				time.Sleep(time.Second) // ignores ctx
				return nil
			},
		})
		time.Sleep(time.Second)
		synctest.Wait()
		tr.m.RemoveAllAndWait()
		require.ErrorIs(t, c.GetLastError(), controller.ErrRunTimeout, "the controller's record")
		got := tr.runs(t, time.Now())
		require.NotEmpty(t, got)
		assert.Equal(t, "timeout", got[0].Outcome, "the span's outcome")
	})
}

// The run timed out at 1s, was removed at 1.5s, and returned an error at
// 2s: the span says "timeout" (its context's cause is ErrRunTimeout), the
// controller records a cancelled run ("controller context canceled").
func TestReviewSpanOutcomeOfATimeoutThenRemoval(t *testing.T) {
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
		spanTimeout := got[0].Outcome == "timeout"
		ctlTimeout := errors.Is(c.GetLastError(), controller.ErrRunTimeout)
		assert.Equal(t, spanTimeout, ctlTimeout, "span outcome %q, controller's last error %v", got[0].Outcome, c.GetLastError())
	})
}
