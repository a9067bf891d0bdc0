// A run middleware given to a replica: it wraps what the replica runs,
// with the replica's claim in the context.

package etcd

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bgctl/controller"
	"github.com/bgctl/controller/ha"
)

// A controller.WithRunMiddleware in Options.ManagerOptions reaches the
// replica's inner Manager: it wraps the DoFuncs the replica runs, once
// per set of parameters, and ClaimFrom works inside it, with the claim the
// DoFunc gets.
func TestRunMiddlewareThroughManagerOptions(t *testing.T) {
	opts := testOptions()
	var wraps, runs atomic.Int64
	var seen atomic.Value // the Claim the middleware saw last
	opts.ManagerOptions = []controller.Option{controller.WithRunMiddleware(
		func(info controller.RunInfo, do controller.ControllerFunc) controller.ControllerFunc {
			wraps.Add(1)
			return func(ctx context.Context) error {
				cl, ok := ha.ClaimFrom(ctx)
				if !ok {
					t.Errorf("%s: no claim in the middleware's context", info.Name)
				}
				seen.Store(cl)
				return do(ctx)
			}
		})}
	c := newCluster(t, 0, opts)
	n := c.joinEmpty("solo")
	var doClaim atomic.Value
	params := controller.ControllerParams{DoFunc: func(ctx context.Context) error {
		cl, _ := ha.ClaimFrom(ctx)
		doClaim.Store(cl)
		runs.Add(1)
		return nil
	}}
	if err := n.r.UpdateController("job", params); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the first run", func() bool { return runs.Load() == 1 })
	n.r.TriggerController("job")
	waitFor(t, "the triggered run", func() bool { return runs.Load() == 2 })
	if got := wraps.Load(); got != 1 {
		t.Errorf("the middleware wrapped %d times for one set of parameters, want 1", got)
	}
	cl, _ := seen.Load().(ha.Claim)
	if cl.Key != c.prefix+"/claims/job" || cl != doClaim.Load().(ha.Claim) {
		t.Errorf("the middleware saw the claim %+v, the DoFunc %+v", cl, doClaim.Load())
	}
	if err := n.r.RemoveControllerAndWait("job"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := n.r.Leave(ctx); err != nil {
		t.Fatal(err)
	}
}
