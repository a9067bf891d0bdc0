package controller

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"os"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Fault injection: callbacks and inputs that misbehave, one test each. The
// happy paths of the same features are in controller_test.go and
// manager_test.go; each test here names the one it builds on.

// A DoFunc that never returns and ignores its context holds up nothing but
// itself: RemoveController returns at once, the other controllers of the
// Manager go on running and can be updated, triggered and removed, status
// and Health answer, and Shutdown returns at its deadline naming it and only
// it. (TestRemoveDoesNotWaitForAStuckDoFunc and TestShutdownDeadline cover
// the removal and the deadline on their own.)
func TestFaultDoFuncIgnoresItsContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		never := make(chan struct{}) // closed only to let the bubble end
		var cancelled bool
		e.m.UpdateController("stuck", ControllerParams{DoFunc: func(ctx context.Context) error {
			<-never
			cancelled = ctx.Err() != nil
			return nil
		}})
		ticker := newRecorder()
		e.m.UpdateController("ticker", ControllerParams{DoFunc: ticker.do, RunInterval: time.Second})
		synctest.Wait()

		start := time.Now()
		require.NoError(t, e.m.RemoveController("stuck"))
		assert.Zero(t, time.Since(start), "RemoveController returns at once")

		time.Sleep(10*time.Second + time.Millisecond)
		assert.Len(t, ticker.times(), 11, "the other controller keeps its interval")
		assert.True(t, e.m.TriggerController("ticker"))
		synctest.Wait()
		e.m.UpdateController("ticker", ControllerParams{DoFunc: ticker.do, RunInterval: time.Second, Group: NewGroup("g")})
		synctest.Wait()
		assert.Len(t, ticker.times(), 13, "a trigger and an update each run it at once")
		assert.Len(t, e.m.GetStatusModel(), 1)
		assert.NoError(t, e.m.Health())
		require.NoError(t, e.m.RemoveControllerAndWait("ticker"))
		assert.Zero(t, time.Since(start)-10*time.Second-time.Millisecond, "removing the other controller waits for nothing")

		fresh := newRecorder()
		e.m.UpdateController("stuck", ControllerParams{DoFunc: fresh.do})
		synctest.Wait()
		assert.Equal(t, 1, fresh.count(), "the name can be installed again while the old DoFunc hangs")

		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		start = time.Now()
		err := e.m.Shutdown(ctx)
		assert.Equal(t, 5*time.Second, time.Since(start), "Shutdown returns at its deadline")
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.EqualError(t, err, "controller: shutdown: context deadline exceeded; still running: stuck")
		assert.Equal(t, 1.0, testutil.ToFloat64(e.metrics.active), "only the hanging controller is left")

		close(never)
		require.NoError(t, e.m.Shutdown(context.Background()))
		assert.True(t, cancelled, "its context had been cancelled all along")
		assert.Equal(t, 0.0, testutil.ToFloat64(e.metrics.active))
	})
}

// A panicking StopFunc (recorded as TestStopFuncFailures shows) does not
// keep its controller from terminating, nor harm the Manager: the name can
// be installed again, other controllers run, Shutdown finds nothing left.
func TestFaultStopFuncPanics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		other := newRecorder()
		e.m.UpdateController("other", ControllerParams{DoFunc: other.do, RunInterval: time.Second})
		e.m.UpdateController("c", ControllerParams{DoFunc: NoopFunc, StopFunc: func(context.Context) error {
			var m map[string]int
			m["nil map"]++ // a runtime error, not a deliberate panic value
			return nil
		}})
		synctest.Wait()
		c := e.m.Lookup("c")
		term := e.m.TerminationChannel("c")
		require.NoError(t, e.m.RemoveControllerAndWait("c"))
		assert.True(t, isClosed(term))
		assert.ErrorContains(t, c.GetLastError(), "panic: assignment to entry in nil map")
		var re interface{ RuntimeError() }
		assert.ErrorAs(t, c.GetLastError(), &re, "the runtime error is wrapped, not flattened")

		again := newRecorder()
		e.m.UpdateController("c", ControllerParams{DoFunc: again.do})
		time.Sleep(2*time.Second + time.Millisecond)
		assert.Equal(t, 1, again.count())
		assert.Len(t, other.times(), 3, "the other controller never noticed")
		require.NoError(t, e.m.Shutdown(context.Background()))
		assert.Equal(t, 0.0, testutil.ToFloat64(e.metrics.active))
		assert.Equal(t, 0.0, testutil.ToFloat64(e.metrics.failing))
	})
}

// A StopFunc that blocks until its context ends: the removal returns at
// once, the controller stays active (stopping) for as long as it blocks,
// and only a Shutdown deadline ends it, naming it; the StopFunc then sees
// context.Canceled, and its error is recorded as a failure logged at Warn.
// A StopFunc that starts only after the deadline passed (its DoFunc was
// still running) gets an already cancelled context. (TestShutdownDeadline
// shows the cancellation itself.)
func TestFaultStopFuncBlocksUntilItsContextEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		waitForCtx := func(ctx context.Context) error {
			<-ctx.Done()
			return ctx.Err()
		}
		release := make(chan struct{})
		var lateStopErr error
		a := e.m.UpdateController("a", ControllerParams{DoFunc: NoopFunc, StopFunc: waitForCtx})
		b := e.m.UpdateController("b", ControllerParams{
			DoFunc: func(context.Context) error { <-release; return nil }, // still running at the deadline
			StopFunc: func(ctx context.Context) error {
				lateStopErr = ctx.Err()
				return nil
			},
		})
		synctest.Wait()

		start := time.Now()
		require.NoError(t, e.m.RemoveController("a"))
		assert.Zero(t, time.Since(start))
		time.Sleep(time.Hour)
		assert.False(t, isClosed(terminationOf(a)), "the StopFunc still blocks an hour later")
		assert.Equal(t, 2.0, testutil.ToFloat64(e.metrics.active))

		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		start = time.Now()
		err := e.m.Shutdown(ctx)
		assert.Equal(t, time.Minute, time.Since(start))
		assert.ErrorIs(t, err, context.DeadlineExceeded)
		assert.EqualError(t, err, "controller: shutdown: context deadline exceeded; still running: a, b")
		synctest.Wait()
		assert.True(t, isClosed(terminationOf(a)), "cancelled at the deadline, the StopFunc returned")
		assert.ErrorIs(t, a.GetLastError(), context.Canceled)
		assert.Equal(t, 1, a.GetFailureCount())
		assert.Equal(t, []string{"StopFunc failed"}, e.logs(logrus.WarnLevel))

		close(release)
		<-terminationOf(b)
		assert.ErrorIs(t, lateStopErr, context.Canceled, "a StopFunc that starts after the deadline gets a cancelled context")
		assert.Equal(t, 0.0, testutil.ToFloat64(e.metrics.active))
	})
}

// A HealthReporter that panics wherever it is called (after a run, for
// invalid parameters, after a failed StopFunc) is
// recovered and logged at Error with its stack, and the controller goes on.
// A reporter may also call back into the Manager, even to remove its own
// controller. (TestHealthReporter covers the panics after runs.)
func TestFaultHealthReporterPanics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		r := newRecorder(errBoom, nil)
		p := ControllerParams{DoFunc: r.do, Health: panickingReporter{},
			StopFunc: func(context.Context) error { return errors.New("release failed") }}

		bad := p
		bad.RunInterval = -1
		c := e.m.UpdateController("c", bad) // reported even though the next update replaces it at once
		assert.Equal(t, 1, c.GetFailureCount())
		e.m.UpdateController("c", p)
		time.Sleep(time.Second + time.Millisecond)
		assert.Equal(t, 2, r.count(), "runs and retries as if nothing happened")
		assert.Equal(t, 0, c.GetConsecutiveFailureCount())
		require.NoError(t, e.m.RemoveControllerAndWait("c"))
		assert.EqualError(t, c.GetLastError(), "release failed")

		var panics []*logrus.Entry
		for _, en := range e.hook.AllEntries() {
			if en.Message == "HealthReporter panicked" {
				panics = append(panics, en)
			}
		}
		require.Len(t, panics, 4, "invalid parameters, a failure, a success, a failed StopFunc")
		for _, en := range panics {
			assert.Equal(t, logrus.ErrorLevel, en.Level)
			assert.Contains(t, en.Data["stack"], "panickingReporter")
		}

		reentrant := &callbackReporter{fn: func(name string) {
			_ = e.m.Health()
			_ = e.m.GetStatusModel()
			_ = e.m.RemoveController(name) // its own controller, from its own goroutine
		}}
		r2 := newRecorder()
		c2 := e.m.UpdateController("self-removing", ControllerParams{DoFunc: r2.do, RunInterval: time.Second, Health: reentrant})
		synctest.Wait()
		assert.True(t, isClosed(terminationOf(c2)), "it removed itself and terminated")
		assert.Equal(t, 1, r2.count())
		assert.Equal(t, 0.0, testutil.ToFloat64(e.metrics.active))
	})
}

type callbackReporter struct{ fn func(name string) }

func (r *callbackReporter) OK(name string)                { r.fn(name) }
func (r *callbackReporter) Degraded(name string, _ error) { r.fn(name) }

// A logrus hook that fails makes logrus print "Failed to fire hook" to
// os.Stderr (not to the logger's Out); the controller runs, records and logs
// on regardless.
func TestFaultLogHookFails(t *testing.T) {
	stderr := captureStderr(t)
	synctest.Test(t, func(t *testing.T) {
		logger := logrus.New()
		logger.SetOutput(io.Discard)
		hook := &failingHook{}
		logger.AddHook(hook)
		met := NewMetrics(MetricsOpts{})
		m := NewManager(WithLogger(logger), WithMetrics(met))
		r := newRecorder(errBoom, errors.New("other"), nil)
		c := m.UpdateController("c", ControllerParams{DoFunc: r.do})
		time.Sleep(3*time.Second + time.Millisecond) // fails at 0 and 1, succeeds at 3
		assert.Equal(t, 3, r.count())
		assert.Equal(t, 1, c.GetSuccessCount())
		assert.Equal(t, 2, c.GetFailureCount())
		assert.Equal(t, 0.0, testutil.ToFloat64(met.failing))
		m.RemoveAllAndWait()
		assert.Equal(t, 3, hook.fired, "Warn, Warn for the new message, Info for the recovery")
	})
	assert.Equal(t, 3, strings.Count(stderr(), "Failed to fire hook: hook: disk full"))
}

type failingHook struct{ fired int }

func (h *failingHook) Levels() []logrus.Level { return logrus.AllLevels }
func (h *failingHook) Fire(*logrus.Entry) error {
	h.fired++
	return errors.New("hook: disk full")
}

// captureStderr points os.Stderr at a file until the test ends and returns
// a function that reads what was written to it.
func captureStderr(t *testing.T) func() string {
	f, err := os.CreateTemp(t.TempDir(), "stderr")
	require.NoError(t, err)
	saved := os.Stderr
	os.Stderr = f
	t.Cleanup(func() { os.Stderr = saved; f.Close() })
	return func() string {
		b, err := os.ReadFile(f.Name())
		require.NoError(t, err)
		return string(b)
	}
}

// A logrus hook that panics does not end the controller's goroutine (and
// the program with it): the panic is recovered and written to standard
// error, and the controller goes on running, recording and reporting.
func TestFaultLogHookPanics(t *testing.T) {
	stderr := captureStderr(t)
	synctest.Test(t, func(t *testing.T) {
		logger := logrus.New()
		logger.SetOutput(io.Discard)
		logger.AddHook(panickingHook{})
		m := NewManager(WithLogger(logger), WithMetrics(nil))
		h := &healthLog{}
		r := newRecorder(errBoom, nil)
		c := m.UpdateController("c", ControllerParams{DoFunc: r.do, Health: h,
			StopFunc: func(context.Context) error { return errors.New("release failed") }})
		time.Sleep(time.Second + time.Millisecond) // fails at 0 (Warn), succeeds at 1
		assert.Equal(t, 2, r.count())
		assert.Equal(t, []string{"degraded c: boom", "ok c"}, h.all())
		require.NoError(t, m.RemoveControllerAndWait("c")) // StopFunc fails: another Warn
		assert.EqualError(t, c.GetLastError(), "release failed")
	})
	assert.Equal(t, 2, strings.Count(stderr(), `controller "c": logging panicked: hook panics on Warn`))
}

type panickingHook struct{}

func (panickingHook) Levels() []logrus.Level { return []logrus.Level{logrus.WarnLevel} }
func (panickingHook) Fire(*logrus.Entry) error {
	panic("hook panics on Warn")
}

// A params.Context cancelled before the controller is created: DoFunc still
// runs once (rule 1), with a cancelled context, and its error is an exit,
// not a failure; neither timers nor triggers run it again; removal runs the
// StopFunc with a live context that keeps the parent's values. (Builds on
// TestParamsContextCancelledAtCreation and TestEndedParamsContextParks.)
func TestFaultParamsContextCancelledAtCreation(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		type key struct{}
		e := newEnv(t)
		parent, cancel := context.WithCancel(context.WithValue(context.Background(), key{}, "v"))
		cancel()
		r := newRecorder(errBoom)
		var stopCtxErr error
		var stopValue any
		require.True(t, e.m.CreateController("c", ControllerParams{
			DoFunc: r.do, Context: parent, RunInterval: time.Second, ErrorRetryBaseDuration: time.Millisecond,
			StopFunc: func(ctx context.Context) error {
				stopCtxErr, stopValue = ctx.Err(), ctx.Value(key{})
				return nil
			},
		}))
		synctest.Wait()
		require.Equal(t, 1, r.count())
		assert.ErrorIs(t, r.ctxs[0].Err(), context.Canceled, "the first run gets the cancelled context")
		c := e.m.Lookup("c")
		assert.Equal(t, 1, c.GetSuccessCount())
		assert.Zero(t, c.GetFailureCount())
		assert.EqualError(t, c.GetLastError(), "controller context canceled")
		assert.NoError(t, e.m.Health())

		time.Sleep(time.Hour)
		assert.True(t, e.m.TriggerController("c"))
		synctest.Wait()
		assert.Equal(t, 1, r.count(), "parked: no timer, no trigger runs it")

		require.NoError(t, e.m.RemoveControllerAndWait("c"))
		assert.NoError(t, stopCtxErr)
		assert.Equal(t, "v", stopValue)
		assert.Equal(t, 0.0, testutil.ToFloat64(e.metrics.failing))
	})
}

// Durations near math.MaxInt64: the waits saturate instead of
// overflowing into the past (which would make a busy loop), the timers
// handle them, a trigger still runs the controller at once, and the
// status shows and serialises them.
func TestFaultDurationsNearMaxInt64(t *testing.T) {
	const huge = time.Duration(math.MaxInt64)
	cases := []struct {
		name string
		p    ControllerParams
		err  error
	}{
		{"retry base", ControllerParams{ErrorRetryBaseDuration: huge - 1, Jitter: huge / 2}, errBoom},
		{"retry base with interval", ControllerParams{ErrorRetryBaseDuration: huge, RunInterval: huge}, errBoom},
		{"retry base below the cap", ControllerParams{ErrorRetryBaseDuration: huge / 2, MaxRetryInterval: huge - 1}, errBoom},
		{"interval", ControllerParams{RunInterval: huge, Jitter: huge}, nil},
		{"interval after giving up", ControllerParams{RunInterval: huge - 1, MaxRetries: 1, ErrorRetryBaseDuration: time.Nanosecond}, errBoom},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newEnv(t)
				r := newRecorder(tc.err)
				p := tc.p
				p.DoFunc = r.do
				c := e.m.UpdateController("c", p)
				time.Sleep(100 * 365 * 24 * time.Hour)
				assert.Equal(t, 1, r.count(), "one run in a hundred years")

				assert.True(t, e.m.TriggerController("c"))
				synctest.Wait()
				assert.Equal(t, 2, r.count(), "a trigger runs it at once")
				time.Sleep(100 * 365 * 24 * time.Hour)
				assert.Equal(t, 2, r.count())

				b, err := json.Marshal(c.GetStatusModel())
				require.NoError(t, err)
				var back ControllerStatus
				require.NoError(t, json.Unmarshal(b, &back))
				assert.Equal(t, Duration(p.RunInterval), back.Configuration.Interval)
				assert.Equal(t, Duration(p.retryBase()), back.Configuration.ErrorRetryBase)
				require.NoError(t, e.m.RemoveControllerAndWait("c"))
			})
		})
	}
}
