// A seeded random schedule of crashes, partitions, heals, joins, leaves,
// statements left hanging on a lock and restarts of the server, under
// replicas whose user code takes all the time the contract gives it:
// never two runs of a name at once, every Close and Leave within its
// bound.

package postgres

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/bgctl/controller"
	"github.com/bgctl/controller/ha"
	"github.com/bgctl/controller/ha/sim"
	"github.com/jackc/pgx/v5/pgxpool"
)

var (
	scheduleFor  = flag.Duration("pg.schedule", 20*time.Second, "how long TestRandomScheduleOnPostgres pauses between its operations in all (CI: longer)")
	scheduleSeed = flag.Uint64("pg.seed", 0, "the seed of TestRandomScheduleOnPostgres; 0: from the clock. The log names it.")
)

// replicaMargin is the replicas' Margin: Options' default, TTL/4.
const replicaMargin = replicaTTL / 4

// leaveLimit is the context a schedule's Leave gets: its bound.
const leaveLimit = 10 * time.Second

// scheduled is a replica of the schedule and the black hole between its
// pool and the server.
type scheduled struct {
	r     *ha.Replica
	proxy *blackHole
}

// The schedule picks each operation and pause from the seed, so a seed
// replays the same sequence of operations (their timing against the
// server varies). A crash cuts a replica off and closes it, which must
// return within its TTL; a partition cuts a replica off until a heal; a
// Leave must return within its context; a hang holds a replica's session
// row (its renewals) and the group's row (every write) locked for a
// while; a restart shuts the server down fast and starts it again. The
// server is the test's own. The log names the seed.
func TestRandomScheduleOnPostgres(t *testing.T) {
	t.Parallel()
	seed := *scheduleSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (replay: go test -race -run TestRandomScheduleOnPostgres -pg.seed=%d -pg.schedule=%v)", seed, seed, *scheduleFor)
	rng := rand.New(rand.NewPCG(seed, 0x5047))
	srv, err := startPostgres() // restarted by the schedule: the others' tests go on
	if err != nil {
		t.Fatalf("a server of the schedule's own: %v", err)
	}
	defer srv.Stop()
	admin := newPoolOn(t, srv.DSN, 2)
	group := newGroup("schedule")
	rec := &sim.Recorder{}
	rs := map[string]*scheduled{}
	join := func(id string) {
		pool, proxy := proxiedPool(t, srv, 8)
		rs[id] = &scheduled{r: joinReplicaWith(t, Store(pool, StoreOptions{}), group, id, rec, hostileParams(rec)), proxy: proxy}
	}
	for _, id := range []string{"r0", "r1", "r2"} {
		join(id)
	}
	partitioned := map[string]bool{}
	live := func(pred func(id string) bool) []string {
		var ids []string
		for id := range rs {
			if pred(id) {
				ids = append(ids, id)
			}
		}
		slices.Sort(ids)
		return ids
	}
	everyone := func(string) bool { return true }
	reachable := func(id string) bool { return !partitioned[id] }
	cutOff := func(id string) bool { return partitioned[id] }
	pick := func(ids []string) string { return ids[rng.IntN(len(ids))] }
	var slowest time.Duration
	took := func(what, id string, start time.Time, bound time.Duration) {
		d := time.Since(start)
		slowest = max(slowest, d)
		if d > bound+time.Second {
			t.Errorf("%s(%s) took %v, past its bound %v", what, id, d, bound)
		}
	}
	ops := map[string]int{}
	next := 3
	// The pauses alone add up to the schedule's duration, so the number of
	// steps depends on the seed only; the operations take time on top.
	for paused := time.Duration(0); paused < *scheduleFor; {
		op := rng.IntN(9) // 7 and 8: a pause alone
		if len(rs) < 2 {
			op = 3 // keep two replicas or more, so the end has names to spread
		}
		long := time.Duration(100+rng.IntN(2900)) * time.Millisecond
		switch {
		case op == 0 && len(rs) >= 2:
			id := pick(live(everyone))
			delete(partitioned, id)
			rs[id].proxy.cut()
			start := time.Now()
			if err := rs[id].r.Close(); err != nil {
				t.Logf("Close(%s) cut off: %v", id, err)
			}
			took("Close", id, start, replicaTTL)
			delete(rs, id)
			ops["crash"]++
		case op == 1 && len(live(reachable)) >= 2:
			id := pick(live(reachable))
			rs[id].proxy.cut()
			partitioned[id] = true
			ops["partition"]++
		case op == 2 && len(live(cutOff)) > 0:
			id := pick(live(cutOff))
			rs[id].proxy.heal()
			delete(partitioned, id)
			ops["heal"]++
		case op == 3 && len(rs) < 4:
			join(fmt.Sprintf("j%d", next))
			next++
			ops["join"]++
		case op == 4 && len(live(reachable)) >= 2:
			id := pick(live(reachable))
			ctx, cancel := context.WithTimeout(context.Background(), leaveLimit)
			start := time.Now()
			if err := rs[id].r.Leave(ctx); err != nil {
				t.Errorf("Leave(%s): %v", id, err)
			}
			cancel()
			took("Leave", id, start, leaveLimit)
			delete(rs, id)
			ops["leave"]++
		case op == 5:
			srv.Shutdown()
			time.Sleep(long / 3) // every request fails meanwhile
			if err := srv.Restart(); err != nil {
				t.Fatalf("starting the server again: %v", err)
			}
			ops["server restart"]++
		case op == 6:
			hang(t, admin, group, pick(live(everyone)), long)
			ops["hang"]++
		default:
			ops["pause"]++
		}
		pause := time.Duration(100+rng.IntN(1400)) * time.Millisecond
		time.Sleep(pause)
		paused += pause
	}
	for _, id := range live(cutOff) {
		rs[id].proxy.heal()
	}
	for len(rs) < 3 { // the final check spreads names over three or more
		join(fmt.Sprintf("j%d", next))
		next++
	}
	ids := live(everyone)
	// Every replica left is a working member again (a lease, itself in
	// its view), then every name runs on one of them.
	healed := time.Now()
	member := func(id string) bool {
		st := rs[id].r.Status()
		return st.Lease != "" && slices.ContainsFunc(st.Members, func(m ha.MemberStatus) bool { return m.ID == id })
	}
	for _, id := range ids {
		await(t, replicaTTL+20*time.Second-time.Since(healed), id+" a working member after the last heal", func() bool { return member(id) })
	}
	replicas := map[string]*ha.Replica{}
	for id, s := range rs {
		replicas[id] = s.r
	}
	await(t, replicaTTL+20*time.Second, "every name on one replica after the schedule", func() bool { return placedOnce(replicas) })
	t.Logf("schedule of %v (seed %d): %v; every name on one of %v %v after the last heal; slowest Close or Leave %v",
		*scheduleFor, seed, ops, ids, time.Since(healed).Round(10*time.Millisecond), slowest.Round(10*time.Millisecond))
	if o := rec.Overlaps(); len(o) > 0 {
		t.Errorf("names ran on two replicas at once (seed %d): %v", seed, o)
	}
}

// hang holds replica id's session row (its renewals) and the group's
// row (every write of the group) locked for d, from a connection of
// admin: the store's statements hang meanwhile, until their context
// ends.
func hang(t *testing.T, admin *pgxpool.Pool, group, id string, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	tx, err := admin.Begin(ctx)
	if err != nil {
		t.Logf("hang: %v", err) // the server restarting still: a hang the less
		return
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	_, err = tx.Exec(ctx, "SELECT 1 FROM bgctl_ha.sessions WHERE grp = $1 AND member = $2 FOR UPDATE", group, id)
	if err == nil {
		_, err = tx.Exec(ctx, "SELECT 1 FROM bgctl_ha.groups WHERE grp = $1 FOR UPDATE", group)
	}
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		t.Logf("hang of %s: %v", id, err)
		return
	}
	time.Sleep(d)
}

// hostileParams returns the schedule's controllers, recorded by rec:
// most names run until their context ends; every fourth from the second
// has a DoFunc that goes on for 0.9 × Margin after its cancellation and
// a StopFunc that works as long; every fourth from the third has a
// DoFunc that looks at its context only every 0.9 × Margin; every fourth
// from the fourth has a DoFunc that, each time it starts, waits in
// RemoveControllerAndWait for the name after it and then registers that
// name again.
func hostileParams(rec *sim.Recorder) func(r *ha.Replica, name string) controller.ControllerParams {
	linger := replicaMargin * 9 / 10
	var params func(r *ha.Replica, name string) controller.ControllerParams
	params = func(r *ha.Replica, name string) controller.ControllerParams {
		i := slices.Index(serviceNames, name)
		switch i % 4 {
		case 1:
			return controller.ControllerParams{
				DoFunc: func(ctx context.Context) error {
					<-ctx.Done()
					time.Sleep(linger) // work past the cancellation, within the contract
					return nil
				},
				StopFunc: func(context.Context) error {
					time.Sleep(linger) // all the time a StopFunc has, whatever its context says
					return nil
				},
			}
		case 2:
			return controller.ControllerParams{DoFunc: func(ctx context.Context) error {
				for ctx.Err() == nil {
					time.Sleep(linger) // work that does not look at ctx meanwhile
				}
				return nil
			}}
		case 3:
			other := serviceNames[(i+1)%len(serviceNames)]
			return controller.ControllerParams{DoFunc: func(ctx context.Context) error {
				if err := r.RemoveControllerAndWait(other); err == nil {
					_ = rec.Controllers(r).UpdateController(other, params(r, other))
				}
				<-ctx.Done()
				return nil
			}}
		}
		return untilCancelled
	}
	return params
}
