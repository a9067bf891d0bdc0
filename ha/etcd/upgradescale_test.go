// The cost of knowing who registers what, at scale: etcd writes and bytes
// of replicas that all register the same names, memory per name, and how
// long a group takes to converge when a new version adds names.

package etcd

import (
	"context"
	"flag"
	"testing"
	"time"

	"github.com/bgctl/controller/ha/internal/place"
	"github.com/bgctl/controller/ha/internal/probe"
	"github.com/bgctl/controller/ha/internal/runlog"
)

var (
	upgradeScale = flag.Int("ha.upgradescale", 0, "run TestUpgradeScaleMeasurement with this many names (issue 25: 100000)")
	upgradeAdd   = flag.Int("ha.upgradeadd", 1000, "the names the new version of TestUpgradeScaleMeasurement adds (0: measure the same-names case alone)")
	upgradeTTL   = flag.Duration("ha.upgradettl", 0, "the TTL of TestUpgradeScaleMeasurement's replicas (0: the tests' 2s; Margin: TTL/4)")
)

// TestUpgradeScaleMeasurement measures, for -ha.upgradescale names over
// three replicas that register them all and join together, the etcd
// writes (revisions) and bytes (both ways through each replica's proxy)
// per replica until every name runs where it belongs, and 3 s more of
// steady state; then a replica of a new version joins, registering
// -ha.upgradeadd names more, and the time until the added names run on
// it is reported against TTL + 5 s, with the time until every name runs
// on a replica that registers it, the join's usual moves included. Memory per
// name: TestScaleMeasurement. A measurement run on demand, without -race:
//
//	go test -run TestUpgradeScaleMeasurement -ha.upgradescale=100000 [-ha.upgradettl=10s] -v -timeout 20m .
func TestUpgradeScaleMeasurement(t *testing.T) {
	n := *upgradeScale
	if n == 0 {
		t.Log("a measurement, not a test: run it with -ha.upgradescale=100000")
		return
	}
	opts := testOptions()
	if *upgradeTTL != 0 {
		opts.TTL, opts.Margin = *upgradeTTL, *upgradeTTL/4
	}
	c := newCluster(t, n, opts)
	ids := []string{"r0", "r1", "r2"}
	var nodes []*node
	for _, id := range ids {
		nodes = append(nodes, c.newNode(id))
	}
	c.registerTogether(nodes)
	op := newClient(t, testEtcd)
	defer op.Close()
	revision := func() int64 { return etcdRevision(t, op) }
	rev0 := revision()
	w := c.watchEvents(nodes)
	want := c.expected(ids)
	start := time.Now()
	c.joinTogether(nodes)
	converged := w.await(t, want, start, 2*time.Minute)
	c.waitPlacement(want, 2*time.Minute)
	time.Sleep(3 * time.Second) // the steady state: keepalives, progress requests
	w.stop()
	writes := revision() - rev0
	var bytes int64
	for _, nd := range nodes {
		bytes += nd.proxy.bytes.Load()
	}
	t.Logf("upgrade scale: %d names, the same on 3 replicas: converged %v after they joined; per replica %.0f etcd writes (revisions), %.1f MB through its proxy, to convergence and 3 s after",
		n, converged.Round(time.Millisecond), float64(writes)/3, float64(bytes)/3/1e6)
	// A fourth replica joins, of a new version adding -ha.upgradeadd
	// names (0: of the same version, the baseline: a join moves a quarter
	// of the names whatever the version).
	added := runlog.Names("added", *upgradeAdd)
	names := append(append([]string(nil), c.names...), added...)
	regs := map[string][]string{"r0": c.names, "r1": c.names, "r2": c.names, "v2": names}
	want = place.Expected(regs)
	rev0 = revision()
	v2 := c.newNode("v2") // registers before it joins, as New's documentation asks
	for _, name := range names {
		if err := v2.r.UpdateController(name, c.rec.Params(v2.id, name)); err != nil {
			t.Fatal(err)
		}
	}
	start = time.Now()
	if err := v2.r.Join(context.Background()); err != nil {
		t.Fatal(err)
	}
	joined := time.Since(start)
	var knew time.Duration
	for {
		members, all := probe.Confirmed(v2.r)
		done := members == 4 && all
		if done {
			knew = time.Since(start)
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	addedWant := map[string]string{}
	for _, name := range added {
		addedWant[name] = want[name]
	}
	c.waitPlacement(addedWant, 2*time.Minute)
	addedTook := time.Since(start)
	c.waitPlacement(want, 2*time.Minute)
	took := time.Since(start)
	t.Logf("upgrade scale: a replica adding %d names joined (Join took %v; TTL %v; it knew the others' names after %v): the added names all ran on it %v after Join was called (%s); every name ran on a replica registering it after %v, the join's share of %d moved names included; %d etcd writes meanwhile",
		*upgradeAdd, joined.Round(time.Millisecond), c.opts.TTL, knew.Round(time.Millisecond), addedTook.Round(time.Millisecond), within(addedTook, c.opts.TTL+5*time.Second), took.Round(time.Millisecond), len(place.On(want, "v2"))-len(added), revision()-rev0)
	c.assertRunsOnlyWhereRegistered(regs)
	c.rec.AssertNoOverlap(t)
	for _, nd := range c.nodes {
		c.leave(nd)
	}
}
