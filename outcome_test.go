// Tests of how a run's outcome is classified and recorded: success,
// ExitReason, failure, panic, cancellation, and errors that misbehave.

package controller

import (
	"context"
	"errors"
	"fmt"
	"os"
	"reflect"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Rule 3: a success updates the counters and clears the last error.
func TestSuccessResetsFailures(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		r := newRecorder(errBoom, errBoom, nil)
		e.m.UpdateController("c", ControllerParams{DoFunc: r.do})
		time.Sleep(time.Second + time.Millisecond)
		c := e.m.Lookup("c")
		assert.Equal(t, 2, c.GetConsecutiveFailureCount())
		assert.Equal(t, errBoom, c.GetLastError())
		assert.Equal(t, time.Now().Add(-time.Millisecond), c.GetLastErrorTimestamp())
		assert.True(t, c.GetLastSuccessTimestamp().IsZero())
		time.Sleep(2 * time.Second)
		assert.Equal(t, secs(0, 1, 3), r.times())
		assert.Equal(t, 1, c.GetSuccessCount())
		assert.Equal(t, 2, c.GetFailureCount())
		assert.Equal(t, 0, c.GetConsecutiveFailureCount())
		assert.NoError(t, c.GetLastError())
		assert.Equal(t, r.start.Add(3*time.Second), c.GetLastSuccessTimestamp())
		assert.Equal(t, r.start.Add(time.Second), c.GetLastErrorTimestamp(), "the time of the last failure is kept")
		e.m.RemoveAllAndWait()
		assert.Equal(t, []string{"controller failed; retrying"}, e.logs(logrus.WarnLevel))
		assert.Equal(t, []string{"recovered after 2 consecutive failures"}, e.logs(logrus.InfoLevel))
	})
}

// Rule 3: a wrapped ExitReason counts as a success, stays visible as the
// last error, and the controller waits for an update or trigger, even with
// a RunInterval.
func TestExitReasonStopsRunning(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		r := newRecorder(errBoom, fmt.Errorf("annotate: %w", NewExitReason("done")))
		e.m.UpdateController("c", ControllerParams{DoFunc: r.do, RunInterval: time.Second})
		time.Sleep(time.Hour)
		c := e.m.Lookup("c")
		assert.Equal(t, secs(0, 1), r.times())
		assert.Equal(t, 1, c.GetSuccessCount())
		assert.Equal(t, 1, c.GetFailureCount())
		assert.Equal(t, 0, c.GetConsecutiveFailureCount())
		assert.EqualError(t, c.GetLastError(), "annotate: done")
		assert.Equal(t, "annotate: done", c.GetStatusModel().Status.LastFailureMsg)
		assert.Equal(t, 0.0, testutil.ToFloat64(e.metrics.failing))
		assert.Equal(t, 2.0, e.metrics.runsTotal(runSuccess)+e.metrics.runsTotal(runFailure))
		assert.Equal(t, 1.0, e.metrics.runsTotal(runSuccess), "an exit counts as success")

		e.m.TriggerController("c")
		synctest.Wait()
		assert.Equal(t, secs(0, 1, 3600), r.times(), "a trigger runs it again")
		e.m.RemoveAllAndWait()
	})
}

// Rule 3: an error returned after the run context was cancelled is recorded
// as an ExitReason, never as a failure.
func TestErrorAfterCancellationIsNotAFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		h := &healthLog{}
		e.m.UpdateController("c", ControllerParams{
			Health: h,
			DoFunc: func(ctx context.Context) error {
				<-ctx.Done()
				return errors.New("interrupted")
			},
		})
		synctest.Wait()
		c := e.m.Lookup("c")
		require.NoError(t, e.m.RemoveControllerAndWait("c"))
		assert.Equal(t, 0, c.GetFailureCount())
		assert.Equal(t, 1, c.GetSuccessCount())
		assert.EqualError(t, c.GetLastError(), "controller context canceled")
		assert.True(t, errors.As(c.GetLastError(), &ExitReason{}))
		assert.Equal(t, []string{"ok c"}, h.all())
		assert.Empty(t, e.logs(logrus.WarnLevel))
	})
}

// Rule 3: a panic is recovered and is a failure reading "panic: <value>";
// its stack goes to the log at Error, and it is counted.
func TestPanicInDoFuncIsAFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		e.m.UpdateController("c", ControllerParams{Group: NewGroup("g"), DoFunc: func(ctx context.Context) error {
			panic("kaboom")
		}})
		time.Sleep(3*time.Second + time.Millisecond) // runs at 0, 1, 3
		c := e.m.Lookup("c")
		assert.Equal(t, 3, c.GetFailureCount())
		assert.EqualError(t, c.GetLastError(), "panic: kaboom")
		assert.Equal(t, 3.0, testutil.ToFloat64(e.metrics.panics.WithLabelValues("g")))
		errs := e.hook.AllEntries()
		var panics []*logrus.Entry
		for _, en := range errs {
			if en.Level == logrus.ErrorLevel {
				panics = append(panics, en)
			}
		}
		require.Len(t, panics, 1, "one Error for the streak, not one per run")
		assert.Equal(t, "DoFunc panicked", panics[0].Message)
		assert.Contains(t, panics[0].Data["stack"], "outcome_test.go")
		e.m.RemoveAllAndWait()
	})
}

// Rule 7: a StopFunc error is a failure, logged at Warn; a StopFunc panic
// likewise, logged at Error with its stack and counted.
func TestStopFuncFailures(t *testing.T) {
	for _, tc := range []struct {
		name    string
		stop    ControllerFunc
		level   logrus.Level
		msg     string
		panics  float64
		lastErr string
	}{
		{"error", func(context.Context) error { return errors.New("release failed") }, logrus.WarnLevel, "StopFunc failed", 0, "release failed"},
		{"panic", func(context.Context) error { panic("stop kaboom") }, logrus.ErrorLevel, "StopFunc panicked", 1, "panic: stop kaboom"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newEnv(t)
				h := &healthLog{}
				c := e.m.UpdateController("c", ControllerParams{DoFunc: NoopFunc, StopFunc: tc.stop, Health: h})
				synctest.Wait()
				require.NoError(t, e.m.RemoveControllerAndWait("c"))
				assert.Equal(t, 1, c.GetFailureCount())
				assert.EqualError(t, c.GetLastError(), tc.lastErr)
				assert.Equal(t, []string{tc.msg}, e.logs(tc.level))
				assert.Equal(t, 1.0, e.metrics.runsTotal(runFailure), "a StopFunc failure counts as a failed run")
				assert.Equal(t, tc.panics, testutil.ToFloat64(e.metrics.panics.WithLabelValues("")))
				assert.Equal(t, 0.0, testutil.ToFloat64(e.metrics.failing), "a removed controller is not failing")
				assert.Equal(t, []string{"ok c", "degraded c: " + tc.lastErr}, h.all())
				if tc.panics > 0 {
					assert.Contains(t, e.hook.LastEntry().Data["stack"], "outcome_test.go")
				}
			})
		})
	}
}

// A StopFunc failure counts under the newest group, even when no run
// happened since the group changed (rule 8).
func TestStopFuncFailureCountsInNewestGroup(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		b := newBlocker()
		stop := func(context.Context) error { return errBoom }
		e.m.UpdateController("c", ControllerParams{DoFunc: b.fn(0), StopFunc: stop, Group: NewGroup("old")})
		synctest.Wait()
		e.m.UpdateController("c", ControllerParams{DoFunc: b.fn(1), StopFunc: stop, Group: NewGroup("new")})
		require.NoError(t, e.m.RemoveController("c")) // removal wins: no run with the new group
		close(b.release)
		e.m.RemoveAllAndWait()
		assert.Equal(t, []int{0}, b.params)
		assert.Equal(t, 1.0, testutil.ToFloat64(e.metrics.groupRuns.WithLabelValues("new", failure)))
		assert.Equal(t, 0.0, testutil.ToFloat64(e.metrics.groupRuns.WithLabelValues("old", failure)))
	})
}

// Invalid parameters that arrive while DoFunc runs stay visible after the
// run, whatever its outcome, and the HealthReporter ends on Degraded.
func TestInvalidUpdateDuringARunStaysVisible(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		h := &healthLog{}
		b := newBlocker()
		e.m.UpdateController("c", ControllerParams{DoFunc: b.fn(0), Health: h})
		synctest.Wait()
		e.m.UpdateController("c", ControllerParams{DoFunc: b.fn(1), Health: h, RunInterval: -time.Second})
		b.release <- struct{}{} // the running DoFunc succeeds
		time.Sleep(time.Hour)
		c := e.m.Lookup("c")
		assert.Equal(t, 1, c.GetSuccessCount())
		assert.Equal(t, 1, c.GetConsecutiveFailureCount())
		assert.ErrorIs(t, c.GetLastError(), ErrInvalidParams)
		assert.ErrorIs(t, e.m.Health(), ErrInvalidParams)
		assert.Equal(t, 1.0, testutil.ToFloat64(e.metrics.failing))
		events := h.all()
		assert.Equal(t, "degraded c: invalid controller parameters: RunInterval must not be negative, got -1s", events[len(events)-1])
		assert.Equal(t, []int{0}, b.params, "no run with the invalid parameters")
		close(b.release)
		e.m.RemoveAllAndWait()
	})
}

// mutableErr is a preallocated error whose text the DoFunc changes before
// returning the same pointer again.
type mutableErr struct{ msg string }

func (e *mutableErr) Error() string { return e.msg }

// A DoFunc that returns the same error value with a new message each time:
// the status, Health and the "new error message" Warn follow the message.
func TestReusedErrorWithNewMessage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		reused := &mutableErr{}
		attempt := 0
		e.m.UpdateController("reused", ControllerParams{DoFunc: func(context.Context) error {
			attempt++
			if attempt <= 2 {
				reused.msg = "dial: connection refused"
			} else {
				reused.msg = fmt.Sprintf("attempt %d: timeout", attempt)
			}
			return reused
		}})
		time.Sleep(6 * time.Second) // runs at 0, 1, 3 and 6 s
		synctest.Wait()
		st := e.m.Lookup("reused").GetStatusModel().Status
		assert.Equal(t, int64(4), st.FailureCount)
		assert.Equal(t, "attempt 4: timeout", st.LastFailureMsg)
		assert.EqualError(t, e.m.Health(), `controller "reused": 4 consecutive failures: attempt 4: timeout`)
		assert.Equal(t, []string{
			"controller failed; retrying",
			"controller still failing with a new error",
			"controller still failing with a new error",
		}, e.logs(logrus.WarnLevel), "the first run's message, then each new one; the repeated one is not logged again")
		e.m.RemoveAllAndWait()
	})
}

// panickyErr is an error whose Error method dereferences its receiver: a
// typed nil of it, returned as an error, panics when asked its message.
type panickyErr struct{ msg string }

func (e *panickyErr) Error() string { return e.msg }

// unwrapPanics is an error whose chain cannot be walked.
type unwrapPanics struct{}

func (unwrapPanics) Error() string { return "unwrap panics" }
func (unwrapPanics) Unwrap() error { panic("Unwrap exploded") }

// An error whose Error method panics (a typed nil returned as an error) is
// recorded as a failure whose message says so and names the error's type;
// it is counted, logged once, told to the HealthReporter, and the loop
// retries on schedule. The same holds for a StopFunc, and for an error
// whose Unwrap panics. Runs in a child process: on failure the process dies.
func TestErrorWhoseMethodsPanic(t *testing.T) {
	if os.Getenv("BGCTL_HOSTILE_CHILD") != "1" {
		runInChild(t, t.Name())
		return
	}
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		health := &healthLog{}
		var runs []time.Duration
		start := time.Now()
		e.m.UpdateController("typed-nil", ControllerParams{
			DoFunc: func(context.Context) error {
				runs = append(runs, time.Since(start))
				var p *panickyErr
				return p
			},
			StopFunc: func(context.Context) error {
				var p *panickyErr
				return p
			},
			Health: health,
		})
		e.m.UpdateController("bad-chain", ControllerParams{
			DoFunc: func(context.Context) error { return unwrapPanics{} },
		})
		time.Sleep(3 * time.Second)
		synctest.Wait()
		assert.Equal(t, secs(0, 1, 3), runs, "the loop goes on retrying on schedule")

		want := "error of type *controller.panickyErr: its Error method panicked: runtime error: invalid memory address or nil pointer dereference"
		st := e.m.Lookup("typed-nil").GetStatusModel().Status
		assert.Equal(t, int64(3), st.FailureCount)
		assert.Equal(t, int64(3), st.ConsecutiveFailureCount)
		assert.Equal(t, want, st.LastFailureMsg)
		assert.EqualError(t, e.m.Lookup("typed-nil").GetLastError(), want)
		assert.Equal(t, []string{"degraded typed-nil: " + want, "degraded typed-nil: " + want, "degraded typed-nil: " + want}, health.all())

		chain := e.m.Lookup("bad-chain").GetStatusModel().Status
		assert.Equal(t, int64(3), chain.FailureCount)
		assert.Equal(t, "error of type controller.unwrapPanics: its Unwrap or As method panicked: Unwrap exploded", chain.LastFailureMsg)

		var warns []string
		for _, en := range e.hook.AllEntries() {
			if en.Level == logrus.WarnLevel {
				warns = append(warns, en.Data["name"].(string)+": "+fmt.Sprint(en.Data[logrus.ErrorKey]))
			}
		}
		assert.ElementsMatch(t, []string{"typed-nil: " + want, "bad-chain: " + chain.LastFailureMsg}, warns, "one Warn per streak, not per run")
		require.Error(t, e.m.Health())
		assert.Contains(t, e.m.Health().Error(), want)

		require.NoError(t, e.m.RemoveControllerAndWait("typed-nil"))
		require.Len(t, health.all(), 4)
		assert.Equal(t, "degraded typed-nil: "+want, health.all()[3], "the StopFunc's unreadable error is told too")
		e.m.RemoveAllAndWait()
	})
}

// TestRunEventFitsInRegisters guards what keeps report's arguments in
// registers: runEvent has at most four fields, each a single word.
func TestRunEventFitsInRegisters(t *testing.T) {
	typ := reflect.TypeFor[runEvent]()
	if n := typ.NumField(); n > 4 {
		t.Errorf("runEvent has %d fields, more than 4: report would get it through memory (see runEvent)", n)
	}
	for f := range typ.Fields() {
		switch f.Type.Kind() {
		case reflect.Bool, reflect.Int, reflect.Int64, reflect.Uint8, reflect.Uint32:
		default:
			t.Errorf("runEvent.%s is a %s, not a one-word scalar: it takes more than one register", f.Name, f.Type)
		}
	}
}

// Rule 3, the first cause wins: a DoFunc that ignores its context,
// removed at 100ms, returning nil at 2s with a RunTimeout of 1s, was
// cancelled before its RunTimeout passed, so it is no timeout, no failure
// and not counted in run_timeouts.
func TestRemovalBeforeTimeoutIsNotATimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		c := e.m.UpdateController("c", ControllerParams{
			RunTimeout: time.Second,
			DoFunc: func(ctx context.Context) error {
				time.Sleep(2 * time.Second) // ignores ctx
				return nil
			},
		})
		time.Sleep(100 * time.Millisecond)
		require.NoError(t, e.m.RemoveControllerAndWait("c"))
		assert.Equal(t, 0, c.GetFailureCount(), "last error: %v", c.GetLastError())
		assert.False(t, errors.Is(c.GetLastError(), ErrRunTimeout), "last error: %v", c.GetLastError())
		assert.Equal(t, 0.0, testutil.ToFloat64(e.metrics.timeouts), "controllers_run_timeouts_total")
	})
}

// The converse: the run timed out at 1s (its context's cause is
// ErrRunTimeout), then was removed at 1.5s, then returned an error at 2s.
// The timeout came first, so by rule 3 it is a timed-out failure, not a
// cancelled run.
func TestTimeoutBeforeRemovalIsATimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		var cause error
		c := e.m.UpdateController("c", ControllerParams{
			RunTimeout: time.Second,
			DoFunc: func(ctx context.Context) error {
				time.Sleep(2 * time.Second) // ignores ctx
				cause = context.Cause(ctx)
				return errBoom
			},
		})
		time.Sleep(1500 * time.Millisecond)
		require.NoError(t, e.m.RemoveControllerAndWait("c"))
		require.ErrorIs(t, cause, ErrRunTimeout, "the run context's first cause")
		assert.ErrorIs(t, c.GetLastError(), ErrRunTimeout, "recorded")
	})
}
