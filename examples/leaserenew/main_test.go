package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/bgctl/controller"
	"github.com/sirupsen/logrus/hooks/test"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const heartbeatName = "node-lease-heartbeat"

// rig is one heartbeat controller in a bubble, with the times (since the
// start of the test) at which the hook fired.
type rig struct {
	start time.Time
	store *leaseStore
	mgr   *controller.Manager

	mu    sync.Mutex
	hooks []time.Duration
	errs  []error
}

func newRig(t *testing.T, interval time.Duration, jitterFactor float64) *rig {
	t.Helper()
	logger, _ := test.NewNullLogger()
	r := &rig{
		start: time.Now(),
		store: newLeaseStore(),
		mgr:   controller.NewManager(controller.WithLogger(logger), controller.WithMetrics(nil)),
	}
	alarm := &streakAlarm{threshold: heartbeatFailureThreshold, hook: func(err error) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.hooks = append(r.hooks, time.Since(r.start))
		r.errs = append(r.errs, err)
	}}
	h := newHeartbeat(r.store, "node-1", 4*interval, func(string, ...any) {})
	r.mgr.UpdateController(heartbeatName, heartbeatParams(h, interval, jitterFactor, alarm))
	t.Cleanup(func() { r.mgr.RemoveAllAndWait() })
	return r
}

// sleepUntil sleeps until d after the start of the test.
func (r *rig) sleepUntil(d time.Duration) {
	time.Sleep(d - time.Since(r.start))
}

func (r *rig) hookTimes() []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]time.Duration(nil), r.hooks...)
}

// times returns when the store answered the requests for which keep holds,
// relative to the start of the test.
func (r *rig) times(keep func(request) bool) []time.Duration {
	var out []time.Duration
	for _, q := range r.store.Requests() {
		if keep(q) {
			out = append(out, q.At.Sub(r.start))
		}
	}
	return out
}

func unavailable(q request) bool { return errors.Is(q.Err, errUnavailable) }
func renewal(q request) bool     { return q.Op == "update" && q.Err == nil }

func secs(ss ...float64) []time.Duration {
	out := make([]time.Duration, len(ss))
	for i, s := range ss {
		out[i] = time.Duration(s * float64(time.Second))
	}
	return out
}

func diffs(ts []time.Duration) []time.Duration {
	var out []time.Duration
	for i := 1; i < len(ts); i++ {
		out = append(out, ts[i]-ts[i-1])
	}
	return out
}

// Without jitter the schedule is exact: renewals every 10s; in an outage
// from 15s to 162s, failures at 20s, then after waits of 200ms, 400ms, …,
// 6.8s, then 7s each; the first attempt after the outage (167s) succeeds
// and renewals go back to every 10s.
func TestOutageRetriesOnTheCappedScheduleAndRenewalsResume(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, 10*time.Second, 0)
		r.sleepUntil(15 * time.Second)
		r.store.SetDown(true)
		r.sleepUntil(162 * time.Second)
		r.store.SetDown(false)
		r.sleepUntil(190 * time.Second)
		synctest.Wait()

		failed := r.times(unavailable)
		require.Len(t, failed, 38)
		waits := diffs(failed)
		assert.Equal(t, 20*time.Second, failed[0], "the first renewal in the outage")
		assert.Equal(t, secs(0.2, 0.4, 0.6, 0.8, 1.0), waits[:5])
		assert.Equal(t, secs(6.6, 6.8, 7, 7, 7), waits[32:])
		for i, w := range waits {
			want := min(time.Duration(i+1)*200*time.Millisecond, 7*time.Second)
			assert.Equal(t, want, w, "wait after failure %d", i+1)
		}
		assert.Equal(t, 160*time.Second, failed[37])

		renewals := r.times(renewal)
		assert.Equal(t, secs(10, 167, 177, 187), renewals, "one renewal before the outage, then the interval again")

		c := r.mgr.Lookup(heartbeatName)
		assert.Equal(t, 0, c.GetConsecutiveFailureCount())
		assert.Equal(t, 38, c.GetFailureCount())
	})
}

func TestHookFiresOnceAStreakReachesFive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, 10*time.Second, 0)

		// A short outage: failures at 10, 10.2, 10.6, 11.2; success at
		// 12.0. Four in a row is below the threshold.
		r.sleepUntil(9 * time.Second)
		r.store.SetDown(true)
		r.sleepUntil(11500 * time.Millisecond)
		r.store.SetDown(false)
		r.sleepUntil(13 * time.Second)
		assert.Empty(t, r.hookTimes())
		assert.Len(t, r.times(unavailable), 4)

		// A long outage: the renewal at 22s fails, and so do the retries at
		// 22.2, 22.6, 23.2 and 24.0; the hook fires at the fifth failure,
		// once, though 20 more follow.
		r.store.SetDown(true)
		r.sleepUntil(100 * time.Second)
		synctest.Wait()
		assert.Equal(t, secs(24), r.hookTimes())
		assert.Greater(t, len(r.times(unavailable)), 4+20)
		r.mu.Lock()
		assert.ErrorIs(t, r.errs[0], errUnavailable)
		r.mu.Unlock()

		// A new streak after a success fires it again.
		r.store.SetDown(false)
		r.sleepUntil(200 * time.Second)
		r.store.SetDown(true)
		r.sleepUntil(300 * time.Second)
		synctest.Wait()
		assert.Len(t, r.hookTimes(), 2)
	})
}

func TestConflictRereadsAndKeepsTheOtherWritersChange(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, 10*time.Second, 0)
		r.sleepUntil(5 * time.Second)
		require.NoError(t, r.store.Label("node-1", "team", "blue"))
		r.sleepUntil(10 * time.Second)
		synctest.Wait()

		var ops []string
		for _, q := range r.store.Requests() {
			if q.At.Sub(r.start) == 10*time.Second {
				s := q.Op
				if q.Err != nil {
					s += ": " + q.Err.Error()
				}
				ops = append(ops, s)
			}
		}
		assert.Equal(t, []string{
			"update: conflict: the lease was modified since it was read (have version 1, stored 2)",
			"get",
			"update",
		}, ops)
		l, err := r.store.Get(context.Background(), "node-1")
		require.NoError(t, err)
		assert.Equal(t, map[string]string{"team": "blue"}, l.Labels, "the renewal was based on the re-read lease")
		assert.Equal(t, 10*time.Second, l.RenewTime.Sub(r.start))
		c := r.mgr.Lookup(heartbeatName)
		assert.Equal(t, 0, c.GetFailureCount(), "a conflict resolved by a re-read is no failure")
		assert.Equal(t, 2, c.GetSuccessCount())
	})
}

func TestRemovalReleasesTheLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, 10*time.Second, 0)
		r.sleepUntil(25 * time.Second)
		l, err := r.store.Get(context.Background(), "node-1")
		require.NoError(t, err)
		assert.Equal(t, "node-1", l.HolderIdentity)

		require.NoError(t, r.mgr.RemoveControllerAndWait(heartbeatName))
		l, err = r.store.Get(context.Background(), "node-1")
		require.NoError(t, err)
		assert.Empty(t, l.HolderIdentity)
		assert.Equal(t, 20*time.Second, l.RenewTime.Sub(r.start), "released, not renewed")
	})
}

// With the 4 % jitter, each renewal comes 10s to 10.4s after the previous
// one, and each retry wait exceeds its capped value by less than 400ms.
func TestJitterStaysWithinFourPercent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, 10*time.Second, 0.04)
		r.sleepUntil(300 * time.Second)
		r.store.SetDown(true)
		r.sleepUntil(400 * time.Second)
		synctest.Wait()

		renewals := diffs(r.times(renewal))
		require.GreaterOrEqual(t, len(renewals), 25)
		exact := true
		for _, d := range renewals {
			assert.GreaterOrEqual(t, d, 10*time.Second)
			assert.Less(t, d, 10400*time.Millisecond)
			exact = exact && d == 10*time.Second
		}
		assert.False(t, exact, "no renewal was jittered")

		retries := diffs(r.times(unavailable))
		require.GreaterOrEqual(t, len(retries), 15)
		for i, d := range retries {
			base := min(time.Duration(i+1)*200*time.Millisecond, 7*time.Second)
			assert.GreaterOrEqual(t, d, base, "retry %d", i+1)
			assert.Less(t, d, base+400*time.Millisecond, "retry %d", i+1)
		}
	})
}

func TestRunShowsTheStoryAndExitsAfterItsDuration(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		logger, _ := test.NewNullLogger()
		store := newLeaseStore()
		var out bytes.Buffer
		start := time.Now()
		require.NoError(t, run(t.Context(), &out, withStore(store), withLogger(logger)))
		assert.Equal(t, 12*time.Second, time.Since(start))

		text := out.String()
		assert.Equal(t, 1, strings.Count(text, "onRepeatedHeartbeatFailure: 5 failures in a row"))
		assert.Contains(t, text, "re-reading")
		assert.Contains(t, text, "lease store is back")
		assert.True(t, strings.HasSuffix(text, "released lease node-1\n"), "the StopFunc runs last")
		after := text[strings.Index(text, "lease store is back"):]
		assert.Contains(t, after, "renewed lease node-1")

		l, err := store.Get(context.Background(), "node-1")
		require.NoError(t, err)
		assert.Empty(t, l.HolderIdentity)
		assert.Equal(t, map[string]string{"example.com/checked": "true"}, l.Labels)
	})
}
