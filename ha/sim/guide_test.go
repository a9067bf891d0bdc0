// The test that docs/testing-replicas.md shows, as written there: three
// replicas of a service's controllers, a crash and a partition.

package sim_test

import (
	"context"
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/bgctl/controller"
	"github.com/bgctl/controller/ha"
	"github.com/bgctl/controller/ha/sim"
)

// controllerNames and registerControllers are the service's own code:
// it registers the service's controllers on whatever runs them, a
// Replica in production.
var controllerNames = []string{"billing", "cleanup", "emails", "reports", "search-index", "thumbnails"}

func registerControllers(c ha.Controllers) error {
	for _, name := range controllerNames {
		err := c.UpdateController(name, controller.ControllerParams{
			DoFunc: func(ctx context.Context) error {
				tick := time.NewTicker(time.Second)
				defer tick.Stop()
				for {
					select {
					case <-tick.C: // the controller's work
					case <-ctx.Done():
						return nil
					}
				}
			},
		})
		if err != nil {
			return err
		}
	}
	return nil
}

func TestReplicasSurviveACrashAndAPartition(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var store sim.Store
		var rec sim.Recorder
		replicas := map[string]*ha.Replica{}
		for _, id := range []string{"r0", "r1", "r2"} {
			r, err := ha.New(&store, ha.Options{
				Prefix:         "/my-service",
				ID:             id,
				TTL:            2 * time.Second,
				ManagerOptions: []controller.Option{controller.WithSlog(slog.New(slog.DiscardHandler))},
			})
			if err != nil {
				t.Fatal(err)
			}
			if err := registerControllers(rec.Controllers(r)); err != nil {
				t.Fatal(err)
			}
			if err := r.Join(context.Background()); err != nil {
				t.Fatal(err)
			}
			replicas[id] = r
		}
		defer func() {
			for _, r := range replicas {
				_ = r.Close()
			}
			for _, o := range rec.Overlaps() {
				t.Errorf("ran twice at once: %v", o)
			}
		}()
		time.Sleep(5 * time.Second) // the bubble's clock: instant
		runsOn(t, replicas, "r0", "r1", "r2")

		if err := store.Crash(replicas["r1"]); err != nil {
			t.Fatal(err)
		}
		delete(replicas, "r1")
		store.Partition("r2")
		time.Sleep(10 * time.Second)
		runsOn(t, replicas, "r0")

		store.Heal("r2")
		time.Sleep(10 * time.Second)
		runsOn(t, replicas, "r0", "r2")
	})
}

// runsOn checks that every controller runs on exactly one replica, and
// that each of want runs some.
func runsOn(t *testing.T, replicas map[string]*ha.Replica, want ...string) {
	t.Helper()
	count := map[string]int{}
	for _, name := range controllerNames {
		on := 0
		for id, r := range replicas {
			if r.Running(name) {
				on++
				count[id]++
			}
		}
		if on != 1 {
			t.Errorf("%s runs on %d replicas, want 1", name, on)
		}
	}
	for _, id := range want {
		if count[id] == 0 {
			t.Errorf("%s runs nothing; every replica runs: %v", id, count)
		}
	}
}
