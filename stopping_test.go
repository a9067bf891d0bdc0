// Tests of the stopping view and the warning about slow stops.

package controller

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"strconv"
	"testing"
	"testing/synctest"
	"time"
	"weak"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A removed controller whose DoFunc ignores its context leaves the
// installed statuses at once but is listed as stopping, in its Manager and
// globally, with its removal time and its running DoFunc; it is logged at
// Warn once, a minute after its removal, naming the DoFunc; it leaves the
// list, and its Manager the registry, when it terminates.
func TestStoppingListsARemovedDoFuncThatIgnoresItsContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		never := make(chan struct{})
		e.m.UpdateController("stuck", ControllerParams{DoFunc: func(context.Context) error { <-never; return nil }})
		e.m.UpdateController("other", ControllerParams{DoFunc: NoopFunc})
		synctest.Wait()
		started := time.Now()
		time.Sleep(time.Second)
		removed := time.Now()
		require.NoError(t, e.m.RemoveController("stuck"))

		assert.Equal(t, []string{"other"}, statusNames(e.m.GetStatusModel()), "GetStatusModel keeps Cilium's meaning: installed controllers")
		st := e.m.GetStoppingStatus()
		require.Len(t, st, 1)
		assert.Equal(t, "stuck", st[0].Name)
		assert.Equal(t, new(removed.UTC()), st[0].Status.RemovedTimestamp)
		assert.Equal(t, new(started.UTC()), st[0].Status.RunningSince, "its DoFunc still runs")
		assert.Contains(t, statusNames(GetGlobalStoppingStatus()), "stuck")

		time.Sleep(time.Minute - time.Nanosecond)
		assert.Empty(t, e.logs(logrus.WarnLevel), "not before the threshold")
		time.Sleep(time.Nanosecond)
		synctest.Wait()
		assert.Equal(t, []string{"controller removed 1m0s ago is still stopping: its DoFunc has not returned"}, e.logs(logrus.WarnLevel))
		time.Sleep(time.Hour)
		assert.Len(t, e.logs(logrus.WarnLevel), 1, "once")

		require.NoError(t, e.m.RemoveController("other"))
		close(never)
		synctest.Wait()
		assert.Empty(t, e.m.GetStoppingStatus())
		assert.NotContains(t, statusNames(GetGlobalStoppingStatus()), "stuck")
		registry.mu.Lock()
		_, registered := registry.managers[e.m]
		registry.mu.Unlock()
		assert.False(t, registered, "a Manager with nothing installed or stopping leaves the registry")
	})
}

// A StopFunc that blocks past a Shutdown deadline: the Shutdown error names
// it, and it stays listed as stopping (no DoFunc running) until it returns;
// the warning follows the Manager's threshold, names the StopFunc, and can
// be turned off.
func TestStoppingListsAStopFuncPastAShutdownDeadline(t *testing.T) {
	for _, tc := range []struct {
		name     string
		opt      Option
		wantWarn []string
	}{
		{"threshold of 10s", WithSlowStopWarning(10 * time.Second), []string{"controller removed 10s ago is still stopping: its StopFunc has not returned"}},
		{"warning off", WithSlowStopWarning(-1), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newEnv(t)
				tc.opt(e.m)
				release := make(chan struct{})
				e.m.UpdateController("slow", ControllerParams{DoFunc: NoopFunc, StopFunc: func(context.Context) error {
					<-release // ignores its context
					return nil
				}})
				synctest.Wait()
				removed := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				assert.EqualError(t, e.m.Shutdown(ctx), "controller: shutdown: context deadline exceeded; still running: slow")

				time.Sleep(time.Hour)
				assert.Empty(t, e.m.GetStatusModel())
				st := e.m.GetStoppingStatus()
				require.Len(t, st, 1, "still listed an hour after the deadline")
				assert.Equal(t, new(removed.UTC()), st[0].Status.RemovedTimestamp)
				assert.Nil(t, st[0].Status.RunningSince, "no DoFunc runs: the StopFunc does")
				assert.Equal(t, tc.wantWarn, e.logs(logrus.WarnLevel))

				close(release)
				require.NoError(t, e.m.Shutdown(context.Background()))
				assert.Empty(t, e.m.GetStoppingStatus())
			})
		})
	}
}

// One timer watches every removal of a Manager: removals a while apart are
// each warned about at their own threshold, those that stopped in time
// never.
func TestSlowStopWarningsFollowEachRemoval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		hold := func(d time.Duration) ControllerFunc {
			return func(context.Context) error { time.Sleep(d); return nil }
		}
		e.m.UpdateController("a", ControllerParams{DoFunc: NoopFunc, StopFunc: hold(2 * time.Minute)})
		e.m.UpdateController("b", ControllerParams{DoFunc: NoopFunc, StopFunc: hold(30 * time.Second)})
		e.m.UpdateController("c", ControllerParams{DoFunc: NoopFunc, StopFunc: hold(2 * time.Minute)})
		synctest.Wait()
		require.NoError(t, e.m.RemoveController("a"))
		time.Sleep(20 * time.Second)
		require.NoError(t, e.m.RemoveController("b"))
		time.Sleep(20 * time.Second)
		require.NoError(t, e.m.RemoveController("c"))

		start := time.Now().Add(-40 * time.Second) // a's removal
		for _, step := range []struct {
			at   time.Duration // since a's removal
			want int
		}{
			{59 * time.Second, 0},
			{time.Minute, 1},       // a
			{99 * time.Second, 1},  // b stopped at 50s
			{100 * time.Second, 2}, // c, removed at 40s
			{3 * time.Minute, 2},   // each once
		} {
			time.Sleep(time.Until(start.Add(step.at)))
			synctest.Wait()
			assert.Len(t, e.logs(logrus.WarnLevel), step.want, "at %v", step.at)
		}
		e.m.RemoveAllAndWait()
	})
}

// An owner that embeds a Manager is garbage once its controllers have
// stopped: the slow-stop watch, armed by the removal, holds the Manager
// weakly, so it does not keep the owner for the minute it waits.
// Collection is observed through a weak pointer, which runtime.GC clears
// before it returns, once synctest.Wait has seen the controller's
// goroutine return.
func TestStoppedManagerCanBeCollected(t *testing.T) {
	type owner struct {
		Manager
		_ [1 << 10]byte // the owner's own state, which its garbage frees too
	}
	for _, remove := range []struct {
		name string
		do   func(*Manager)
	}{
		{"RemoveAllAndWait", (*Manager).RemoveAllAndWait},
		{"RemoveControllerAndWait", func(m *Manager) { require.NoError(t, m.RemoveControllerAndWait("c")) }},
		{"Shutdown", func(m *Manager) { require.NoError(t, m.Shutdown(context.Background())) }},
	} {
		t.Run(remove.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				wp := func() weak.Pointer[owner] {
					o := &owner{}
					o.UpdateController("c", ControllerParams{DoFunc: NoopFunc})
					remove.do(&o.Manager)
					return weak.Make(o)
				}()
				synctest.Wait()
				runtime.GC()
				assert.Nil(t, wp.Value(), "the owner of a Manager whose controllers have all stopped is still reachable")
			})
		})
	}
}

// The slow-stop watch is disarmed as soon as nothing is stopping: a
// pending timer would slow every goroutine wake-up in the process
// (BenchmarkTrigger) for the minute it waits.
func TestSlowStopWatchEndsWithTheLastStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		armed := func() bool {
			e.m.mu.Lock()
			defer e.m.mu.Unlock()
			return e.m.watchArmed
		}
		release := make(chan struct{})
		e.m.UpdateController("slow", ControllerParams{DoFunc: func(context.Context) error { <-release; return nil }})
		e.m.UpdateController("quick", ControllerParams{DoFunc: NoopFunc})
		synctest.Wait()
		require.NoError(t, e.m.RemoveController("quick"))
		synctest.Wait()
		assert.False(t, armed(), "armed after the only removed controller stopped")

		require.NoError(t, e.m.RemoveController("slow"))
		synctest.Wait()
		assert.True(t, armed(), "not armed while a removed controller is stopping")
		close(release)
		synctest.Wait()
		assert.False(t, armed(), "armed after the last removed controller stopped")
	})
}

// The watch's weak hold does not lose a Manager that is still needed: an
// owner dropped by the program while its removed controller keeps
// running is kept alive by that controller, and the warning comes.
func TestSlowStopWarningOfADroppedOwner(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		type owner struct{ Manager }
		e := newEnv(t) // for its logger and logs; the owner has a Manager of its own
		never := make(chan struct{})
		func() {
			o := &owner{}
			WithLogger(e.logger)(&o.Manager)
			o.UpdateController("stuck", ControllerParams{DoFunc: func(context.Context) error { <-never; return nil }})
			synctest.Wait()
			require.NoError(t, o.RemoveController("stuck"))
		}()
		runtime.GC()
		time.Sleep(time.Minute)
		synctest.Wait()
		assert.Equal(t, []string{"controller removed 1m0s ago is still stopping: its DoFunc has not returned"}, e.logs(logrus.WarnLevel))
		close(never)
	})
}

// TerminationChannel costs a map lookup, however many controllers are
// stopping: a replica that lost its lease asks it for each of 100,000
// names while as many stop, and a scan of the stopping list per call made
// that quadratic. The cost per call is measured with 1,000 and with 8,000
// controllers stopping, for names that are neither installed nor stopping
// (the most a scan costs), the best of three rounds each; the ratio of
// the two is ~1 for a lookup and ~8 for a scan.
func TestTerminationChannelCostsTheSameAtAnyScale(t *testing.T) {
	perCall := func(n int) time.Duration {
		m := benchManager(t)
		started := newCountdown(n)
		release := make(chan struct{})
		for _, name := range names(n) {
			m.UpdateController(name, ControllerParams{DoFunc: func(ctx context.Context) error {
				_ = started.do(ctx)
				<-release // ignores its context: stays stopping after the removal
				return nil
			}})
		}
		<-started.done
		m.RemoveAll()
		absent := make([]string, n)
		for i := range absent {
			absent[i] = "absent-" + strconv.Itoa(i)
		}
		best := time.Duration(math.MaxInt64)
		for range 3 {
			start := time.Now()
			for _, name := range absent {
				<-m.TerminationChannel(name) // closed: none under that name
			}
			best = min(best, time.Since(start)/time.Duration(n))
		}
		close(release)
		m.RemoveAllAndWait()
		return best
	}
	small, large := perCall(1000), perCall(8000)
	t.Logf("TerminationChannel: %v per call with 1,000 controllers stopping, %v with 8,000", small, large)
	if ratio := float64(large) / float64(small); ratio > 3 {
		t.Errorf("a call costs %.1f times as much with 8 times as many controllers stopping: it scans them", ratio)
	}
}

// A name removed, installed again and removed again while its first
// controller still stops: once the second has terminated, the name's
// TerminationChannel is the first's, still stopping, also after removals
// of other names have pruned the stopping list.
func TestTerminationChannelFindsAnEarlierRemovalStillStopping(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		slow := func(d time.Duration) ControllerParams {
			return ControllerParams{DoFunc: NoopFunc, StopFunc: func(context.Context) error {
				time.Sleep(d)
				return nil
			}}
		}
		start := time.Now()
		e.m.UpdateController("a", slow(10*time.Second))
		synctest.Wait()
		require.NoError(t, e.m.RemoveController("a"))
		e.m.UpdateController("a", slow(time.Second))
		synctest.Wait()
		require.NoError(t, e.m.RemoveControllerAndWait("a"))
		for _, name := range names(100) { // fill and prune the list
			e.m.UpdateController(name, ControllerParams{DoFunc: NoopFunc})
			synctest.Wait()
			require.NoError(t, e.m.RemoveControllerAndWait(name))
		}
		ch := e.m.TerminationChannel("a")
		select {
		case <-ch:
			t.Fatal("closed while the first controller's StopFunc still runs")
		default:
		}
		<-ch
		assert.Equal(t, 10*time.Second, time.Since(start), "closed when the first StopFunc returned")
		select {
		case <-e.m.TerminationChannel("a"):
		default:
			t.Fatal("the name's channel once both terminated is open")
		}
		e.m.RemoveAllAndWait()
	})
}

// A removed under "x" keeps stopping; B is installed and removed under "x"
// and terminates at once; C is installed and removed and terminates. A is
// the one last removed under "x" that is still stopping, so, as its
// documentation says, TerminationChannel("x") must stay open until A
// returns. The index forgot A: when C was indexed, B (which shadowed A)
// had terminated, so C shadows nothing and the chain to A is cut; the
// channel returned is closed at once. Before the index (a scan of
// m.stopping) it found A.
//
// Other controllers stopping meanwhile (others) decide whether a prune,
// which rebuilds the index, comes between the removals; the test tries
// 0 to 8 of them.
func TestTerminationChannelAfterThreeRemovals(t *testing.T) {
	for others := range 9 {
		t.Run(fmt.Sprintf("others=%d", others), func(t *testing.T) { terminationAfterThreeRemovals(t, others) })
	}
}

func terminationAfterThreeRemovals(t *testing.T, others int) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		release := make(chan struct{})
		for i := range others {
			name := fmt.Sprintf("other-%d", i)
			e.m.UpdateController(name, ControllerParams{DoFunc: NoopFunc, StopFunc: func(context.Context) error {
				<-release
				return nil
			}})
			synctest.Wait()
			if err := e.m.RemoveController(name); err != nil {
				t.Fatal(err)
			}
		}
		e.m.UpdateController("x", ControllerParams{DoFunc: NoopFunc, StopFunc: func(context.Context) error {
			<-release // A's StopFunc goes on
			return nil
		}})
		synctest.Wait()
		if err := e.m.RemoveController("x"); err != nil {
			t.Fatal(err)
		}
		for range 2 { // B, then C: each stops at once
			e.m.UpdateController("x", ControllerParams{DoFunc: NoopFunc})
			synctest.Wait()
			if err := e.m.RemoveController("x"); err != nil {
				t.Fatal(err)
			}
			synctest.Wait()
		}
		if n := len(e.m.GetStoppingStatus()); n != 1+others {
			t.Fatalf("%d controllers stopping, want %d", n, 1+others)
		}
		select {
		case <-e.m.TerminationChannel("x"):
			t.Errorf("TerminationChannel(\"x\") is closed while A, removed under x, is still stopping (its StopFunc has not returned)")
		default:
		}
		close(release)
		synctest.Wait()
	})
}
