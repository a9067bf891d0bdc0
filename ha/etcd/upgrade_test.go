// Rolling upgrades: replicas of two versions that register different
// names, each name running on exactly one replica that registers it.

package etcd

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/bgctl/controller"
	"github.com/bgctl/controller/ha"
	"github.com/bgctl/controller/ha/internal/place"
	"github.com/bgctl/controller/ha/internal/probe"
	"github.com/bgctl/controller/ha/internal/runlog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// joinWith starts a replica named id and registers names on it, as a
// version of the service that has these controllers would.
func (c *cluster) joinWith(id string, names []string) *node {
	c.t.Helper()
	n := c.joinEmpty(id)
	for _, name := range names {
		if err := n.r.UpdateController(name, c.rec.Params(n.id, name)); err != nil {
			c.t.Fatal(err)
		}
	}
	return n
}

// assertRunsOnlyWhereRegistered fails the test for any name that runs
// on a replica that does not register it, or runs though no member of
// regs registers it.
func (c *cluster) assertRunsOnlyWhereRegistered(regs map[string][]string) {
	c.t.Helper()
	for name, where := range c.rec.Placement() {
		if !slices.Contains(regs[where], name) {
			c.t.Errorf("%s runs on %s, which does not register it", name, where)
		}
	}
}

// The case: replica old registers common; new registers common
// and new-0 … new-5. Hashed over both members, new-2, new-4 and new-5
// were owned by old, and ran nowhere, silently. Owned among the members
// that register them, they run on new.
func TestRollingUpgradeRunsAddedNames(t *testing.T) {
	c := newCluster(t, 0, testOptions())
	common := runlog.Names("common", 20)
	regs := map[string][]string{"old": common, "new": append(slices.Clone(common), runlog.Names("new", 6)...)}
	c.joinWith("old", regs["old"])
	c.waitPlacement(place.Expected(map[string][]string{"old": common}), 10*time.Second)
	c.joinWith("new", regs["new"])
	want := place.Expected(regs)
	took := c.waitPlacement(want, c.opts.TTL+5*time.Second)
	t.Logf("every name runs on a replica that registers it %v after new joined", took)
	c.assertRunsOnlyWhereRegistered(regs)
	for _, id := range []string{"old", "new"} {
		for _, ns := range c.nodes[id].r.Status().Names {
			if ns.Owner != want[ns.Name] || ns.OwnerUnconfirmed {
				t.Errorf("%s's status: %+v, want owner %s, confirmed", id, ns, want[ns.Name])
			}
		}
	}
	c.rec.AssertNoOverlap(t)
}

// The reverse: a name the new version dropped runs on the old replica
// that still registers it, never on the new one.
func TestRollingUpgradeRunsDroppedNames(t *testing.T) {
	c := newCluster(t, 0, testOptions())
	common := runlog.Names("common", 20)
	regs := map[string][]string{"old": append(slices.Clone(common), runlog.Names("old", 6)...), "new": common}
	c.joinWith("old", regs["old"])
	c.waitPlacement(place.Expected(map[string][]string{"old": regs["old"]}), 10*time.Second)
	c.joinWith("new", regs["new"])
	want := place.Expected(regs)
	took := c.waitPlacement(want, c.opts.TTL+5*time.Second)
	t.Logf("every name runs on a replica that registers it %v after new joined", took)
	c.assertRunsOnlyWhereRegistered(regs)
	// Once old leaves, its own names run nowhere, and the others on new.
	c.leave(c.nodes["old"])
	delete(regs, "old")
	c.waitPlacement(place.Expected(regs), c.opts.TTL+5*time.Second)
	for name, where := range c.rec.Placement() {
		if strings.HasPrefix(name, "old-") {
			t.Errorf("%s runs on %s after old left", name, where)
		}
	}
	c.rec.AssertNoOverlap(t)
}

// A member whose names differ and are not known (here a member key
// written by hand with a digest no replica has, and no set) counts as
// registering every name, and the names it owns are marked in Status,
// on the placement page and in the metric until it goes.
func TestUnconfirmedOwnerIsShown(t *testing.T) {
	c := newCluster(t, 0, testOptions())
	m := ha.NewMetrics(controller.MetricsOpts{})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	c.opts.Metrics = m
	n := c.joinWith("r0", runlog.Names("job", 20))
	op := newClient(t, testEtcd)
	defer op.Close()
	ctx := t.Context()
	l, err := op.Grant(ctx, 5)
	if err != nil {
		t.Fatal(err)
	}
	ka, err := op.KeepAlive(ctx, l.ID)
	if err != nil {
		t.Fatal(err)
	}
	go func() { // ends with the test's context, which closes ka
		for range ka {
		}
	}()
	if _, err := op.Put(ctx, c.prefix+"/members/ghost", memberValue("ghost", strings.Repeat("f", 32), false), clientv3.WithLease(l.ID)); err != nil {
		t.Fatal(err)
	}
	ghostly := func() (marked []string) {
		for _, ns := range n.r.Status().Names {
			if ns.OwnerUnconfirmed {
				if ns.Owner != "ghost" {
					t.Errorf("%s marked, owned by %s", ns.Name, ns.Owner)
				}
				marked = append(marked, ns.Name)
			}
		}
		return marked
	}
	want := place.On(place.Expected(map[string][]string{"r0": runlog.Names("job", 20), "ghost": runlog.Names("job", 20)}), "ghost")
	deadline := time.Now().Add(5 * time.Second)
	for !slices.Equal(ghostly(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("marked %v, want %v", ghostly(), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := testutil.ToFloat64(gaugeOf(m, "controllers_replica_names_owner_unconfirmed")); int(got) != len(want) {
		t.Errorf("gauge %v, want %d", got, len(want))
	}
	srv := httptest.NewServer(ha.StatusHandler(n.r))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "?format=text&marked=1")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), fmt.Sprintf(", %d whose owner may not register them\n", len(want))) ||
		!strings.Contains(string(body), "owner may not register it   "+want[0]) {
		t.Errorf("page:\n%s", body)
	}
	if _, err := op.Revoke(context.Background(), l.ID); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); len(ghostly()) > 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("still marked after ghost went: %v", ghostly())
		}
	}
	if got := testutil.ToFloat64(gaugeOf(m, "controllers_replica_names_owner_unconfirmed")); got != 0 {
		t.Errorf("gauge %v after ghost went", got)
	}
}

// gaugeOf returns the one metric of m named name, as a collector.
func gaugeOf(m *ha.Metrics, name string) prometheus.Collector {
	return collectorFunc(func(ch chan<- prometheus.Metric) {
		all := make(chan prometheus.Metric, 64)
		m.Collect(all)
		close(all)
		for metric := range all {
			if strings.Contains(metric.Desc().String(), `"`+name+`"`) {
				ch <- metric
			}
		}
	})
}

type collectorFunc func(chan<- prometheus.Metric)

func (f collectorFunc) Describe(ch chan<- *prometheus.Desc) { prometheus.DescribeByCollect(f, ch) }
func (f collectorFunc) Collect(ch chan<- prometheus.Metric) { f(ch) }

var upgradeScheduleFor = flag.Duration("ha.upgradeschedule", 8*time.Second, "how long TestRandomUpgradeSchedule runs its schedule (CI: 20s)")

// TestRandomUpgradeSchedule is TestRandomSchedule for a rolling upgrade:
// replicas of version a (shared and a-only names) are replaced one at a
// time by replicas of version b (shared and b-only names): a b joins,
// then an a leaves or crashes; between the steps replicas crash, restart
// in either version (a rollback) and leave. Every name registered by a
// live member must then run on exactly one member that registers it
// within TTL + 1.5s of the schedule's end, and no name may ever run on
// two replicas at once. The seed is TestRandomSchedule's flag; the
// duration is -ha.upgradeschedule.
func TestRandomUpgradeSchedule(t *testing.T) {
	seed := *scheduleSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (replay: go test -race -run TestRandomUpgradeSchedule -ha.seed=%d -ha.upgradeschedule=%v)", seed, seed, *upgradeScheduleFor)
	rng := rand.New(rand.NewPCG(seed, 0x5550))
	c := newCluster(t, 0, testOptions())
	shared := runlog.Names("shared", 40)
	versions := map[string][]string{
		"a": append(slices.Clone(shared), runlog.Names("a-only", 10)...),
		"b": append(slices.Clone(shared), runlog.Names("b-only", 10)...),
	}
	// Half the shared names linger in their StopFunc and after their
	// cancellation, as the contract allows.
	params := func(n *node, name string) controller.ControllerParams {
		if i := slices.Index(shared, name); i >= 0 && i%2 == 1 {
			return slowParams(c.rec, n.id, name, c.opts.Margin, false)
		}
		return c.rec.Params(n.id, name)
	}
	version := map[string]string{} // of each live node
	next := 0
	join := func(v string) {
		id := fmt.Sprintf("%s%d", v, next)
		next++
		n := c.joinEmpty(id)
		for _, name := range versions[v] {
			if err := n.r.UpdateController(name, params(n, name)); err != nil {
				t.Fatal(err)
			}
		}
		version[id] = v
	}
	stop := func(n *node, crash bool) {
		delete(version, n.id)
		if crash {
			c.crash(n)
		} else {
			c.leave(n)
		}
	}
	of := func(v string) []*node {
		var ns []*node
		for id, n := range c.nodes {
			if v == "" || version[id] == v {
				ns = append(ns, n)
			}
		}
		slices.SortFunc(ns, func(a, b *node) int { return strings.Compare(a.id, b.id) })
		return ns
	}
	for range 3 {
		join("a")
	}
	ops := map[string]int{}
	// Each pause comes before its operation, so that the schedule ends on
	// an operation and the bound counts from it.
	for paused := time.Duration(0); paused < *upgradeScheduleFor; {
		pause := time.Duration(100+rng.IntN(1400)) * time.Millisecond
		time.Sleep(pause)
		paused += pause
		switch op := rng.IntN(6); {
		case op == 0 && len(of("a")) > 0: // the upgrade's step
			join("b")
			as := of("a")
			stop(as[rng.IntN(len(as))], rng.IntN(3) == 0)
			ops["upgrade step"]++
		case op == 2 && len(c.nodes) >= 2:
			ns := of("")
			stop(ns[rng.IntN(len(ns))], true)
			ops["crash"]++
		case (op == 1 || op == 3) && len(c.nodes) < 5:
			v := "b"
			if rng.IntN(2) == 0 {
				v = "a" // a rollback, or a replica of a restarted
			}
			join(v)
			ops["join "+v]++
		case op == 4 && len(c.nodes) >= 2:
			ns := of("")
			stop(ns[rng.IntN(len(ns))], false)
			ops["leave"]++
		default:
			ops["pause"]++
		}
	}
	regs := map[string][]string{}
	for id, v := range version {
		regs[id] = versions[v]
	}
	bound := c.opts.TTL + 1500*time.Millisecond
	took := c.waitPlacement(place.Expected(regs), bound)
	t.Logf("schedule of %v (seed %d): %v; live %v; every registered name ran on one member registering it %v after the end (bound TTL + 1.5s = %v)", *upgradeScheduleFor, seed, ops, version, took, bound)
	c.assertRunsOnlyWhereRegistered(regs)
	for _, n := range of("") {
		for _, ns := range n.r.Status().Names {
			if ns.OwnerUnconfirmed {
				t.Errorf("%s: %s's owner %s still unconfirmed", n.id, ns.Name, ns.Owner)
			}
		}
	}
	c.rec.AssertNoOverlap(t)
}

// A listing is read a page at a time, every page at the first page's
// revision: it holds every key under the prefix, in order, and none
// written after it began; a listing at an earlier revision holds what
// was there then, keys only when asked.
func TestListingReadsEveryPageAtOneRevision(t *testing.T) {
	n, prefix := listingNode(t, 4)
	ctx := context.Background()
	var want []string
	for i := range 23 {
		key := fmt.Sprintf("%sk%02d", prefix, i)
		want = append(want, key)
		if _, err := n.cli.Put(ctx, key, "v"); err != nil {
			t.Fatal(err)
		}
	}
	keysOf := func(kvs []*mvccpb.KeyValue) []string {
		var got []string
		for _, kv := range kvs {
			got = append(got, string(kv.Key))
		}
		return got
	}
	kvs, rev, err := n.etcd().listAll(ctx, prefix, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := keysOf(kvs); !slices.Equal(got, want) {
		t.Fatalf("listing in pages of 4 read %d keys %v, want the %d put", len(got), got, len(want))
	}
	if kvs[0].Value == nil || string(kvs[0].Value) != "v" {
		t.Errorf("listing read no value for %s", kvs[0].Key)
	}
	if _, err := n.cli.Put(ctx, prefix+"k00x", "later"); err != nil { // sorts into the first page
		t.Fatal(err)
	}
	kvs, _, err = n.etcd().listAll(ctx, prefix, rev, clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	if got := keysOf(kvs); !slices.Equal(got, want) {
		t.Errorf("listing at revision %d read %v, want the %d keys then", rev, got, len(want))
	}
	if kvs[0].Value != nil {
		t.Errorf("a keys-only listing read the value %q", kvs[0].Value)
	}
}

// A replica of a new version whose watch delivers nothing (held from its
// start, as one stuck behind a join's releases is) still learns the set
// the old member publishes, by reading it: the names only it registers
// run on it well before a relist (the watch is replaced after window +
// a keepalive period, 9.4 s at TTL 10 s) would have brought the set.
func TestPublishedSetIsReadAheadOfTheWatch(t *testing.T) {
	opts := testOptions()
	opts.TTL, opts.Margin = 10*time.Second, 2500*time.Millisecond
	c := newCluster(t, 0, opts)
	common := runlog.Names("common", 20)
	added := runlog.Names("added", 12)
	regs := map[string][]string{"old": common, "new": append(slices.Clone(common), added...)}
	c.joinWith("old", regs["old"])
	c.waitPlacement(place.Expected(map[string][]string{"old": common}), 10*time.Second)

	st := newWatchStaller(t, testEtcd)
	st.stallNew()
	n := c.newNodeVia("new", st.addr())
	for _, name := range regs["new"] {
		if err := n.r.UpdateController(name, c.rec.Params(n.id, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := n.r.Join(context.Background()); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for _, name := range added {
		want[name] = "new"
	}
	took := c.waitPlacement(want, probe.Window(opts))
	t.Logf("new's watch held from its start: the names only it registers ran on it %v after Join (old publishes its set %v after it sees new; a relist comes after %v)",
		took, probe.RenewEvery(c.opts), probe.Window(c.opts)+probe.RenewEvery(c.opts))
	if st.heldFrames() == 0 {
		t.Error("the staller held no frame: new's watch never stalled, and this test showed nothing")
	}
	c.rec.AssertNoOverlap(t)
}
