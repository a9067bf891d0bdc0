// Tests of the Controller itself: its identity across updates, what an
// update or a trigger does to a running DoFunc, its state bits, its size.

package controller

import (
	"testing"
	"testing/synctest"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

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

// A Controller is allocated from the runtime's 416-byte size class. A
// user with a million controllers pays for every class it climbs: the
// next one, 448 bytes, costs 32 MB more. A field added to Controller must
// fit in that class.
func TestControllerStaysInItsSizeClass(t *testing.T) {
	const sizeClass = 416
	if size := unsafe.Sizeof(Controller{}); size > sizeClass {
		t.Errorf("Controller is %d bytes, more than its %d-byte size class: move a field out of it or find padding to put it in", size, sizeClass)
	}
}
