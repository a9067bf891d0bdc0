// A seeded random schedule of crashes, partitions, heals, joins, leaves,
// lags and deleted member keys (and, on a three-member etcd, faults of
// its members), and the scale measurement.

package etcd

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/bgctl/controller"
	"github.com/bgctl/controller/ha"
)

var (
	scheduleFor  = flag.Duration("ha.schedule", 8*time.Second, "how long TestRandomSchedule runs its schedule (CI: 60s)")
	scheduleSeed = flag.Uint64("ha.seed", 0, "the seed of TestRandomSchedule; 0: from the clock. The log names it.")
	onCluster    = flag.Bool("ha.cluster", false, "TestRandomSchedule runs on a three-member etcd cluster of its own, and adds faults of its members (killed and restarted, frozen, cut off from their peers) to its operations")
)

// The schedule picks each operation and pause from the seed, so a seed
// replays the same sequence of operations (their timing against etcd
// varies, as it would in production). The log names the seed.
func TestRandomSchedule(t *testing.T) {
	seed := *scheduleSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (replay: go test -race -run TestRandomSchedule -ha.seed=%d -ha.schedule=%v -ha.cluster=%v)", seed, seed, *scheduleFor, *onCluster)
	rng := rand.New(rand.NewPCG(seed, 0x4841))
	kinds := 7
	var ec *etcdCluster
	if *onCluster {
		ec = startEtcdCluster(t)
		kinds++ // a fault of a member; a single member's seeds replay as before
	}
	c := newClusterOn(t, 60, testOptions(), ec)
	c.params = c.hostileParams
	for _, id := range []string{"r0", "r1", "r2"} {
		c.join(id)
	}
	partitioned := map[string]bool{}
	live := func(pred func(*node) bool) []*node {
		var ns []*node
		for _, n := range c.nodes {
			if pred(n) {
				ns = append(ns, n)
			}
		}
		slices.SortFunc(ns, func(a, b *node) int { return strings.Compare(a.id, b.id) })
		return ns
	}
	everyone := func(*node) bool { return true }
	reachable := func(n *node) bool { return !partitioned[n.id] }
	cut := func(n *node) bool { return partitioned[n.id] }
	ops := map[string]int{}
	next := 3
	// The pauses alone add up to the schedule's duration, so the number of
	// steps depends on the seed only; the operations take more time on top.
	for paused := time.Duration(0); paused < *scheduleFor; {
		op := rng.IntN(kinds)
		if len(c.nodes) < 2 {
			op = 3 // keep two replicas or more, so the end has names to spread
		}
		switch {
		case op == 0 && len(c.nodes) >= 2:
			ns := live(everyone)
			n := ns[rng.IntN(len(ns))]
			delete(partitioned, n.id)
			c.crash(n)
			ops["crash"]++
		case op == 1 && len(live(reachable)) >= 2:
			ns := live(reachable)
			n := ns[rng.IntN(len(ns))]
			n.proxy.cut()
			partitioned[n.id] = true
			ops["partition"]++
		case op == 2 && len(live(cut)) > 0:
			ns := live(cut)
			n := ns[rng.IntN(len(ns))]
			n.proxy.heal()
			delete(partitioned, n.id)
			ops["heal"]++
		case op == 3 && len(c.nodes) < 4:
			c.join(fmt.Sprintf("j%d", next))
			next++
			ops["join"]++
		case op == 4 && len(live(reachable)) >= 2:
			ns := live(reachable)
			c.leave(ns[rng.IntN(len(ns))])
			ops["leave"]++
		case op == 5 && len(live(reachable)) >= 1:
			ns := live(reachable)
			c.deleteMemberKey(ns[rng.IntN(len(ns))])
			ops["member key deleted"]++
		case op == 6 && len(live(reachable)) >= 2:
			// A replica cut off while bursts of unrelated writes go under
			// the prefix, with another replica leaving before them and
			// one joining between them when the cluster's size allows.
			// Healed, it hears of the departure first and takes names
			// over, then gets etcd's catch-up batches (at most 1,000
			// revisions each, each with the store's current revision), one
			// of them with the join, while writes go on.
			ns := live(reachable)
			n := ns[rng.IntN(len(ns))]
			n.proxy.cut()
			partitioned[n.id] = true
			if others := live(reachable); len(others) >= 2 {
				c.leave(others[rng.IntN(len(others))])
			}
			if err := writeNoise(c.etcdAddrs(), c.prefix, "lag", 200+rng.IntN(400)); err != nil {
				t.Fatal(err)
			}
			if len(c.nodes) < 4 {
				c.join(fmt.Sprintf("j%d", next))
				next++
			}
			if err := writeNoise(c.etcdAddrs(), c.prefix, "lag", 1100+rng.IntN(400)); err != nil {
				t.Fatal(err)
			}
			wait := writeNoiseBehind(t, c.etcdAddrs(), c.prefix, "lag", 1000)
			n.proxy.heal()
			delete(partitioned, n.id)
			wait()
			ops["lag"]++
		case op == 7:
			// One member at a time, each fault ended and the cluster healthy
			// again before the next operation: quorum holds throughout.
			m := ec.members[rng.IntN(len(ec.members))]
			long := time.Duration(200+rng.IntN(2800)) * time.Millisecond
			switch rng.IntN(3) {
			case 0:
				ec.kill(m)
				time.Sleep(long)
				ec.restart(m)
				ops["member killed"]++
			case 1:
				ec.freeze(m)
				time.Sleep(long)
				ec.thaw(m)
				ops["member frozen"]++
			default:
				ec.isolate(m)
				time.Sleep(long)
				ec.rejoin(m)
				ops["member cut off"]++
			}
			ec.restore()
		default:
			ops["pause"]++
		}
		pause := time.Duration(100+rng.IntN(1400)) * time.Millisecond
		time.Sleep(pause)
		paused += pause
	}
	for _, n := range live(cut) {
		n.proxy.heal()
	}
	for len(c.nodes) < 3 { // the final check spreads names over three or more
		c.join(fmt.Sprintf("j%d", next))
		next++
	}
	var ids []string
	for id := range c.nodes {
		ids = append(ids, id)
	}
	took := c.waitPlacement(c.expected(ids), c.opts.TTL+10*time.Second)
	t.Logf("schedule of %v (seed %d): %v; converged on %v %v after the last heal; slowest Close or Leave %v",
		*scheduleFor, seed, ops, ids, took, c.slowestStop)
	for _, n := range live(everyone) {
		if st := n.r.Status(); st.Lease == "" || !slices.ContainsFunc(st.Members, func(m ha.MemberStatus) bool { return m.ID == n.id }) {
			t.Errorf("%s ends the schedule with lease %q and members %v", n.id, st.Lease, st.Members)
		}
	}
	c.rec.AssertNoOverlap(t)
}

// hostileParams are what the schedule registers: most names are the
// recorder's; every fourth name from the second lingers for 0.9 × Margin
// after its DoFunc's cancellation and in its StopFunc, as the contract
// allows; every fourth from the third has a DoFunc that, each time it
// starts, waits in RemoveControllerAndWait for the name after it and then
// registers that name again.
func (c *cluster) hostileParams(n *node, name string) controller.ControllerParams {
	i := slices.Index(c.names, name)
	switch i % 4 {
	case 1:
		return slowParams(c.rec, n.id, name, c.opts.Margin, false)
	case 2:
		other := c.names[(i+1)%len(c.names)]
		p := c.rec.Params(n.id, name)
		p.DoFunc = func(ctx context.Context) error {
			j := c.rec.Begin(n.id, name)
			if err := n.r.RemoveControllerAndWait(other); err == nil {
				_ = n.r.UpdateController(other, c.rec.Params(n.id, other))
			}
			<-ctx.Done()
			c.rec.Finish(name, j)
			return nil
		}
		return p
	}
	return c.rec.Params(n.id, name)
}

// deleteMemberKey deletes n's member key behind its back, as an operator
// might: n must write it again.
func (c *cluster) deleteMemberKey(n *node) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := n.cli.Delete(ctx, c.prefix+"/members/"+n.id); err != nil {
		c.t.Logf("deleting %s's member key: %v", n.id, err)
	}
}
