package controller

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The wait after a run, as a table: outcome × params × step → wait.
func TestNextWait(t *testing.T) {
	const maxD = time.Duration(math.MaxInt64)
	type want struct {
		wait  time.Duration
		timed bool
	}
	never := want{0, false}
	cases := []struct {
		name   string
		o      outcome
		p      ControllerParams
		step   int
		jitter time.Duration
		want   want
	}{
		{"success without interval waits for a signal", outcomeSuccess, ControllerParams{}, 0, 0, never},
		{"success with interval", outcomeSuccess, ControllerParams{RunInterval: 5 * time.Second}, 0, 0, want{5 * time.Second, true}},
		{"success with interval and jitter", outcomeSuccess, ControllerParams{RunInterval: 5 * time.Second, Jitter: time.Second}, 0, 300 * time.Millisecond, want{5300 * time.Millisecond, true}},
		{"exit reason ignores the interval", outcomeExit, ControllerParams{RunInterval: 5 * time.Second}, 0, 0, never},
		{"first failure, default base 1s", outcomeFailure, ControllerParams{}, 1, 0, want{time.Second, true}},
		{"fourth failure, default base", outcomeFailure, ControllerParams{}, 4, 0, want{4 * time.Second, true}},
		{"failure with base 200ms, step 3", outcomeFailure, ControllerParams{ErrorRetryBaseDuration: 200 * time.Millisecond}, 3, 0, want{600 * time.Millisecond, true}},
		{"failure capped", outcomeFailure, ControllerParams{MaxRetryInterval: 3 * time.Second}, 7, 0, want{3 * time.Second, true}},
		{"jitter comes after the cap", outcomeFailure, ControllerParams{MaxRetryInterval: 3 * time.Second, Jitter: time.Second}, 7, 999 * time.Millisecond, want{3999 * time.Millisecond, true}},
		{"failure ignores the interval while retrying", outcomeFailure, ControllerParams{RunInterval: time.Hour}, 2, 0, want{2 * time.Second, true}},
		{"NoErrorRetry without interval waits for a signal", outcomeFailure, ControllerParams{NoErrorRetry: true}, 1, 0, never},
		{"NoErrorRetry falls back to the interval", outcomeFailure, ControllerParams{NoErrorRetry: true, RunInterval: 10 * time.Second}, 1, 0, want{10 * time.Second, true}},
		{"below MaxRetries retries", outcomeFailure, ControllerParams{MaxRetries: 3}, 2, 0, want{2 * time.Second, true}},
		{"at MaxRetries gives up", outcomeFailure, ControllerParams{MaxRetries: 3}, 3, 0, never},
		{"past MaxRetries falls back to the interval", outcomeFailure, ControllerParams{MaxRetries: 3, RunInterval: time.Minute}, 4, 0, want{time.Minute, true}},
		{"huge base saturates", outcomeFailure, ControllerParams{ErrorRetryBaseDuration: maxD / 2}, 3, 0, want{maxD, true}},
		{"huge step saturates", outcomeFailure, ControllerParams{}, math.MaxInt, 0, want{maxD, true}},
		{"saturated wait plus jitter stays saturated", outcomeFailure, ControllerParams{ErrorRetryBaseDuration: maxD, Jitter: time.Hour}, 2, time.Minute, want{maxD, true}},
		{"huge interval plus jitter saturates", outcomeSuccess, ControllerParams{RunInterval: maxD - 1, Jitter: time.Hour}, 0, time.Minute, want{maxD, true}},
		{"huge cap keeps the product", outcomeFailure, ControllerParams{ErrorRetryBaseDuration: time.Hour, MaxRetryInterval: maxD}, 3, 0, want{3 * time.Hour, true}},
		{"negative durations count as zero", outcomeFailure, ControllerParams{ErrorRetryBaseDuration: -1, MaxRetryInterval: -1}, 2, -5, want{2 * time.Second, true}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			wait, timed := nextWait(tc.o, &tc.p, tc.step, tc.jitter)
			assert.Equal(t, tc.want, want{wait, timed})
		})
	}
}

// Rule 4: a controller failing with base 1s runs at 0s, 1s, 3s, 6s, 10s.
func TestFailingControllerBacksOffLinearly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		r := newRecorder(errBoom)
		e.m.UpdateController("c", ControllerParams{DoFunc: r.do})
		time.Sleep(10*time.Second + time.Millisecond)
		e.m.RemoveAllAndWait()
		assert.Equal(t, secs(0, 1, 3, 6, 10), r.times())
	})
}

func TestRetryWaitIsCappedByMaxRetryInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		r := newRecorder(errBoom)
		e.m.UpdateController("c", ControllerParams{DoFunc: r.do, ErrorRetryBaseDuration: 500 * time.Millisecond, MaxRetryInterval: time.Second})
		time.Sleep(4*time.Second + time.Millisecond)
		e.m.RemoveAllAndWait()
		assert.Equal(t, secs(0, 0.5, 1.5, 2.5, 3.5), r.times())
	})
}

// Rule 1: the first run starts at once.
func TestFirstRunIsImmediateAndInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		r := newRecorder()
		e.m.UpdateController("c", ControllerParams{DoFunc: r.do, RunInterval: 5 * time.Second})
		synctest.Wait()
		assert.Equal(t, secs(0), r.times())
		time.Sleep(15*time.Second + time.Millisecond)
		e.m.RemoveAllAndWait()
		assert.Equal(t, secs(0, 5, 10, 15), r.times())
	})
}

// Rule 4: the wait is measured from the moment DoFunc returned.
func TestWaitStartsWhenDoFuncReturns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		r := newRecorder()
		r.took = 2 * time.Second
		e.m.UpdateController("c", ControllerParams{DoFunc: r.do, RunInterval: 5 * time.Second})
		time.Sleep(14*time.Second + time.Millisecond)
		e.m.RemoveAllAndWait()
		assert.Equal(t, secs(0, 7, 14), r.times())
	})
}

// Rule 1: a controller removed before its goroutine started still runs
// DoFunc once, with a cancelled context, and then its StopFunc. The test
// removes the controller between its installation and the start of its
// goroutine, which the public API cannot order.
func TestFirstRunHappensEvenWhenRemovedAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		var ctxErr error
		var runs, stops int
		p := ControllerParams{
			DoFunc:   func(ctx context.Context) error { runs++; ctxErr = ctx.Err(); return nil },
			StopFunc: func(ctx context.Context) error { stops++; return nil },
		}
		e.m.mu.Lock()
		c := newController(e.m, "c", p, nil, e.metrics.group(""))
		e.m.controllers = map[string]*Controller{"c": c}
		e.metrics.addActive(1)
		e.m.removeLocked(c)
		e.m.mu.Unlock()
		go c.run()
		<-c.terminationChannel()
		assert.Equal(t, 1, runs)
		assert.ErrorIs(t, ctxErr, context.Canceled)
		assert.Equal(t, 1, stops)
		assert.Equal(t, 0.0, testutil.ToFloat64(e.metrics.active))
	})
}

// Rule 2: the run context carries params.Context's values, is reused across
// runs and is cancelled on removal.
func TestRunContextDerivesFromParamsAndIsReused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		type key struct{}
		e := newEnv(t)
		r := newRecorder()
		parent := context.WithValue(context.Background(), key{}, "v")
		e.m.UpdateController("c", ControllerParams{DoFunc: r.do, RunInterval: time.Second, Context: parent})
		time.Sleep(2*time.Second + time.Millisecond)
		e.m.TriggerController("c") // without CancelDoFuncOnUpdate: the context is kept
		synctest.Wait()
		require.NoError(t, e.m.RemoveControllerAndWait("c"))
		require.Len(t, r.ctxs, 4)
		for _, ctx := range r.ctxs {
			assert.Same(t, r.ctxs[0], ctx)
		}
		assert.Equal(t, "v", r.ctxs[0].Value(key{}))
		assert.ErrorIs(t, r.ctxs[0].Err(), context.Canceled)
	})
}

// blocker is a DoFunc that blocks until its context ends or it is released,
// and records how each call ended.
type blocker struct {
	mu        sync.Mutex
	started   int
	cancelled int
	release   chan struct{}
	params    []int // the "version" of the parameters of each call
}

func newBlocker() *blocker { return &blocker{release: make(chan struct{})} }

func (b *blocker) fn(version int) ControllerFunc {
	return func(ctx context.Context) error {
		b.mu.Lock()
		b.started++
		b.params = append(b.params, version)
		b.mu.Unlock()
		select {
		case <-ctx.Done():
			b.mu.Lock()
			b.cancelled++
			b.mu.Unlock()
			return ctx.Err()
		case <-b.release:
			return nil
		}
	}
}

func (b *blocker) counts() (started, cancelled int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.started, b.cancelled
}

// Rule 2 and rule 4: CancelDoFuncOnUpdate cancels the running DoFunc on an
// update or trigger; the flag of the running DoFunc's parameters decides.
func TestCancelDoFuncOnUpdate(t *testing.T) {
	cases := []struct {
		name          string
		running, next bool // CancelDoFuncOnUpdate of the running and of the new params
		trigger       bool
		wantCancelled int
	}{
		{"update, flag set on the running params", true, false, false, 1},
		{"update, flag set only on the new params", false, true, false, 0},
		{"trigger with the flag", true, true, true, 1},
		{"trigger without the flag", false, false, true, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newEnv(t)
				b := newBlocker()
				e.m.UpdateController("c", ControllerParams{DoFunc: b.fn(1), CancelDoFuncOnUpdate: tc.running})
				synctest.Wait()
				if tc.trigger {
					e.m.TriggerController("c")
				} else {
					e.m.UpdateController("c", ControllerParams{DoFunc: b.fn(2), CancelDoFuncOnUpdate: tc.next})
				}
				synctest.Wait()
				started, cancelled := b.counts()
				assert.Equal(t, tc.wantCancelled, cancelled)
				assert.Equal(t, 1+tc.wantCancelled, started, "a cancelled run is followed at once by the next")
				close(b.release)
				e.m.RemoveAllAndWait()
			})
		})
	}
}

// Rule 2: an update that brings a different Context replaces the run
// context, cancelling the running DoFunc whatever the flag.
func TestUpdateWithNewContextCancelsRunningDoFunc(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		b := newBlocker()
		type key struct{}
		e.m.UpdateController("c", ControllerParams{DoFunc: b.fn(1)})
		synctest.Wait()
		ctx2 := context.WithValue(context.Background(), key{}, 2)
		var got any
		e.m.UpdateController("c", ControllerParams{Context: ctx2, DoFunc: func(ctx context.Context) error {
			got = ctx.Value(key{})
			return nil
		}})
		synctest.Wait()
		_, cancelled := b.counts()
		assert.Equal(t, 1, cancelled)
		assert.Equal(t, 2, got)
		c := e.m.Lookup("c")
		assert.Equal(t, 2, c.GetSuccessCount(), "the cancelled run is an exit, not a failure")
		assert.Equal(t, 0, c.GetFailureCount())
		e.m.RemoveAllAndWait()
	})
}

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

// Rule 3: once params.Context has ended, no DoFunc runs on timers or
// triggers; an update with the same ended context parks again; an update
// with a live context runs.
func TestEndedParamsContextParks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		r := newRecorder(errBoom)
		ctx, cancel := context.WithCancel(context.Background())
		stops := 0
		params := ControllerParams{DoFunc: r.do, RunInterval: time.Second, Context: ctx,
			StopFunc: func(ctx context.Context) error { stops++; return ctx.Err() }}
		e.m.UpdateController("c", params)
		time.Sleep(1500 * time.Millisecond)
		cancel()
		time.Sleep(time.Hour)
		e.m.TriggerController("c")
		synctest.Wait()
		assert.Equal(t, secs(0, 1), r.times(), "parked: neither the retry timer nor the trigger runs it")

		e.m.UpdateController("c", params)
		synctest.Wait()
		assert.Len(t, r.times(), 2, "an update with the same ended context parks again")

		params.Context = context.Background()
		e.m.UpdateController("c", params)
		synctest.Wait()
		assert.Len(t, r.times(), 3, "an update with a live context runs")
		require.NoError(t, e.m.RemoveControllerAndWait("c"))
		assert.Equal(t, 1, stops, "StopFunc runs, with a context that is not cancelled")
	})
}

// A params.Context already cancelled at creation: the first run still
// happens (rule 1), then the controller parks.
func TestParamsContextCancelledAtCreation(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		r := newRecorder(errBoom)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		e.m.UpdateController("c", ControllerParams{DoFunc: r.do, RunInterval: time.Second, Context: ctx})
		time.Sleep(time.Minute)
		assert.Equal(t, secs(0), r.times())
		c := e.m.Lookup("c")
		assert.Equal(t, 0, c.GetFailureCount(), "its error came after cancellation")
		e.m.RemoveAllAndWait()
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
		assert.Contains(t, panics[0].Data["stack"], "controller_test.go")
		e.m.RemoveAllAndWait()
	})
}

// Rule 4: NoErrorRetry with RunInterval 0 does not busy-loop (a Cilium bug):
// a failure waits for an update or trigger.
func TestNoErrorRetryWithoutIntervalRunsOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		r := newRecorder(errBoom)
		e.m.UpdateController("c", ControllerParams{DoFunc: r.do, NoErrorRetry: true})
		time.Sleep(24 * time.Hour)
		assert.Equal(t, secs(0), r.times())
		e.m.TriggerController("c")
		synctest.Wait()
		assert.Equal(t, secs(0, 86400), r.times())
		e.m.RemoveAllAndWait()
	})
}

func TestNoErrorRetryWithIntervalWaitsTheInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		r := newRecorder(errBoom)
		e.m.UpdateController("c", ControllerParams{DoFunc: r.do, NoErrorRetry: true, RunInterval: 5 * time.Second})
		time.Sleep(10*time.Second + time.Millisecond)
		e.m.RemoveAllAndWait()
		assert.Equal(t, secs(0, 5, 10), r.times())
	})
}

// Rule 4: once MaxRetries failures happened since the last success, no
// retry is scheduled; the interval still applies.
func TestMaxRetriesStopsRetrying(t *testing.T) {
	t.Run("without interval", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			e := newEnv(t)
			r := newRecorder(errBoom)
			e.m.UpdateController("c", ControllerParams{DoFunc: r.do, MaxRetries: 3})
			time.Sleep(time.Hour)
			assert.Equal(t, secs(0, 1, 3), r.times())
			assert.Equal(t, []string{"giving up retrying after 3 failures; next run on an update, a trigger or the RunInterval"}, e.logs(logrus.InfoLevel))
			e.m.RemoveAllAndWait()
		})
	})
	t.Run("with interval", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			e := newEnv(t)
			r := newRecorder(errBoom)
			e.m.UpdateController("c", ControllerParams{DoFunc: r.do, MaxRetries: 3, RunInterval: 10 * time.Second})
			time.Sleep(23*time.Second + time.Millisecond)
			e.m.RemoveAllAndWait()
			assert.Equal(t, secs(0, 1, 3, 13, 23), r.times())
		})
	})
	t.Run("an update starts a new count", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			e := newEnv(t)
			r := newRecorder(errBoom)
			p := ControllerParams{DoFunc: r.do, MaxRetries: 2}
			e.m.UpdateController("c", p)
			time.Sleep(time.Minute)
			e.m.UpdateController("c", p)
			time.Sleep(time.Minute)
			e.m.RemoveAllAndWait()
			assert.Equal(t, secs(0, 1, 60, 61), r.times())
		})
	})
}

// Rule 4: jitter adds [0, Jitter) to timed waits, never to the first run or
// to a run caused by an update or trigger.
func TestJitterOnlyOnTimedWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		r := newRecorder()
		e.m.UpdateController("c", ControllerParams{DoFunc: r.do, RunInterval: 10 * time.Second, Jitter: 5 * time.Second})
		synctest.Wait()
		assert.Equal(t, secs(0), r.times(), "no jitter before the first run")
		time.Sleep(100 * time.Second)
		e.m.TriggerController("c")
		synctest.Wait()
		e.m.RemoveAllAndWait()
		runs := r.times()
		require.GreaterOrEqual(t, len(runs), 8)
		last := runs[len(runs)-1]
		assert.Equal(t, 100*time.Second, last, "a trigger runs at once")
		distinct := map[time.Duration]bool{}
		for i := 1; i < len(runs)-1; i++ {
			gap := runs[i] - runs[i-1]
			assert.GreaterOrEqual(t, gap, 10*time.Second)
			assert.Less(t, gap, 15*time.Second)
			distinct[gap] = true
		}
		assert.Greater(t, len(distinct), 1, "the waits vary")
	})
}

func TestJitterAfterTheCap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		r := newRecorder(errBoom)
		e.m.UpdateController("c", ControllerParams{DoFunc: r.do, MaxRetryInterval: 2 * time.Second, Jitter: time.Second})
		time.Sleep(time.Minute)
		e.m.RemoveAllAndWait()
		runs := r.times()
		for i := 3; i < len(runs); i++ {
			gap := runs[i] - runs[i-1]
			assert.GreaterOrEqual(t, gap, 2*time.Second)
			assert.Less(t, gap, 3*time.Second, "a capped wait exceeds the cap by less than Jitter")
		}
	})
}

// Rule 5: an update while waiting runs at once and resets the retry step; a
// trigger runs at once and keeps it.
func TestUpdateResetsRetryStepTriggerKeepsIt(t *testing.T) {
	for _, tc := range []struct {
		name string
		poke func(m *Manager, p ControllerParams)
		want []time.Duration
	}{
		{"update", func(m *Manager, p ControllerParams) { m.UpdateController("c", p) }, secs(0, 1, 3, 4, 5, 7)},
		{"trigger", func(m *Manager, p ControllerParams) { m.TriggerController("c") }, secs(0, 1, 3, 4, 8)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newEnv(t)
				r := newRecorder(errBoom)
				p := ControllerParams{DoFunc: r.do}
				e.m.UpdateController("c", p)
				time.Sleep(4 * time.Second) // runs at 0, 1, 3; next due at 6
				tc.poke(e.m, p)
				time.Sleep(4*time.Second + time.Millisecond)
				e.m.RemoveAllAndWait()
				assert.Equal(t, tc.want, r.times())
			})
		})
	}
}

// A storm of updates of a failing controller does not raise its backoff
// (Cilium PR 21886): each update restarts it at one base.
func TestUpdateStormKeepsBackoffShort(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		r := newRecorder(errBoom)
		p := ControllerParams{DoFunc: r.do}
		for range 50 {
			e.m.UpdateController("c", p)
			synctest.Wait()
		}
		time.Sleep(time.Second + time.Millisecond)
		assert.Equal(t, time.Second, r.times()[len(r.times())-1], "retried one base after the last update")
		e.m.RemoveAllAndWait()
	})
}

// Rule 5: updates and triggers that arrive during a run are coalesced into
// one run with the newest parameters; none is lost.
func TestSignalsDuringARunCoalesce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		b := newBlocker()
		e.m.UpdateController("c", ControllerParams{DoFunc: b.fn(0), Group: NewGroup("g0")})
		synctest.Wait()
		for v := 1; v <= 3; v++ {
			e.m.UpdateController("c", ControllerParams{DoFunc: b.fn(v), Group: NewGroup(fmt.Sprintf("g%d", v))})
			e.m.TriggerController("c")
		}
		b.release <- struct{}{}
		synctest.Wait()
		assert.Equal(t, []int{0, 3}, b.params, "one more run, with the newest parameters")
		assert.Equal(t, "g3", e.m.Lookup("c").GetStatusModel().Configuration.Group)
		close(b.release)
		synctest.Wait()
		assert.Equal(t, 1.0, testutil.ToFloat64(e.metrics.groupRuns.WithLabelValues("g3", success)),
			"the run after the updates counts in the newest group (rule 8)")
		assert.Equal(t, 1.0, testutil.ToFloat64(e.metrics.groupRuns.WithLabelValues("g0", success)),
			"the run in flight during the updates counts in the group it started with")
		e.m.RemoveAllAndWait()
	})
}

// Rule 5: when removal and another signal arrive together, removal wins.
func TestRemovalWinsOverPendingSignals(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		b := newBlocker()
		e.m.UpdateController("c", ControllerParams{DoFunc: b.fn(0)})
		synctest.Wait()
		e.m.UpdateController("c", ControllerParams{DoFunc: b.fn(1)})
		e.m.TriggerController("c")
		require.NoError(t, e.m.RemoveController("c"))
		e.m.RemoveAllAndWait()
		assert.Equal(t, []int{0}, b.params)
	})
}

// Rule 6: DoFuncs never overlap each other or the StopFunc.
func TestRunsNeverOverlap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		var inside, maxInside, calls atomic.Int32
		enter := func() {
			n := inside.Add(1)
			for {
				m := maxInside.Load()
				if n <= m || maxInside.CompareAndSwap(m, n) {
					break
				}
			}
			calls.Add(1)
		}
		do := func(ctx context.Context) error {
			enter()
			defer inside.Add(-1)
			time.Sleep(10 * time.Millisecond)
			return errBoom
		}
		stop := func(ctx context.Context) error {
			enter()
			defer inside.Add(-1)
			time.Sleep(10 * time.Millisecond)
			return nil
		}
		p := ControllerParams{DoFunc: do, StopFunc: stop, ErrorRetryBaseDuration: time.Millisecond}
		e.m.UpdateController("c", p)
		var wg sync.WaitGroup
		for g := range 4 {
			wg.Go(func() {
				for i := range 50 {
					if (g+i)%2 == 0 {
						e.m.TriggerController("c")
					} else {
						e.m.UpdateController("c", p)
					}
					time.Sleep(3 * time.Millisecond)
				}
			})
		}
		wg.Wait()
		e.m.RemoveAllAndWait()
		assert.Equal(t, int32(1), maxInside.Load())
		assert.Greater(t, calls.Load(), int32(10))
	})
}

// Rule 7: StopFunc runs once, after DoFunc, with a context that keeps the
// values of params.Context and is not cancelled by the removal; the
// termination channel closes after it.
func TestStopFuncRunsOnceAfterDoFunc(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		type key struct{}
		e := newEnv(t)
		var order []string
		var stopCtx context.Context
		var stopCtxErr error
		parent := context.WithValue(context.Background(), key{}, "v")
		e.m.UpdateController("c", ControllerParams{
			Context: parent,
			DoFunc:  func(ctx context.Context) error { order = append(order, "do"); return nil },
			StopFunc: func(ctx context.Context) error {
				order = append(order, "stop")
				stopCtx, stopCtxErr = ctx, ctx.Err()
				return nil
			},
		})
		synctest.Wait()
		term := e.m.TerminationChannel("c")
		require.NoError(t, e.m.RemoveController("c"))
		<-term
		assert.Equal(t, []string{"do", "stop"}, order)
		assert.Equal(t, "v", stopCtx.Value(key{}))
		assert.NoError(t, stopCtxErr, "not cancelled by the removal while it ran")
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
					assert.Contains(t, e.hook.LastEntry().Data["stack"], "controller_test.go")
				}
			})
		})
	}
}

// Rule 7: a controller whose DoFunc never ran runs no StopFunc.
func TestNoStopFuncWithoutDoFunc(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		stopped := false
		e.m.UpdateController("c", ControllerParams{RunInterval: -1, DoFunc: NoopFunc,
			StopFunc: func(context.Context) error { stopped = true; return nil }})
		require.NoError(t, e.m.RemoveControllerAndWait("c"))
		assert.False(t, stopped)
	})
}

// Rule 8: an update keeps the UUID and the counters; the Group and the other
// fields follow the newest parameters, metrics included.
func TestUpdateKeepsIdentityAndCounters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		c := e.m.UpdateController("c", ControllerParams{DoFunc: NoopFunc, Group: NewGroup("old")})
		synctest.Wait()
		id := c.UUID()
		c2 := e.m.UpdateController("c", ControllerParams{DoFunc: NoopFunc, Group: NewGroup("new"), RunInterval: time.Minute})
		synctest.Wait()
		assert.Same(t, c, c2)
		assert.Equal(t, id, c2.UUID())
		assert.Equal(t, 2, c.GetSuccessCount())
		cfg := c.GetStatusModel().Configuration
		assert.Equal(t, "new", cfg.Group)
		assert.Equal(t, Duration(time.Minute), cfg.Interval)
		assert.Equal(t, 1.0, testutil.ToFloat64(e.metrics.groupRuns.WithLabelValues("old", success)))
		assert.Equal(t, 1.0, testutil.ToFloat64(e.metrics.groupRuns.WithLabelValues("new", success)))
		e.m.RemoveAllAndWait()
	})
}

// No Error log on updates of a controller without a group (a Cilium bug),
// and only one Warn for a steady failure streak.
func TestNoLogSpam(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
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
}

func TestWarnOnChangedErrorWithinStreak(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
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
}

// Logging: every controller's entry carries subsys, name and uuid; Debug
// logs every run with its duration and outcome.
func TestLogFieldsAndDebug(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		e.logger.SetLevel(logrus.DebugLevel)
		r := newRecorder(errBoom, nil)
		r.took = 250 * time.Millisecond
		c := e.m.UpdateController("c", ControllerParams{DoFunc: r.do})
		time.Sleep(2 * time.Second)
		e.m.RemoveAllAndWait()
		var debug []*logrus.Entry
		for _, en := range e.hook.AllEntries() {
			assert.Equal(t, "controller", en.Data["subsys"])
			assert.Equal(t, "c", en.Data["name"])
			assert.Equal(t, c.UUID(), en.Data["uuid"])
			if en.Level == logrus.DebugLevel {
				debug = append(debug, en)
			}
		}
		require.Len(t, debug, 2)
		assert.Equal(t, "failure", debug[0].Data["outcome"])
		assert.Equal(t, 250*time.Millisecond, debug[0].Data["duration"])
		assert.Equal(t, "success", debug[1].Data["outcome"])
	})
}

// HealthReporter: told after every run; a panicking one is recovered and
// the controller goes on.
func TestHealthReporter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
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
}

type panickingReporter struct{}

func (panickingReporter) OK(string)              { panic("ok") }
func (panickingReporter) Degraded(string, error) { panic("degraded") }

// ExitReason is recognised with errors.As semantics: wrapped, joined, or
// through a custom As; a plain error is not one.
func TestIsExitReason(t *testing.T) {
	er := NewExitReason("done")
	assert.True(t, isExitReason(er))
	assert.True(t, isExitReason(fmt.Errorf("x: %w", er)))
	assert.True(t, isExitReason(errors.Join(errBoom, er)))
	assert.False(t, isExitReason(errBoom))
	assert.False(t, isExitReason(fmt.Errorf("x: %w", errBoom)))
	assert.Equal(t, "exit reason", ExitReason{}.Error())
	assert.Equal(t, "done", er.Error())
	assert.NotNil(t, errors.Unwrap(er))
}

func TestUUIDsAreUniqueVersion4(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		var b [36]byte
		newUUID(&b)
		id := string(b[:])
		require.Len(t, id, 36)
		require.Equal(t, byte('4'), id[14], id)
		require.Contains(t, "89ab", string(id[19]), id)
		require.False(t, seen[id])
		seen[id] = true
	}
	var b [36]byte
	newUUID(&b)
	assert.Equal(t, 4, strings.Count(string(b[:]), "-"))
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

// An update with invalid parameters is still an update: it cancels a
// running DoFunc started with CancelDoFuncOnUpdate.
func TestInvalidUpdateCancelsWithCancelDoFuncOnUpdate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		b := newBlocker()
		e.m.UpdateController("c", ControllerParams{DoFunc: b.fn(0), CancelDoFuncOnUpdate: true})
		synctest.Wait()
		e.m.UpdateController("c", ControllerParams{DoFunc: b.fn(1), Jitter: -1})
		synctest.Wait()
		_, cancelled := b.counts()
		assert.Equal(t, 1, cancelled)
		close(b.release)
		e.m.RemoveAllAndWait()
	})
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

// Rule 7: the StopFunc context keeps params.Context's values and is not
// cancelled, even when params.Context itself has ended.
func TestStopFuncContextOutlivesEndedParamsContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		type key struct{}
		e := newEnv(t)
		parent, cancel := context.WithCancel(context.WithValue(context.Background(), key{}, "v"))
		var stopErr error
		var stopVal any
		e.m.UpdateController("c", ControllerParams{Context: parent, DoFunc: NoopFunc,
			StopFunc: func(ctx context.Context) error { stopErr, stopVal = ctx.Err(), ctx.Value(key{}); return nil }})
		synctest.Wait()
		cancel()
		require.NoError(t, e.m.RemoveControllerAndWait("c"))
		assert.NoError(t, stopErr)
		assert.Equal(t, "v", stopVal)
	})
}

// Rule 7: when a Shutdown deadline passes while DoFunc still runs, the
// StopFunc that runs later gets a context that is already cancelled.
func TestStopFuncAfterShutdownDeadlineIsCancelled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		stuck := make(chan struct{})
		var stopErr error
		e.m.UpdateController("c", ControllerParams{
			DoFunc:   func(context.Context) error { <-stuck; return nil },
			StopFunc: func(ctx context.Context) error { stopErr = ctx.Err(); return nil },
		})
		synctest.Wait()
		ctx, cancelCtx := context.WithTimeout(context.Background(), time.Second)
		defer cancelCtx()
		assert.ErrorIs(t, e.m.Shutdown(ctx), context.DeadlineExceeded)
		close(stuck)
		e.m.RemoveAllAndWait()
		assert.ErrorIs(t, stopErr, context.Canceled)
	})
}

// Without params.Context, DoFunc's context behaves as a context.WithCancel
// of Background would: no deadline or values, cancelled on removal, and
// children, AfterFunc and Cause work, whether Done was asked before the
// cancellation or not.
func TestRunContextWithoutParent(t *testing.T) {
	for _, doneFirst := range []bool{true, false} {
		t.Run(fmt.Sprintf("Done asked first: %v", doneFirst), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				type key struct{}
				e := newEnv(t)
				var ctx, child context.Context
				var cancelChild context.CancelFunc
				var afterRan atomic.Bool
				e.m.UpdateController("c", ControllerParams{DoFunc: func(c context.Context) error {
					ctx = c
					if doneFirst {
						child, cancelChild = context.WithCancel(c)
						context.AfterFunc(c, func() { afterRan.Store(true) })
					}
					return nil
				}})
				synctest.Wait()
				require.NotNil(t, ctx)
				assert.NoError(t, ctx.Err())
				_, has := ctx.Deadline()
				assert.False(t, has)
				assert.Nil(t, ctx.Value(key{}))
				assert.Equal(t, "controller.runContext", fmt.Sprint(ctx))
				require.NoError(t, e.m.RemoveControllerAndWait("c"))

				assert.ErrorIs(t, ctx.Err(), context.Canceled)
				assert.ErrorIs(t, context.Cause(ctx), context.Canceled)
				select {
				case <-ctx.Done():
				default:
					t.Fatal("Done is not closed after removal")
				}
				if doneFirst {
					assert.ErrorIs(t, child.Err(), context.Canceled, "the child was cancelled with its parent")
					cancelChild()
					synctest.Wait()
					assert.True(t, afterRan.Load())
				}
			})
		})
	}
}

// A child derived from DoFunc's context costs no goroutine: the context
// package attaches it directly.
func TestRunContextChildrenStartNoGoroutine(t *testing.T) {
	m := benchManager(t)
	var before, after int
	done := make(chan struct{})
	m.UpdateController("c", ControllerParams{DoFunc: func(ctx context.Context) error {
		before = runtime.NumGoroutine()
		child, cancel := context.WithTimeout(ctx, time.Hour)
		after = runtime.NumGoroutine()
		cancel()
		<-child.Done()
		close(done)
		return nil
	}})
	<-done
	m.RemoveAllAndWait()
	assert.Equal(t, before, after)
}

// A run context replaced after CancelDoFuncOnUpdate is a new one: the
// cancelled one stays cancelled.
func TestRunContextReplacedAfterCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		b := newBlocker()
		e.m.UpdateController("c", ControllerParams{DoFunc: b.fn(0), CancelDoFuncOnUpdate: true})
		synctest.Wait()
		var second context.Context
		e.m.UpdateController("c", ControllerParams{DoFunc: func(ctx context.Context) error { second = ctx; return nil }})
		synctest.Wait()
		require.NotNil(t, second)
		assert.NoError(t, second.Err())
		e.m.RemoveAllAndWait()
		assert.ErrorIs(t, second.Err(), context.Canceled)
	})
}

// A removal that races with the loop claiming a timed run is never lost.
// (Writers once read the state and stored it back with their bit, undoing
// a claim made in between; the loop then waited for a signal that had gone
// to the timer, and the removal never finished. A regression hangs here
// until the test binary's -timeout.)
func TestRemovalRacingATimedRunIsNotLost(t *testing.T) {
	m := benchManager(t)
	for range 3000 {
		cd := newCountdown(20)
		c := m.UpdateController("c", ControllerParams{DoFunc: cd.do, RunInterval: time.Nanosecond})
		<-cd.done
		term := c.terminationChannel()
		require.NoError(t, m.RemoveController("c"))
		<-term
	}
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
	for _, interval := range []time.Duration{0, time.Hour} {
		t.Run("RunInterval "+interval.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newEnv(t)
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
}

// A controller parked on invalid parameters since its creation does not run
// when a valid update and its removal reach it together: removal wins
// (rule 5); only a controller removed before its goroutine started makes
// its first run (rule 1). No DoFunc, so no StopFunc.
//
// "Together" means the loop sees both when it next looks. The loop takes
// the controller's mu, not the Manager's, so the test applies the update
// under c.mu without waking the loop (update is setParamsLocked plus a
// wake), and lets the removal's wake be the one that reaches it.
func TestRemovalWinsOverTheFirstValidUpdate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		var runs, stops int
		do := func(ctx context.Context) error { runs++; return nil }
		stop := func(context.Context) error { stops++; return nil }
		c := e.m.UpdateController("c", ControllerParams{DoFunc: do, StopFunc: stop, RunInterval: -1})
		synctest.Wait() // the goroutine started and parked, waiting for a signal
		c.mu.Lock()
		c.setParamsLocked(ControllerParams{DoFunc: do, StopFunc: stop}, nil, e.metrics.group(""))
		c.mu.Unlock()
		e.m.mu.Lock()
		e.m.removeLocked(c) // wakes the loop, which finds the update and the removal
		e.m.mu.Unlock()
		<-c.terminationChannel()
		assert.Zero(t, runs)
		assert.Zero(t, stops)
	})
}

// The run context keeps the context contract "if Done is not yet closed,
// Err returns nil" while it is being cancelled: between its flag and the
// closing of the channel Done returned. The test stops it in that state.
func TestRunContextErrNotBeforeDone(t *testing.T) {
	rc := &runContext{}
	done := rc.Done()
	rc.cancelled.Store(true) // cancel has set its flag, not yet closed the channel
	select {
	case <-done:
		t.Fatal("Done closed")
	default:
	}
	assert.NoError(t, rc.Err())
	rc.cancel()
	<-done
	assert.ErrorIs(t, rc.Err(), context.Canceled)
}
