// Tests of the run loop: the first run, waiting and coalescing signals,
// removal winning, no overlap, parking, and the StopFunc.

package controller

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
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

// Rule 3, the timeout: with a RunTimeout, DoFunc's context ends when the
// run has lasted that long, and such a run is a failure wrapping
// ErrRunTimeout and what DoFunc returned, whatever that was, counted in
// controllers_run_timeouts_total; a removal during the run still counts
// as a cancellation. Without one, a run has no deadline.
func TestRunTimeout(t *testing.T) {
	cases := []struct {
		name      string
		do        func(ctx context.Context) error
		remove    time.Duration // remove the controller at this time; 0: never
		wantMsg   string
		wantTook  time.Duration
		wantCount float64
	}{
		{"DoFunc returns its context's error", func(ctx context.Context) error {
			<-ctx.Done()
			return ctx.Err()
		}, 0, "run timed out: DoFunc ran for its RunTimeout of 5s: context deadline exceeded", 5 * time.Second, 1},
		{"DoFunc ignores its context and returns nil", func(ctx context.Context) error {
			time.Sleep(7 * time.Second)
			return nil
		}, 0, "run timed out: DoFunc ran for its RunTimeout of 5s", 7 * time.Second, 1},
		{"a removal cancels the run first", func(ctx context.Context) error {
			time.Sleep(6 * time.Second)
			return ctx.Err()
		}, 2 * time.Second, "controller context canceled", 6 * time.Second, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newEnv(t)
				var deadline atomic.Pointer[time.Time]
				c := e.m.UpdateController("c", ControllerParams{RunTimeout: 5 * time.Second, NoErrorRetry: true, Group: NewGroup("g"),
					DoFunc: func(ctx context.Context) error {
						d, _ := ctx.Deadline()
						deadline.Store(&d)
						return tc.do(ctx)
					}})
				start := time.Now()
				if tc.remove > 0 {
					time.Sleep(tc.remove)
					require.NoError(t, e.m.RemoveController("c"))
				}
				time.Sleep(10 * time.Second)
				assert.Equal(t, start.Add(5*time.Second), *deadline.Load())
				assert.Equal(t, tc.wantMsg, c.GetStatusModel().Status.LastFailureMsg)
				assert.Equal(t, Duration(tc.wantTook), c.GetStatusModel().Status.LastRunDuration)
				assert.Equal(t, tc.wantCount, testutil.ToFloat64(e.metrics.timeouts.WithLabelValues("g")))
				if tc.wantCount > 0 {
					assert.ErrorIs(t, c.GetLastError(), ErrRunTimeout)
					var te *RunTimeoutError
					require.ErrorAs(t, c.GetLastError(), &te)
					assert.Equal(t, 5*time.Second, te.Timeout)
					assert.Equal(t, 1, c.GetFailureCount())
					assert.Equal(t, 1.0, testutil.ToFloat64(e.metrics.failing))
					assert.Equal(t, []string{"controller failed; retrying"}, e.logs(logrus.WarnLevel))
				}
				e.m.RemoveAllAndWait()
			})
		})
	}
}

// Rule 2 without a RunTimeout: the run context has no deadline, and it is
// the same context from run to run.
func TestNoRunTimeoutNoDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		r := newRecorder()
		e.m.UpdateController("c", ControllerParams{DoFunc: r.do, RunInterval: time.Second})
		time.Sleep(1500 * time.Millisecond)
		r.mu.Lock()
		ctxs := r.ctxs
		r.mu.Unlock()
		require.Len(t, ctxs, 2)
		_, has := ctxs[0].Deadline()
		assert.False(t, has)
		assert.Same(t, ctxs[0], ctxs[1])
		e.m.RemoveAllAndWait()
	})
}

// A timed run, which the loop claims without the lock, shows the moment
// it was due as its start: after a failure at 0s, the retry due at 1s
// hangs, and the status says it has run since 1s; then a success and a
// run due RunInterval later do the same.
func TestStatusShowsTheRunningTimedRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		start := time.Now()
		release := make(chan struct{})
		calls := 0
		c := e.m.UpdateController("c", ControllerParams{
			RunInterval: 10 * time.Second,
			DoFunc: func(context.Context) error {
				calls++
				switch calls {
				case 1:
					return errBoom // retried at 1s
				case 2, 3:
					<-release // the retry at 1s, then the interval run at 1h+10s
				}
				return nil
			},
		})
		time.Sleep(time.Hour)
		assert.Equal(t, new(start.Add(time.Second).UTC()), c.GetStatusModel().Status.RunningSince, "the retry was due at 1s")
		release <- struct{}{} // the retry succeeds at 1h
		time.Sleep(5 * time.Second)
		synctest.Wait()
		assert.Nil(t, c.GetStatusModel().Status.RunningSince, "waiting for the interval, nothing runs")
		time.Sleep(time.Minute)
		assert.Equal(t, new(start.Add(time.Hour+10*time.Second).UTC()), c.GetStatusModel().Status.RunningSince, "due RunInterval after the success")
		close(release)
		e.m.RemoveAllAndWait()
	})
}

// While DoFunc runs, the status says since when, and FormatStatus for how
// long; the field is left out of the JSON once the run ended.
func TestStatusShowsTheRunningDoFunc(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		b := newBlocker()
		c := e.m.UpdateController("hung", ControllerParams{DoFunc: b.fn(0)})
		start := time.Now()
		time.Sleep(time.Hour + 5*time.Second)
		assert.Equal(t, new(start.UTC()), c.GetStatusModel().Status.RunningSince)
		var buf bytes.Buffer
		require.NoError(t, FormatStatus(&buf, e.m.GetStatusModel(), true))
		assert.Contains(t, buf.String(), "hung   never          never        0       [running 1h0m5s] no error\n")
		close(b.release)
		synctest.Wait()
		assert.Nil(t, c.GetStatusModel().Status.RunningSince)
		js, err := json.Marshal(c.GetStatusModel())
		require.NoError(t, err)
		assert.NotContains(t, string(js), "running-since")
		e.m.RemoveAllAndWait()
	})
}

// Rule 4 under Go's old timer semantics: with GODEBUG=asynctimerchan=1 a
// timer's channel is buffered and a tick may still be on its way after
// Stop says the timer expired, so the tick of a timer that an update
// fired may land after the loop drained it, and cut the next timed wait
// short. The storm updates controllers near their timers' due time and
// checks that no timed run starts less than RunInterval after the
// previous run of the same parameters ended; it runs with the default
// timers, then in a child process with asynctimerchan=1.
func TestTimedRunNotCutShortByAStaleTick(t *testing.T) {
	const storm = 3 * time.Second
	if os.Getenv("BGCTL_HOSTILE_CHILD") == "1" {
		require.Equal(t, 1, cap(time.NewTimer(time.Hour).C), "the child runs with asynctimerchan=1: a timer's channel is buffered")
		assert.Empty(t, staleTickStorm(storm))
		return
	}
	assert.Empty(t, staleTickStorm(storm/3), "with the default timers")
	runInChild(t, t.Name(), "GODEBUG=asynctimerchan=1")
}

// staleTickStorm runs controllers with a RunInterval of 5 ms for d, while
// 16 goroutines update them near their timers' due time, and returns the
// timed runs that came early. Each update brings a DoFunc of its own, so
// that runs are judged against the previous run of the same parameters:
// the run an update makes at once is not a timed run, and neither is one
// the loop had committed to before the update.
func staleTickStorm(d time.Duration) (early []string) {
	const interval = 5 * time.Millisecond
	m := NewManager(WithLogger(quietLogger()), WithMetrics(nil))
	type tracker struct {
		mu      sync.Mutex
		gen     int       // of the parameters of the last run
		lastEnd time.Time // when the last run returned
		next    int       // the generation the next update brings
	}
	var mu sync.Mutex // guards early
	ts := make([]*tracker, 64)
	params := func(name string, tr *tracker) ControllerParams {
		tr.next++
		gen := tr.next
		return ControllerParams{RunInterval: interval, DoFunc: func(context.Context) error {
			start := time.Now()
			tr.mu.Lock()
			if tr.gen == gen && !tr.lastEnd.IsZero() {
				if gap := start.Sub(tr.lastEnd); gap < interval {
					mu.Lock()
					early = append(early, fmt.Sprintf("%s: a timed run %v after the previous one, under RunInterval %v", name, gap, interval))
					mu.Unlock()
				}
			}
			tr.gen = gen
			tr.mu.Unlock()
			defer func() {
				tr.mu.Lock()
				tr.lastEnd = time.Now()
				tr.mu.Unlock()
			}()
			return nil
		}}
	}
	for i := range ts {
		ts[i] = &tracker{}
		ts[i].mu.Lock()
		p := params(fmt.Sprint(i), ts[i])
		ts[i].mu.Unlock()
		m.UpdateController(fmt.Sprint(i), p)
	}
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() { // joined below
			for time.Now().Before(deadline) {
				i := rand.IntN(len(ts))
				tr := ts[i]
				tr.mu.Lock()
				due := tr.lastEnd.Add(interval)
				tr.mu.Unlock()
				// Around the due time: a little before, or just after.
				time.Sleep(time.Until(due.Add(time.Duration(rand.Int64N(int64(1500*time.Microsecond))) - time.Millisecond)))
				tr.mu.Lock()
				p := params(fmt.Sprint(i), tr)
				tr.mu.Unlock()
				m.UpdateController(fmt.Sprint(i), p)
			}
		})
	}
	wg.Wait()
	m.RemoveAllAndWait()
	mu.Lock()
	defer mu.Unlock()
	return early
}
