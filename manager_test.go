// Tests of the Manager's operations: install, update, trigger, remove,
// Shutdown, TerminationChannel, the status model.

package controller

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Invalid parameters install a visible, parked controller: one failure with
// the validation error, one Error log, Health.Degraded, counted as failing,
// no run; an update with valid parameters runs it.
func TestInvalidParamsInstallAParkedController(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		h := &healthLog{}
		r := newRecorder()
		c := e.m.UpdateController("c", ControllerParams{DoFunc: r.do, Health: h, RunInterval: -time.Second})
		require.NotNil(t, c)
		st := c.GetStatusModel().Status // recorded before UpdateController returns
		assert.Equal(t, int64(1), st.FailureCount)
		assert.Equal(t, int64(1), st.ConsecutiveFailureCount)
		assert.Equal(t, "invalid controller parameters: RunInterval must not be negative, got -1s", st.LastFailureMsg)
		assert.ErrorIs(t, c.GetLastError(), ErrInvalidParams)
		synctest.Wait() // the log and the HealthReporter come from the controller's goroutine
		assert.Equal(t, []string{"invalid controller parameters; DoFunc will not run until an update brings valid ones"}, e.logs(logrus.ErrorLevel))
		assert.Equal(t, []string{"degraded c: invalid controller parameters: RunInterval must not be negative, got -1s"}, h.all())
		assert.Equal(t, 1.0, testutil.ToFloat64(e.metrics.failing))
		assert.Equal(t, 1.0, testutil.ToFloat64(e.metrics.active))
		assert.ErrorContains(t, e.m.Health(), `controller "c": 1 consecutive failure: invalid controller parameters`)

		time.Sleep(time.Hour)
		assert.True(t, e.m.TriggerController("c"))
		synctest.Wait()
		assert.Zero(t, r.count(), "no run, no retry, no busy loop")
		assert.Equal(t, 0.0, e.metrics.runsTotal(runSuccess)+e.metrics.runsTotal(runFailure), "no run counted")

		e.m.UpdateController("c", ControllerParams{DoFunc: r.do, Health: h})
		synctest.Wait()
		assert.Equal(t, 1, r.count())
		assert.Equal(t, 0, c.GetConsecutiveFailureCount())
		assert.Equal(t, 0.0, testutil.ToFloat64(e.metrics.failing))
		assert.NoError(t, e.m.Health())

		e.m.UpdateController("c", ControllerParams{})
		time.Sleep(time.Hour)
		assert.Equal(t, 1, r.count(), "an invalid update parks it again")
		assert.Equal(t, 2, c.GetFailureCount())
		e.m.RemoveAllAndWait()
		assert.Equal(t, 0.0, testutil.ToFloat64(e.metrics.failing))
		assert.Equal(t, 0.0, testutil.ToFloat64(e.metrics.active))
	})
}

// A controller without a name is refused, logged at Error, and never
// installed or counted.
func TestEmptyNameIsRejected(t *testing.T) {
	e := newEnv(t)
	assert.Nil(t, e.m.UpdateController("", ControllerParams{DoFunc: NoopFunc}))
	assert.False(t, e.m.CreateController("", ControllerParams{DoFunc: NoopFunc}))
	assert.Empty(t, e.m.GetStatusModel())
	assert.Equal(t, []string{"refusing to install a controller without a name", "refusing to install a controller without a name"}, e.logs(logrus.ErrorLevel))
	assert.Equal(t, 0.0, testutil.ToFloat64(e.metrics.active))
}

// Operations on a name that is not installed say so: removals return an
// error wrapping ErrControllerNotFound that names it, a trigger returns
// false, Lookup nil, and TerminationChannel a closed channel.
func TestUnknownNames(t *testing.T) {
	e := newEnv(t)
	err := e.m.RemoveController("ghost")
	assert.ErrorIs(t, err, ErrControllerNotFound)
	assert.EqualError(t, err, `controller not found: "ghost"`)
	err = e.m.RemoveControllerAndWait("ghost")
	assert.ErrorIs(t, err, ErrControllerNotFound)
	assert.ErrorContains(t, err, "ghost")
	assert.False(t, e.m.TriggerController("ghost"))
	assert.Nil(t, e.m.Lookup("ghost"))
	select {
	case <-e.m.TerminationChannel("ghost"):
	default:
		t.Fatal("TerminationChannel of an unknown name is not closed")
	}
}

// CreateController installs only a new name: on an installed one it
// returns false and neither updates nor triggers the controller.
func TestCreateControllerDoesNotReplace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		r1, r2 := newRecorder(), newRecorder()
		assert.True(t, e.m.CreateController("c", ControllerParams{DoFunc: r1.do}))
		assert.False(t, e.m.CreateController("c", ControllerParams{DoFunc: r2.do}))
		synctest.Wait()
		assert.Equal(t, 1, r1.count())
		assert.Equal(t, 0, r2.count(), "neither updated nor triggered")
		e.m.RemoveAllAndWait()
	})
}

// A removed name can be installed again at once; the new controller may run
// while the old StopFunc still runs.
func TestReinstallWhileOldStopFuncRuns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		release := make(chan struct{})
		old := e.m.UpdateController("c", ControllerParams{DoFunc: NoopFunc, StopFunc: func(context.Context) error {
			<-release
			return nil
		}})
		synctest.Wait()
		oldTerm := e.m.TerminationChannel("c")
		require.NoError(t, e.m.RemoveController("c"))
		r := newRecorder()
		c := e.m.UpdateController("c", ControllerParams{DoFunc: r.do})
		synctest.Wait()
		assert.Equal(t, 1, r.count(), "the new controller runs while the old one stops")
		assert.NotEqual(t, old.UUID(), c.UUID())
		assert.Equal(t, 2.0, testutil.ToFloat64(e.metrics.active), "a stopping controller is still active")
		select {
		case <-oldTerm:
			t.Fatal("old controller terminated before its StopFunc returned")
		default:
		}
		close(release)
		<-oldTerm
		assert.Equal(t, 1.0, testutil.ToFloat64(e.metrics.active))
		e.m.RemoveAllAndWait()
	})
}

// TerminationChannel of a controller that was removed and is still running
// its StopFunc is closed only once the StopFunc returned; once the name is
// installed again, it is the new controller's channel.
func TestTerminationChannelAfterRemoval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		e.m.UpdateController("t", ControllerParams{DoFunc: NoopFunc, StopFunc: func(context.Context) error {
			time.Sleep(5 * time.Second)
			return nil
		}})
		synctest.Wait()
		start := time.Now()
		require.NoError(t, e.m.RemoveController("t"))
		ch := e.m.TerminationChannel("t")
		select {
		case <-ch:
			t.Fatal("closed while the StopFunc still runs")
		default:
		}
		<-ch
		assert.Equal(t, 5*time.Second, time.Since(start), "closed when the StopFunc returned")

		select {
		case <-e.m.TerminationChannel("t"):
		default:
			t.Fatal("a terminated controller's name gives a closed channel")
		}

		e.m.UpdateController("u", ControllerParams{DoFunc: NoopFunc, StopFunc: func(context.Context) error {
			time.Sleep(time.Second)
			return nil
		}})
		synctest.Wait()
		require.NoError(t, e.m.RemoveController("u"))
		e.m.UpdateController("u", ControllerParams{DoFunc: NoopFunc})
		synctest.Wait()
		select {
		case <-e.m.TerminationChannel("u"):
			t.Fatal("the installed controller's channel, open while it is installed")
		case <-time.After(2 * time.Second):
		}
		e.m.RemoveAllAndWait()
	})
}

// A DoFunc that ignores its context: removal returns at once and nothing
// else blocks.
func TestRemoveDoesNotWaitForAStuckDoFunc(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		stuck := make(chan struct{})
		e.m.UpdateController("stuck", ControllerParams{DoFunc: func(context.Context) error { <-stuck; return nil }})
		synctest.Wait()
		require.NoError(t, e.m.RemoveController("stuck"))
		e.m.UpdateController("other", ControllerParams{DoFunc: NoopFunc})
		assert.Len(t, e.m.GetStatusModel(), 1)
		assert.NoError(t, e.m.Health())
		close(stuck)
		e.m.RemoveAllAndWait()
	})
}

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

// Shutdown bounds the wait: at its deadline it cancels the StopFunc contexts
// and returns an error wrapping ctx.Err() that names what still runs; the
// Manager is closed for installs, and a second Shutdown waits again for
// what still stops.
func TestShutdownDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		stuck := make(chan struct{})
		var stopErr error
		// "stubborn" ignores its context until released; "slow" has a
		// StopFunc that waits for its context.
		e.m.UpdateController("stubborn", ControllerParams{DoFunc: func(context.Context) error { <-stuck; return nil }})
		e.m.UpdateController("slow", ControllerParams{DoFunc: NoopFunc, StopFunc: func(ctx context.Context) error {
			<-ctx.Done()
			stopErr = ctx.Err()
			return nil
		}})
		e.m.UpdateController("quick", ControllerParams{DoFunc: NoopFunc})
		synctest.Wait()

		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		start := time.Now()
		err := e.m.Shutdown(ctx)
		assert.Equal(t, 5*time.Second, time.Since(start))
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.EqualError(t, err, "controller: shutdown: context deadline exceeded; still running: slow, stubborn")
		synctest.Wait()
		assert.ErrorIs(t, stopErr, context.Canceled, "the StopFunc context was cancelled at the deadline")
		assert.Empty(t, e.m.GetStatusModel())

		r := newRecorder()
		assert.Nil(t, e.m.UpdateController("again", ControllerParams{DoFunc: r.do}))
		synctest.Wait()
		assert.Zero(t, r.count(), "a shut down Manager installs nothing")

		ctx2, cancel2 := context.WithTimeout(context.Background(), time.Hour)
		defer cancel2()
		go func() {
			time.Sleep(time.Minute)
			close(stuck)
		}()
		start = time.Now()
		require.NoError(t, e.m.Shutdown(ctx2))
		assert.Equal(t, time.Minute, time.Since(start), "the second Shutdown waits for the stubborn DoFunc")
		assert.Equal(t, 0.0, testutil.ToFloat64(e.metrics.active))
	})
}

// From the moment Shutdown is called, installs are refused: UpdateController
// returns nil and CreateController false, each logged at Warn with the name
// and ErrManagerShutDown, and nothing runs or shows in the statuses. A
// Manager emptied with RemoveAllAndWait stays usable, as in Cilium.
func TestInstallAfterShutdownIsRefused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		reused := newRecorder()
		e.m.UpdateController("c", ControllerParams{DoFunc: NoopFunc})
		e.m.RemoveAllAndWait()
		require.NotNil(t, e.m.UpdateController("c", ControllerParams{DoFunc: reused.do}))
		synctest.Wait()
		assert.Equal(t, 1, reused.count(), "RemoveAllAndWait leaves the Manager usable")

		// A StopFunc that installs, as a late event handler would, while
		// Shutdown waits for it.
		late := newRecorder()
		var installed *Controller
		var created bool
		e.m.UpdateController("owner", ControllerParams{DoFunc: NoopFunc, StopFunc: func(context.Context) error {
			installed = e.m.UpdateController("late-update", ControllerParams{DoFunc: late.do})
			created = e.m.CreateController("late-create", ControllerParams{DoFunc: late.do})
			return nil
		}})
		synctest.Wait()
		require.NoError(t, e.m.Shutdown(context.Background()))
		assert.Nil(t, installed)
		assert.False(t, created)
		assert.Nil(t, e.m.UpdateController("after", ControllerParams{DoFunc: late.do}))
		assert.False(t, e.m.CreateController("after", ControllerParams{DoFunc: late.do}))
		assert.False(t, e.m.TriggerController("after"))
		synctest.Wait()
		assert.Zero(t, late.count())
		assert.Empty(t, e.m.GetStatusModel())
		assert.Empty(t, statusNames(GetGlobalStatus()))
		var refused []string
		for _, en := range e.hook.AllEntries() {
			if en.Level == logrus.WarnLevel {
				assert.ErrorIs(t, en.Data[logrus.ErrorKey].(error), ErrManagerShutDown)
				refused = append(refused, en.Message)
			}
		}
		assert.Equal(t, []string{
			`refusing to install controller "late-update": the Manager was shut down`,
			`refusing to install controller "late-create": the Manager was shut down`,
			`refusing to install controller "after": the Manager was shut down`,
			`refusing to install controller "after": the Manager was shut down`,
		}, refused)
		assert.NoError(t, e.m.Shutdown(context.Background()), "a second Shutdown finds nothing to wait for")
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
		assert.ElementsMatch(t, []string{
			"controller removed 1m0s ago is still stopping: its StopFunc has not returned", // a, an hour ago
			"controller removed 1m0s ago is still stopping: its DoFunc has not returned",   // b, at the deadline
			"StopFunc failed",
		}, e.logs(logrus.WarnLevel))

		close(release)
		<-terminationOf(b)
		assert.ErrorIs(t, lateStopErr, context.Canceled, "a StopFunc that starts after the deadline gets a cancelled context")
		assert.Equal(t, 0.0, testutil.ToFloat64(e.metrics.active))
	})
}

// The zero Manager works, with DefaultMetrics and the standard logger.
func TestZeroManager(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var m Manager
		before := testutil.ToFloat64(DefaultMetrics.active)
		r := newRecorder()
		m.UpdateController("zero", ControllerParams{DoFunc: r.do})
		synctest.Wait()
		assert.Equal(t, 1, r.count())
		assert.Equal(t, before+1, testutil.ToFloat64(DefaultMetrics.active))
		m.RemoveAllAndWait()
		assert.Equal(t, before, testutil.ToFloat64(DefaultMetrics.active))
	})
}

// GetStatusModel lists the controllers sorted by name, whatever the order
// they were installed in.
func TestStatusModelIsSortedByName(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		for _, n := range []string{"m", "b", "z", "a"} {
			e.m.UpdateController(n, ControllerParams{DoFunc: NoopFunc})
		}
		var names []string
		for _, s := range e.m.GetStatusModel() {
			names = append(names, s.Name)
		}
		assert.Equal(t, []string{"a", "b", "m", "z"}, names)
		e.m.RemoveAll()
		e.m.RemoveAllAndWait()
	})
}

// The names and UUIDs GetStatusModel lists are the installed controllers'
// also after controllers came and went between two reads: the UUID text it
// keeps from one read to the next is rebuilt when they change.
func TestStatusModelFollowsInstallsAndRemovals(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		installed := func() []string {
			var got []string
			for _, s := range e.m.GetStatusModel() {
				got = append(got, s.Name+" "+s.UUID)
			}
			return got
		}
		id := func(name string) string { return name + " " + e.m.Lookup(name).UUID() }
		for _, n := range []string{"b", "c"} {
			e.m.UpdateController(n, ControllerParams{DoFunc: NoopFunc})
		}
		assert.Equal(t, []string{id("b"), id("c")}, installed())
		assert.Equal(t, []string{id("b"), id("c")}, installed(), "a second read of an unchanged Manager")

		e.m.UpdateController("a", ControllerParams{DoFunc: NoopFunc})
		assert.Equal(t, []string{id("a"), id("b"), id("c")}, installed(), "after an install")

		old := id("b")
		require.NoError(t, e.m.RemoveController("b"))
		assert.Equal(t, []string{id("a"), id("c")}, installed(), "after a removal")
		e.m.UpdateController("b", ControllerParams{DoFunc: NoopFunc})
		assert.NotEqual(t, old, id("b"), "installed again, b is a new controller")
		assert.Equal(t, []string{id("a"), id("b"), id("c")}, installed(), "after b was installed again")

		e.m.RemoveAllAndWait()
		assert.Empty(t, installed())
		e.m.UpdateController("d", ControllerParams{DoFunc: NoopFunc})
		assert.Equal(t, []string{id("d")}, installed(), "after RemoveAllAndWait and an install")
		e.m.RemoveAllAndWait()
	})
}

// A Manager does not keep terminated controllers reachable, however often
// it removes them without waiting for them.
func TestRemovedControllersAreReleased(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		for range 50 {
			for i := range 10 {
				e.m.UpdateController(fmt.Sprintf("c%d", i), ControllerParams{DoFunc: NoopFunc})
			}
			synctest.Wait()
			e.m.RemoveAll()
			synctest.Wait()
		}
		e.m.mu.Lock()
		held := len(e.m.stopping)
		e.m.mu.Unlock()
		assert.LessOrEqual(t, held, 10, "terminated controllers still referenced")
		e.m.RemoveAllAndWait()
		assert.Nil(t, e.m.stopping)
	})
}

// WithJitterSource makes jittered waits reproducible: the same schedule
// under the same source gives the same run times, run after run, and a
// different source gives different ones (so the jitter is really drawn
// from it).
func TestJitterSourceMakesWaitsReproducible(t *testing.T) {
	runTimes := func(seed uint64) []time.Duration {
		var times []time.Duration
		synctest.Test(t, func(t *testing.T) {
			m := NewManager(WithLogger(quietLogger()), WithMetrics(nil), WithJitterSource(rand.NewPCG(seed, 1)))
			r := newRecorder(errBoom, errBoom, nil)
			m.UpdateController("c", ControllerParams{DoFunc: r.do, RunInterval: time.Second, Jitter: 500 * time.Millisecond})
			time.Sleep(10 * time.Second)
			m.RemoveAllAndWait()
			times = r.times()
		})
		return times
	}
	first := runTimes(1)
	require.Greater(t, len(first), 5)
	assert.Zero(t, first[0], "jitter never delays the first run")
	for i := 1; i < len(first); i++ {
		wait := first[i] - first[i-1]
		assert.GreaterOrEqual(t, wait, time.Second, "wait %d", i)
		assert.Less(t, wait, 3*time.Second+500*time.Millisecond, "wait %d", i)
	}
	assert.Equal(t, first, runTimes(1), "the same source gives the same times")
	assert.NotEqual(t, first, runTimes(2), "another source gives other times")
}
