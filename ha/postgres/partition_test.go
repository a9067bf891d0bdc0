// A replica cut off from the server by a black hole: its fence stops its
// names before the others take them over, a write it sends meanwhile is
// refused by Held once it arrives, it rejoins once healed, and its Close
// returns within its bound while it is cut off.

package postgres

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/bgctl/controller"
	"github.com/bgctl/controller/ha"
	"github.com/bgctl/controller/ha/sim"
	"github.com/jackc/pgx/v5"
)

// claimsSeen keeps the last claim each name's DoFunc was given.
type claimsSeen struct {
	mu sync.Mutex
	m  map[string]ha.Claim // guarded by mu
}

// params is a controller that notes its claim and runs until its context
// ends.
func (c *claimsSeen) params(_ *ha.Replica, name string) controller.ControllerParams {
	return controller.ControllerParams{DoFunc: func(ctx context.Context) error {
		claim, _ := ha.ClaimFrom(ctx)
		c.mu.Lock()
		if c.m == nil {
			c.m = map[string]ha.Claim{}
		}
		c.m[name] = claim
		c.mu.Unlock()
		<-ctx.Done()
		return nil
	}}
}

// get returns the last claim of name.
func (c *claimsSeen) get(name string) ha.Claim {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[name]
}

// closeWithinTTL closes replica id, r, and fails the test unless its
// Close returned within its bound, a TTL (and a second for a busy
// machine); when says in what state it was closed.
func closeWithinTTL(t *testing.T, r *ha.Replica, id, when string) {
	t.Helper()
	closing := time.Now()
	if err := r.Close(); err != nil {
		t.Logf("%s's Close %s: %v", id, when, err)
	}
	took := time.Since(closing)
	t.Logf("%s's Close %s took %v (bound: TTL %v)", id, when, took.Round(10*time.Millisecond), replicaTTL)
	if took > replicaTTL+time.Second {
		t.Errorf("%s's Close %s took %v, past its bound %v", id, when, took, replicaTTL)
	}
}

// runningOn returns the names id runs, sorted.
func runningOn(r *ha.Replica) []string {
	var names []string
	for _, name := range serviceNames {
		if r.Running(name) {
			names = append(names, name)
		}
	}
	return names
}

func TestPartitionedReplicaStopsBeforeItsNamesMoveAndRejoins(t *testing.T) {
	t.Parallel()
	direct := newPool(t, 16)
	group := newGroup("partition")
	table, ids := newWriteTable(t, direct, group)
	rec := &sim.Recorder{}
	others := map[string]*ha.Replica{}
	for _, id := range []string{"r0", "r1"} {
		others[id] = joinReplica(t, Store(direct, StoreOptions{}), group, id, rec)
	}
	cutPool, proxy := proxiedPool(t, testServer, 8)
	var seen claimsSeen
	r2 := joinReplicaWith(t, Store(cutPool, StoreOptions{}), group, "r2", rec, seen.params)
	all := map[string]*ha.Replica{"r0": others["r0"], "r1": others["r1"], "r2": r2}
	await(t, 20*time.Second, "every name on one replica, each running some", func() bool { return spreadOver(all) })

	// Cut: r2's requests hang. Its fence stops its names; the others
	// take them once its session ran out on the server.
	moved := runningOn(r2)
	cut := time.Now()
	proxy.cut()
	await(t, replicaTTL+5*time.Second, "r2 running nothing while cut off", func() bool { return len(runningOn(r2)) == 0 })
	stopped := time.Since(cut)
	await(t, replicaTTL+5*time.Second, "every name on r0 or r1 while r2 is cut off", func() bool { return placedOnce(others) })
	t.Logf("r2 cut off: its %d names stopped on it %v after the cut, and all ran on r0 and r1 %v after it (TTL %v)",
		len(moved), stopped.Round(10*time.Millisecond), time.Since(cut).Round(10*time.Millisecond), replicaTTL)
	gap := time.Duration(-1)
	for _, name := range moved {
		runs := rec.Runs(name)
		last := slices.IndexFunc(runs, func(r sim.Run) bool { return r.Replica != "r2" && r.Start.After(cut) })
		if last < 1 || runs[last-1].Replica != "r2" || runs[last-1].End.IsZero() {
			t.Errorf("%s: runs %v; want r2's run, ended, then one elsewhere", name, runs)
			continue
		}
		d := runs[last].Start.Sub(runs[last-1].End)
		if d < 0 {
			t.Errorf("%s started on %s %v before r2's run ended", name, runs[last].Replica, -d)
		}
		if gap < 0 || d < gap {
			gap = d
		}
	}
	t.Logf("the shortest time between r2's run of a name ending and another replica's starting: %v", gap)

	// A fenced write r2's DoFunc sends now, with a claim of before the
	// cut, hangs while the link is cut and is refused once it arrives.
	claim := seen.get(moved[0])
	wrote := make(chan error, 1)
	go func() { // joined below: <-wrote
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		wrote <- pgx.BeginFunc(ctx, cutPool, func(tx pgx.Tx) error {
			if err := Held(ctx, tx, claim); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "INSERT INTO "+table+" (name, writer) VALUES ($1, 'r2')", claim.Name)
			return err
		})
	}()
	select {
	case err := <-wrote:
		t.Fatalf("r2's fenced write returned while cut off: %v", err)
	case <-time.After(500 * time.Millisecond):
	}
	healed := time.Now()
	proxy.heal()
	select {
	case err := <-wrote:
		if !errors.Is(err, ErrNotHeld) {
			t.Errorf("r2's fenced write of %s, arrived after the heal: %v, want ErrNotHeld", claim.Name, err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("r2's fenced write did not return within 20s of the heal")
	}
	if n := len(ids("min", "r2")); n != 0 {
		t.Errorf("r2 wrote %d names after they moved", n)
	}

	// Healed, r2 rejoins and takes its share again.
	await(t, replicaTTL+20*time.Second, "the names spread over r0, r1 and r2 after the heal", func() bool { return spreadOver(all) })
	t.Logf("healed: the names spread over the three again %v after the heal", time.Since(healed).Round(10*time.Millisecond))

	// Cut again, r2's Close returns within its bound, a TTL.
	proxy.cut()
	closeWithinTTL(t, r2, "r2", "while cut off")
	await(t, replicaTTL+5*time.Second, "every name on r0 or r1 after r2's Close", func() bool { return placedOnce(others) })
	proxy.heal()
	if o := rec.Overlaps(); len(o) > 0 {
		t.Errorf("names ran on two replicas at once: %v", o)
	}
}
