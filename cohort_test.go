// Tests of stop cohorts: what RemoveAllAndWait and Shutdown wait for.

package controller

import (
	"context"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// RemoveAllAndWait and Shutdown also wait for controllers removed earlier
// and still stopping.
func TestWaitsIncludeEarlierRemovals(t *testing.T) {
	for _, name := range []string{"RemoveAllAndWait", "Shutdown"} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newEnv(t)
				stopped := false
				e.m.UpdateController("a", ControllerParams{DoFunc: NoopFunc, StopFunc: func(context.Context) error {
					time.Sleep(time.Minute)
					stopped = true
					return nil
				}})
				synctest.Wait()
				require.NoError(t, e.m.RemoveController("a"))
				start := time.Now()
				if name == "Shutdown" {
					require.NoError(t, e.m.Shutdown(context.Background()))
				} else {
					e.m.RemoveAllAndWait()
				}
				assert.True(t, stopped)
				assert.Equal(t, time.Minute, time.Since(start))
			})
		})
	}
}

// RemoveAllAndWait waits for exactly the controllers it removed and those
// already stopping when it was called, not for the ones an owner keeps
// installing and removing meanwhile; Shutdown likewise, and its error names
// only those.
func TestWaitsIgnoreLaterChurn(t *testing.T) {
	slowStop := func(d time.Duration) ControllerFunc {
		return func(context.Context) error { time.Sleep(d); return nil }
	}
	for _, shutdown := range []bool{false, true} {
		t.Run(map[bool]string{false: "RemoveAllAndWait", true: "Shutdown"}[shutdown], func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newEnv(t)
				// Already stopping when the wait begins: its StopFunc takes 2 s.
				e.m.UpdateController("earlier", ControllerParams{DoFunc: NoopFunc, StopFunc: slowStop(2 * time.Second)})
				// Removed by the wait: its StopFunc takes 1 s.
				e.m.UpdateController("present", ControllerParams{DoFunc: NoopFunc, StopFunc: slowStop(time.Second)})
				synctest.Wait()
				require.NoError(t, e.m.RemoveController("earlier"))

				// An owner's event handler goes on installing and removing
				// controllers, each stopping for 3 s, every 500 ms for 10 s.
				churnDone := make(chan struct{})
				go func() {
					defer close(churnDone)
					for i := range 20 {
						time.Sleep(500 * time.Millisecond)
						name := fmt.Sprintf("churn-%d", i)
						e.m.UpdateController(name, ControllerParams{DoFunc: NoopFunc, StopFunc: slowStop(3 * time.Second)})
						synctest.Wait()
						_ = e.m.RemoveController(name)
					}
				}()
				time.Sleep(250 * time.Millisecond)
				start := time.Now()
				if shutdown {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					assert.NoError(t, e.m.Shutdown(ctx), "nothing it waits for outlives the deadline")
					cancel()
				} else {
					e.m.RemoveAllAndWait()
				}
				assert.Equal(t, 1750*time.Millisecond, time.Since(start), "the wait ends when \"earlier\" (removed 250 ms before it) has stopped")
				assert.True(t, e.m.Lookup("present") == nil)
				<-churnDone
				e.m.RemoveAllAndWait()
			})
		})
	}
}

// A Shutdown whose deadline passes names the controllers it waited for that
// are still running, not those removed after it began.
func TestShutdownNamesOnlyWhatItWaitedFor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		block := func(ctx context.Context) error { <-ctx.Done(); return nil }
		e.m.UpdateController("stuck", ControllerParams{DoFunc: NoopFunc, StopFunc: block})
		synctest.Wait()
		go func() {
			time.Sleep(time.Second)
			e.m.UpdateController("later", ControllerParams{DoFunc: NoopFunc, StopFunc: func(context.Context) error {
				time.Sleep(time.Hour)
				return nil
			}})
			synctest.Wait()
			_ = e.m.RemoveController("later")
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		err := e.m.Shutdown(ctx)
		assert.EqualError(t, err, "controller: shutdown: context deadline exceeded; still running: stuck")
		e.m.RemoveAllAndWait()
	})
}

// RemoveAllAndWait and Shutdown wait for every controller removed before
// they were called, until it has terminated and left controllers_active.
// The storm found them returning early: a terminating controller left the
// Manager's list of stopping controllers first, and only then left
// controllers_active and closed its termination channel; a wait that came
// in between did not wait for it. Here the controller is held in between by
// a gauge that blocks on its decrement.
func TestWaitsCoverAControllerThatIsTerminating(t *testing.T) {
	for _, wait := range []string{"RemoveAllAndWait", "Shutdown"} {
		t.Run(wait, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				met := NewMetrics(MetricsOpts{})
				leave := make(chan struct{})
				met.active = &heldGauge{Gauge: met.active, leave: leave}
				m := NewManager(WithLogger(quietLogger()), WithMetrics(met))
				c := m.UpdateController("c", ControllerParams{DoFunc: NoopFunc})
				require.NoError(t, m.RemoveController("c"))
				synctest.Wait() // c is terminating, held in its gauge decrement

				returned := make(chan error, 1)
				go func() {
					if wait == "Shutdown" {
						ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
						defer cancel()
						returned <- m.Shutdown(ctx)
						return
					}
					m.RemoveAllAndWait()
					returned <- nil
				}()
				synctest.Wait()
				if wait == "Shutdown" {
					err := <-returned // at its deadline
					assert.ErrorIs(t, err, context.DeadlineExceeded)
					assert.ErrorContains(t, err, "still running: c")
				} else {
					assert.False(t, isClosed(terminationOf(c)))
					assert.Empty(t, returned, "RemoveAllAndWait returned while c was terminating")
				}
				close(leave)
				if wait != "Shutdown" {
					require.NoError(t, <-returned)
				}
				<-terminationOf(c)
				m.RemoveAllAndWait()
				assert.Equal(t, 0.0, testutil.ToFloat64(met.active))
			})
		})
	}
}

// heldGauge is a Gauge whose decrements wait until leave is closed.
type heldGauge struct {
	prometheus.Gauge
	leave chan struct{}
}

func (g *heldGauge) Add(v float64) {
	if v < 0 {
		<-g.leave
	}
	g.Gauge.Add(v)
}
