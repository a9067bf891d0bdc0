// Tests of logging and of the HealthReporter calls, including loggers and
// reporters that fail or panic.

package controller

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// No Error log on updates of a controller without a group (a Cilium bug),
// and only one Warn for a steady failure streak.
func TestNoLogSpam(t *testing.T) {
	forEachSink(t, func(t *testing.T, sink string) {
		synctest.Test(t, func(t *testing.T) {
			e := newEnvOn(t, sink)
			r := newRecorder(errBoom)
			p := ControllerParams{DoFunc: r.do, ErrorRetryBaseDuration: time.Millisecond, MaxRetryInterval: time.Millisecond}
			e.m.UpdateController("c", p)
			time.Sleep(time.Second)
			for range 10 {
				e.m.UpdateController("c", p)
			}
			time.Sleep(time.Second)
			e.m.RemoveAllAndWait()
			assert.Greater(t, r.count(), 1000)
			assert.Equal(t, []string{"controller failed; retrying"}, e.logs(logrus.WarnLevel))
			assert.Empty(t, e.logs(logrus.ErrorLevel))
			assert.Empty(t, e.logs(logrus.DebugLevel), "nothing at Debug when Debug is off")
		})
	})
}

// A failure streak logs one Warn, and another when the error's message
// changes.
func TestWarnOnChangedErrorWithinStreak(t *testing.T) {
	forEachSink(t, func(t *testing.T, sink string) {
		synctest.Test(t, func(t *testing.T) {
			e := newEnvOn(t, sink)
			r := newRecorder(errBoom, errBoom, errors.New("other"), errors.New("other"))
			e.m.UpdateController("c", ControllerParams{DoFunc: r.do})
			time.Sleep(10 * time.Second)
			e.m.RemoveAllAndWait()
			var warns []string
			for _, en := range e.hook.AllEntries() {
				if en.Level == logrus.WarnLevel {
					warns = append(warns, fmt.Sprint(en.Data[logrus.ErrorKey]))
				}
			}
			assert.Equal(t, []string{"boom", "other"}, warns)
		})
	})
}

// Logging: every controller's entry carries subsys and the controller's
// name and UUID (controllerKeys); Debug logs every run with its duration
// and outcome.
func TestLogFieldsAndDebug(t *testing.T) {
	forEachSink(t, func(t *testing.T, sink string) {
		synctest.Test(t, func(t *testing.T) {
			e := newEnvOn(t, sink)
			e.logger.SetLevel(logrus.DebugLevel)
			r := newRecorder(errBoom, nil)
			r.took = 250 * time.Millisecond
			c := e.m.UpdateController("c", ControllerParams{DoFunc: r.do})
			time.Sleep(2 * time.Second)
			e.m.RemoveAllAndWait()
			nameKey, uuidKey := controllerKeys(sink)
			var debug []*logrus.Entry
			for _, en := range e.hook.AllEntries() {
				assert.Equal(t, "controller", en.Data["subsys"])
				assert.Equal(t, "c", en.Data[nameKey])
				assert.Equal(t, c.UUID(), en.Data[uuidKey])
				if en.Level == logrus.DebugLevel {
					debug = append(debug, en)
				}
			}
			require.Len(t, debug, 2)
			assert.Equal(t, "failure", debug[0].Data["outcome"])
			assert.Equal(t, 250*time.Millisecond, debug[0].Data["duration"])
			assert.Equal(t, "success", debug[1].Data["outcome"])
		})
	})
}

// HealthReporter: told after every run; a panicking one is recovered and
// the controller goes on.
func TestHealthReporter(t *testing.T) {
	forEachSink(t, func(t *testing.T, sink string) {
		synctest.Test(t, func(t *testing.T) {
			e := newEnvOn(t, sink)
			h := &healthLog{}
			r := newRecorder(errBoom, nil)
			e.m.UpdateController("c", ControllerParams{DoFunc: r.do, Health: h})
			time.Sleep(2 * time.Second)
			assert.Equal(t, []string{"degraded c: boom", "ok c"}, h.all())

			r2 := newRecorder(errBoom, nil)
			e.m.UpdateController("p", ControllerParams{DoFunc: r2.do, Health: panickingReporter{}})
			time.Sleep(2 * time.Second)
			assert.Equal(t, 2, r2.count(), "the controller went on after the reporter panicked")
			assert.Equal(t, []string{"HealthReporter panicked", "HealthReporter panicked"}, e.logs(logrus.ErrorLevel))
			e.m.RemoveAllAndWait()
		})
	})
}

type panickingReporter struct{}

func (panickingReporter) OK(string)              { panic("ok") }
func (panickingReporter) Degraded(string, error) { panic("degraded") }

// A HealthReporter that panics wherever it is called (after a run, for
// invalid parameters, after a failed StopFunc) is
// recovered and logged at Error with its stack, and the controller goes on.
// A reporter may also call back into the Manager, even to remove its own
// controller. (TestHealthReporter covers the panics after runs.)
func TestFaultHealthReporterPanics(t *testing.T) {
	forEachSink(t, func(t *testing.T, sink string) {
		synctest.Test(t, func(t *testing.T) {
			e := newEnvOn(t, sink)
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
	})
}

type callbackReporter struct{ fn func(name string) }

func (r *callbackReporter) OK(name string)                { r.fn(name) }
func (r *callbackReporter) Degraded(name string, _ error) { r.fn(name) }

// Two invalid updates that reach a controller while its DoFunc runs are
// both logged at Error and each told to its own HealthReporter, in order.
func TestEveryInvalidUpdateIsReported(t *testing.T) {
	forEachSink(t, func(t *testing.T, sink string) {
		synctest.Test(t, func(t *testing.T) {
			e := newEnvOn(t, sink)
			release := make(chan struct{})
			e.m.UpdateController("c", ControllerParams{DoFunc: func(context.Context) error { <-release; return nil }})
			synctest.Wait()
			first, second := &healthLog{}, &healthLog{}
			e.m.UpdateController("c", ControllerParams{DoFunc: NoopFunc, RunInterval: -time.Second, Health: first})
			e.m.UpdateController("c", ControllerParams{DoFunc: NoopFunc, Jitter: -time.Second, Health: second})
			close(release)
			synctest.Wait()

			var errs []string
			for _, en := range e.hook.AllEntries() {
				if en.Level == logrus.ErrorLevel {
					errs = append(errs, fmt.Sprint(en.Data[logrus.ErrorKey]))
				}
			}
			require.Len(t, errs, 2, "each invalid update is logged")
			assert.Contains(t, errs[0], "RunInterval")
			assert.Contains(t, errs[1], "Jitter")
			require.Len(t, first.all(), 1)
			assert.Contains(t, first.all()[0], "RunInterval")
			require.Len(t, second.all(), 1)
			assert.Contains(t, second.all()[0], "Jitter")
			assert.Equal(t, 2, e.m.Lookup("c").GetFailureCount())
			e.m.RemoveAllAndWait()
		})
	})
}

// healthHook is a HealthReporter that calls onDegraded, once, from inside
// its first Degraded.
type healthHook struct {
	healthLog
	onDegraded func()
	fired      atomic.Bool
}

func (h *healthHook) Degraded(name string, err error) {
	h.healthLog.Degraded(name, err)
	if h.fired.CompareAndSwap(false, true) {
		h.onDegraded()
	}
}

// Invalid parameters that arrive while the loop reports earlier invalid
// ones are reported too, whether the loop came from a timed wait or not.
// (They were lost after a timed wait: the update woke the timer, which the
// loop no longer read.)
func TestInvalidUpdateDuringAReportIsReported(t *testing.T) {
	forEachSink(t, func(t *testing.T, sink string) {
		for _, interval := range []time.Duration{0, time.Hour} {
			t.Run("RunInterval "+interval.String(), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					e := newEnvOn(t, sink)
					e.m.UpdateController("c", ControllerParams{DoFunc: NoopFunc, RunInterval: interval})
					synctest.Wait()
					second := &healthLog{}
					first := &healthHook{onDegraded: func() {
						e.m.UpdateController("c", ControllerParams{DoFunc: NoopFunc, RunInterval: -2, Health: second})
					}}
					e.m.UpdateController("c", ControllerParams{DoFunc: NoopFunc, RunInterval: -1, Health: first})
					synctest.Wait()
					assert.Equal(t, []string{"degraded c: invalid controller parameters: RunInterval must not be negative, got -2ns"}, second.all())
					assert.Len(t, e.logs(logrus.ErrorLevel), 2)
					e.m.RemoveAllAndWait()
				})
			})
		}
	})
}

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

// A slog handler that fails (Handle returns an error, which slog drops)
// changes nothing for the controller; one that panics is recovered and
// written to standard error, as a panicking logrus hook is
// (TestFaultLogHookPanics), and the controller goes on running, recording
// and reporting.
func TestFaultSlogHandlerFailsOrPanics(t *testing.T) {
	stderr := captureStderr(t)
	for _, h := range []*faultyHandler{{fail: true}, {panicAt: slog.LevelWarn}} {
		synctest.Test(t, func(t *testing.T) {
			m := NewManager(WithSlog(slog.New(h)), WithMetrics(nil))
			health := &healthLog{}
			r := newRecorder(errBoom, nil)
			c := m.UpdateController("c", ControllerParams{DoFunc: r.do, Health: health,
				StopFunc: func(context.Context) error { return errors.New("release failed") }})
			time.Sleep(time.Second + time.Millisecond) // fails at 0 (Warn), succeeds at 1 (Info)
			assert.Equal(t, 2, r.count())
			assert.Equal(t, []string{"degraded c: boom", "ok c"}, health.all())
			require.NoError(t, m.RemoveControllerAndWait("c")) // StopFunc fails: another Warn
			assert.EqualError(t, c.GetLastError(), "release failed")
			assert.Equal(t, 3, h.handled, "Warn, Info, Warn")
		})
	}
	assert.Equal(t, 2, strings.Count(stderr(), `controller "c": logging panicked: handler panics at WARN`))
}

// faultyHandler is a slog.Handler that counts the records it is given and
// fails each (fail) or panics on those at panicAt.
type faultyHandler struct {
	fail    bool
	panicAt slog.Level
	handled int
}

func (h *faultyHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *faultyHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *faultyHandler) WithGroup(string) slog.Handler            { return h }

func (h *faultyHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Level < slog.LevelInfo {
		return nil
	}
	h.handled++
	if h.fail {
		return errors.New("handler: disk full")
	}
	if r.Level == h.panicAt {
		panic("handler panics at " + r.Level.String())
	}
	return nil
}
