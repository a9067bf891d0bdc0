// Whole replicas on the store: three in this process spread the names,
// one crashes (Close without Leave) and its names move once its session
// ran out, one leaves and its names move at once; no name ever runs on
// two at once.

package postgres

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/bgctl/controller"
	"github.com/bgctl/controller/ha"
	"github.com/bgctl/controller/ha/sim"
)

// replicaTTL is the replicas' TTL in these tests.
const replicaTTL = 2 * time.Second

// serviceNames are the controllers of the service the tests replicate.
var serviceNames = jobNames(12, "job-%02d")

// jobNames returns n names, format applied to 0 … n-1.
func jobNames(n int, format string) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf(format, i)
	}
	return names
}

// joinReplica makes replica id of group on store, registers the
// service's controllers through rec (each runs until its context ends),
// and joins; the test's cleanup closes it.
func joinReplica(t *testing.T, store ha.Store, group, id string, rec *sim.Recorder) *ha.Replica {
	t.Helper()
	return joinReplicaWith(t, store, group, id, rec, func(*ha.Replica, string) controller.ControllerParams { return untilCancelled })
}

// untilCancelled is a controller whose DoFunc runs until its context
// ends.
var untilCancelled = controller.ControllerParams{
	DoFunc: func(ctx context.Context) error { <-ctx.Done(); return nil },
}

// joinReplicaWith is joinReplica with the controllers params returns,
// given the replica and the name.
func joinReplicaWith(t *testing.T, store ha.Store, group, id string, rec *sim.Recorder, params func(r *ha.Replica, name string) controller.ControllerParams) *ha.Replica {
	t.Helper()
	r, err := ha.New(store, ha.Options{
		Prefix:         group,
		ID:             id,
		TTL:            replicaTTL,
		ManagerOptions: []controller.Option{controller.WithSlog(slog.New(slog.DiscardHandler))},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	for _, name := range serviceNames {
		err := rec.Controllers(r).UpdateController(name, params(r, name))
		if err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.Join(ctx); err != nil {
		t.Fatalf("join %s: %v", id, err)
	}
	return r
}

// placement returns which of replicas runs each name ("" none, "+" more
// than one), and how many each runs.
func placement(replicas map[string]*ha.Replica) (on map[string]string, count map[string]int) {
	on, count = map[string]string{}, map[string]int{}
	for _, name := range serviceNames {
		for id, r := range replicas {
			if !r.Running(name) {
				continue
			}
			count[id]++
			if on[name] == "" {
				on[name] = id
			} else {
				on[name] = "+"
			}
		}
	}
	return on, count
}

// placedOnce reports whether every name runs on exactly one of replicas.
func placedOnce(replicas map[string]*ha.Replica) bool {
	on, _ := placement(replicas)
	for _, name := range serviceNames {
		if on[name] == "" || on[name] == "+" {
			return false
		}
	}
	return true
}

// spreadOver reports whether every name runs on exactly one of replicas,
// and each of them runs some.
func spreadOver(replicas map[string]*ha.Replica) bool {
	_, count := placement(replicas)
	return placedOnce(replicas) && len(count) == len(replicas)
}

// await polls cond every 50ms until it holds, or fails the test after
// within.
func await(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestReplicasSpreadCrashAndLeaveWithoutOverlap(t *testing.T) {
	t.Parallel()
	store := Store(newPool(t, 16), StoreOptions{})
	group := newGroup("replicas")
	var rec sim.Recorder
	replicas := map[string]*ha.Replica{}
	for _, id := range []string{"r0", "r1", "r2"} {
		replicas[id] = joinReplica(t, store, group, id, &rec)
	}
	await(t, 20*time.Second, "every name on one replica, each replica running some", func() bool { return spreadOver(replicas) })
	crashThenLeave(t, replicas, &rec)
	for _, name := range serviceNames {
		if len(rec.Runs(name)) == 0 {
			t.Errorf("%s never ran", name)
		}
	}
}

// crashThenLeave crashes r1 of replicas (Close without Leave), whose
// names must run on r0 and r2 within its TTL and a few seconds, then
// makes r2 leave, whose names must run on r0 within a TTL; no name may
// run on two replicas at once meanwhile.
func crashThenLeave(t *testing.T, replicas map[string]*ha.Replica, rec *sim.Recorder) {
	t.Helper()
	spread := func() bool { return spreadOver(replicas) }
	// r1 crashes: its names run elsewhere once its session ran out.
	_, count := placement(replicas)
	crashed := time.Now()
	if err := replicas["r1"].Close(); err != nil {
		t.Logf("r1's Close: %v", err)
	}
	delete(replicas, "r1")
	await(t, replicaTTL+5*time.Second, fmt.Sprintf("r1's %d names running on r0 and r2 after its crash", count["r1"]), spread)
	t.Logf("r1's names ran elsewhere %v after its crash", time.Since(crashed).Round(10*time.Millisecond))

	// r2 leaves: its names move to r0.
	left := time.Now()
	if err := replicas["r2"].Leave(context.Background()); err != nil {
		t.Fatalf("r2's Leave: %v", err)
	}
	delete(replicas, "r2")
	await(t, replicaTTL, "every name on r0 after r2 left", spread)
	t.Logf("r2's names ran on r0 %v after its Leave", time.Since(left).Round(10*time.Millisecond))

	if o := rec.Overlaps(); len(o) > 0 {
		t.Errorf("names ran on two replicas at once: %v", o)
	}
}

// joinThree joins replicas r0, r1 and r2 of group on store, their
// controllers recorded, and waits until every name runs on exactly one of
// them; it returns them, the recorder, and that wait's condition.
func joinThree(t *testing.T, store ha.Store, group string) (map[string]*ha.Replica, *sim.Recorder, func() bool) {
	t.Helper()
	rec := &sim.Recorder{}
	replicas := map[string]*ha.Replica{}
	for _, id := range []string{"r0", "r1", "r2"} {
		replicas[id] = joinReplica(t, store, group, id, rec)
	}
	once := func() bool { return placedOnce(replicas) }
	await(t, 20*time.Second, "every name on one replica", once)
	return replicas, rec, once
}
