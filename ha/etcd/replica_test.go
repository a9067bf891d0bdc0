// Scenarios against a real etcd: an even split, a crash, a partition and
// its healing, a graceful leave, the leader mode; each asserts that no
// name ever ran on two replicas at once.

package etcd

import (
	"context"
	"testing"
	"time"

	"github.com/bgctl/controller/ha"
	"github.com/bgctl/controller/ha/internal/place"
)

const scenarioNames = 90

func TestThreeReplicasSplitEvenly(t *testing.T) {
	c := newCluster(t, scenarioNames, testOptions())
	ids := []string{"r0", "r1", "r2"}
	want, took := c.startThree()
	for _, id := range ids {
		n := len(place.On(want, id))
		if n < scenarioNames/6 || n > scenarioNames/2 {
			t.Errorf("%s runs %d of %d names; an even split is %d", id, n, scenarioNames, scenarioNames/3)
		}
		t.Logf("%s runs %d names", id, n)
	}
	t.Logf("converged in %v", took)
	// The status agrees with what runs.
	for _, id := range ids {
		st := c.nodes[id].r.Status()
		for _, ns := range st.Names {
			if ns.Owner != want[ns.Name] {
				t.Errorf("%s's status: %s owned by %s, want %s", id, ns.Name, ns.Owner, want[ns.Name])
			}
			if (ns.State == "running") != (want[ns.Name] == id) {
				t.Errorf("%s's status: %s is %q", id, ns.Name, ns.State)
			}
		}
		if got := len(c.nodes[id].r.GetStatusModel()); got != len(place.On(want, id)) {
			t.Errorf("%s's GetStatusModel has %d controllers, want %d", id, got, len(place.On(want, id)))
		}
	}
	c.rec.AssertNoOverlap(t)
}

func TestCrashHandsOverWithinTTL(t *testing.T) {
	c := newCluster(t, scenarioNames, testOptions())
	c.startThree()
	c.crash(c.nodes["r0"])
	limit := c.opts.TTL + 1500*time.Millisecond
	took := c.waitPlacement(c.expected([]string{"r1", "r2"}), limit+5*time.Second)
	t.Logf("crash: r0's names all run elsewhere %v after the crash (limit %v)", took, limit)
	if took > limit {
		t.Errorf("takeover took %v, more than TTL + 1.5s = %v", took, limit)
	}
	c.rec.AssertNoOverlap(t)
}

func TestPartitionedReplicaStopsBeforeOthersStart(t *testing.T) {
	c := newCluster(t, scenarioNames, testOptions())
	all, _ := c.startThree()
	r0 := c.nodes["r0"]
	moved := place.On(all, "r0")

	cutAt := c.rec.Now()
	r0.proxy.cut()
	took := c.waitPlacement(c.expected([]string{"r1", "r2"}), c.opts.TTL+6*time.Second)
	lastEnd, firstOther := c.rec.Handover("r0", moved, cutAt)
	t.Logf("partition: r0 stopped %v after the cut; another replica started its first name %v after the cut (gap %v); all moved in %v",
		lastEnd-cutAt, firstOther-cutAt, firstOther-lastEnd, took)
	if firstOther < 0 || lastEnd >= firstOther {
		t.Errorf("r0 ran until %v, another replica started at %v", lastEnd, firstOther)
	}

	r0.proxy.heal()
	back := c.waitPlacement(all, 10*time.Second)
	t.Logf("heal: r0 runs its share again %v after healing", back)
	if back > time.Second {
		t.Errorf("r0 got its share back after %v, more than 1s", back)
	}
	c.rec.AssertNoOverlap(t)
}

func TestGracefulLeaveMovesNamesAtOnce(t *testing.T) {
	c := newCluster(t, scenarioNames, testOptions())
	c.startThree()
	go c.nodes["r0"].r.Leave(context.Background()) // joined by the c.leave below
	took := c.waitPlacement(c.expected([]string{"r1", "r2"}), 5*time.Second)
	t.Logf("leave: r0's names all run elsewhere %v after Leave was called", took)
	if took > 200*time.Millisecond {
		t.Errorf("a graceful leave moved the names in %v, more than 200ms", took)
	}
	c.leave(c.nodes["r0"])
	c.rec.AssertNoOverlap(t)
}

func TestLeaderModeRunsEverythingOnTheOldest(t *testing.T) {
	opts := testOptions()
	opts.Mode = ha.Leader
	c := newCluster(t, 20, opts)
	for _, id := range []string{"r2", "r0", "r1"} { // r2 is the oldest
		c.join(id)
	}
	everything := func(id string) map[string]string {
		m := map[string]string{}
		for _, name := range c.names {
			m[name] = id
		}
		return m
	}
	c.waitPlacement(everything("r2"), 10*time.Second)
	c.join("r3")                       // a join moves nothing, not even for a moment
	time.Sleep(300 * time.Millisecond) // the window in which a move would show
	if n := c.rec.RanOn("r3"); n != 0 {
		t.Errorf("r3 ran %d times after it joined; in Leader mode a join moves nothing", n)
	}
	c.waitPlacement(everything("r2"), time.Second)
	c.leave(c.nodes["r2"])
	c.waitPlacement(everything("r0"), 5*time.Second)
	c.rec.AssertNoOverlap(t)
}
