// After a fence pass on the Kubernetes store: a DoFunc that takes its
// Margin after the cancellation, then a StopFunc that takes as long or
// ignores its context, never overlaps the next holder.

package kube

import (
	"testing"
	"time"

	controller "github.com/bgctl/controller"
	"github.com/bgctl/controller/ha"
)

// A replica cut off from the API server runs no StopFunc once its fence
// has passed, as after a crash: the names' DoFuncs return 0.9 × Margin
// after their cancellation, and StopFuncs that would take as long, or
// five Margins whatever their context says, must not run past the moment
// the other replica may start the names.
func TestStopFuncAfterAFencePassOnKubernetes(t *testing.T) {
	t.Parallel() // each in a group of its own; their waits overlap
	for _, tc := range []struct {
		name    string
		stopFor time.Duration // how long a StopFunc works, its context notwithstanding
	}{{"StopFunc uses its Margin", replicaMargin * 9 / 10}, {"StopFunc ignores its context", 5 * replicaMargin}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel() // each in a group of its own
			g := newKubeReplicas(t, 8)
			g.params = func(_ *ha.Replica, id, name string) controller.ControllerParams {
				return g.lingeringParams(id, name, tc.stopFor)
			}
			g.join("a")
			g.join("b")
			_, where := g.waitPlaced("a and b placing", 30*time.Second, "a", "b")
			holder, other := "a", "b"
			if where[g.names[0]] == "b" {
				holder, other = "b", "a"
			}
			g.cuts[holder].off.Store(true)
			g.waitPlaced("after "+holder+" was cut off", replicaTTL+20*time.Second, other)
			// A StopFunc the cut-off replica started would have begun
			// before the other started the names: the recorder counted it.
			// Close each replica, and wait until a StopFunc that ignores
			// its context, which Close gives up on, has ended.
			for id, r := range g.rs {
				_ = r.Close()
				delete(g.rs, id)
			}
			deadline := time.Now().Add(2 * tc.stopFor)
			for {
				if g.runs.idle() {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("runs still in progress %v after Close", 2*tc.stopFor)
				}
				time.Sleep(20 * time.Millisecond) // a real server's time: polled, loosely bounded
			}
		})
	}
}

// idle reports whether no run is in progress.
func (r *runs) idle() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, n := range r.active {
		if n != 0 {
			return false
		}
	}
	return true
}
