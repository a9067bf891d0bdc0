// Leases the server ends early: a replica's lease revoked by another
// client while its DoFuncs run, one replica's or every replica's at once,
// never lets a name start elsewhere before its DoFunc returned; a lease
// that simply ran out still moves the names at once.

package ha

import (
	"context"
	"io"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bgctl/controller"
	"github.com/sirupsen/logrus"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// revokeLeases revokes the leases of the given replicas from a client of
// the test's own, as an operator (or a stale etcd leader) would, one
// right after the other.
func revokeLeases(t *testing.T, admin *clientv3.Client, nodes ...*node) {
	t.Helper()
	var leases []clientv3.LeaseID
	for _, n := range nodes {
		n.r.mu.Lock()
		leases = append(leases, n.r.lease)
		n.r.mu.Unlock()
	}
	for i, l := range leases {
		if l == 0 {
			t.Fatalf("%s holds no lease to revoke", nodes[i].id)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := admin.Revoke(ctx, l)
		cancel()
		if err != nil {
			t.Fatalf("revoking %s's lease: %v", nodes[i].id, err)
		}
	}
}

// waitRestarted waits until every name of want runs where want says, in
// a run that started after since, and returns how long after since that
// was; it fails the test after limit.
func (c *cluster) waitRestarted(want map[string]string, since time.Duration, limit time.Duration) time.Duration {
	c.t.Helper()
	deadline := time.Now().Add(limit)
	for {
		c.rec.mu.Lock()
		missing, last := 0, since
		for name, where := range want {
			runs := c.rec.runs[name]
			if len(runs) == 0 {
				missing++
				continue
			}
			run := runs[len(runs)-1]
			if run.replica != where || run.end >= 0 || run.start < since {
				missing++
			}
			last = max(last, run.start)
		}
		c.rec.mu.Unlock()
		if missing == 0 {
			return last - since
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("after %v, %d of %d names have not started again where expected", limit, missing, len(want))
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// onlyOn returns the part of want whose names were on the given replicas
// in the placement of three, r0 to r2.
func onlyOn(want map[string]string, replicas ...string) map[string]string {
	part := make(map[string]string)
	for name, r := range want {
		if slices.Contains(replicas, r) {
			part[name] = r
		}
	}
	return part
}

// slowCluster is three replicas of 30 names whose DoFuncs and StopFuncs
// go on for 0.9 × Margin after their cancellation, as the contract
// allows.
func slowCluster(t *testing.T) (*cluster, map[string]string) {
	opts := testOptions()
	c := newCluster(t, 30, opts)
	c.params = func(n *node, name string) controller.ControllerParams {
		return slowParams(c.rec, n.id, name, opts.Margin, false)
	}
	want, _ := c.startThree()
	return c, want
}

// A replica whose lease another client revokes while its DoFuncs run
// stops them at once, and the names start elsewhere only once they have
// returned. Before the fix, a revoke gave 92–96 overlapping starts at TTL
// 2s.
func TestRevokedLeaseNeverOverlaps(t *testing.T) {
	c, want := slowCluster(t)
	admin := newClient(t, testEtcd)
	defer admin.Close()
	for round := range 4 {
		victim := c.nodes[[]string{"r0", "r1", "r2"}[round%3]]
		revoked := c.rec.now()
		revokeLeases(t, admin, victim)
		// The victim joins again under a new lease; its names start
		// again where they belong.
		took := c.waitRestarted(onlyOn(want, victim.id), revoked, 3*c.opts.TTL+10*time.Second)
		t.Logf("round %d: %s's lease revoked; its names running again %v later", round, victim.id, took.Round(time.Millisecond))
		c.rec.assertNoOverlap(t)
		if t.Failed() {
			t.Fatalf("round %d overlapped", round)
		}
	}
}

// A stale etcd leader that wakes up revokes every live lease at once:
// every replica stops, joins again, and lists the keys afresh, without
// seeing the others' claims go (the more so when its own lease went a
// moment before theirs). No name starts before its last holder's DoFunc
// returned.
func TestEveryLeaseRevokedAtOnceNeverOverlaps(t *testing.T) {
	c, want := slowCluster(t)
	admin := newClient(t, testEtcd)
	defer admin.Close()
	for round := range 4 {
		revoked := c.rec.now()
		if round%2 == 0 {
			revokeLeases(t, admin, c.nodes["r0"], c.nodes["r1"], c.nodes["r2"])
		} else {
			// r0 first: it stops, and lists afresh while the others'
			// DoFuncs, revoked while it was not watching, still return.
			revokeLeases(t, admin, c.nodes["r0"])
			time.Sleep(c.opts.Margin / 5)
			revokeLeases(t, admin, c.nodes["r1"], c.nodes["r2"])
		}
		took := c.waitRestarted(want, revoked, 3*c.opts.TTL+10*time.Second)
		t.Logf("round %d: every lease revoked; every name running again %v later", round, took.Round(time.Millisecond))
		c.rec.assertNoOverlap(t)
		if t.Failed() {
			t.Fatalf("round %d overlapped", round)
		}
	}
}

// A victim that is cut off from etcd when its lease is revoked learns of
// it from neither its watch nor a keepalive: the others wait for its
// names until its fence has surely passed and its DoFuncs returned (TTL
// after they saw the lease end), and never start them earlier.
func TestRevokedLeaseOfACutOffReplicaWaitsItsFence(t *testing.T) {
	c, placed := slowCluster(t)
	admin := newClient(t, testEtcd)
	defer admin.Close()
	victim := c.nodes["r0"]
	victim.proxy.cut()
	revoked := c.rec.now()
	revokeLeases(t, admin, victim)
	after := c.expected([]string{"r1", "r2"})
	moved := make(map[string]string)
	for _, name := range namesOn(placed, "r0") {
		moved[name] = after[name]
	}
	took := c.waitRestarted(moved, revoked, 3*c.opts.TTL+10*time.Second)
	t.Logf("r0 cut off and its lease revoked: its names run elsewhere %v later (TTL %v)", took.Round(time.Millisecond), c.opts.TTL)
	c.rec.assertNoOverlap(t)
	victim.proxy.heal()
}

// infoCounter counts a test's Info lines that start with prefix.
type infoCounter struct {
	prefix string
	n      atomic.Int64
}

func (c *infoCounter) Levels() []logrus.Level { return []logrus.Level{logrus.InfoLevel} }

func (c *infoCounter) Fire(e *logrus.Entry) error {
	if strings.HasPrefix(e.Message, c.prefix) {
		c.n.Add(1)
	}
	return nil
}

// A member that stops renewing (cut off from etcd) shows as not renewing
// in the others' Status, with the time since its last renewal growing,
// well before its lease runs out, and they log it at Info, once; its
// departure is logged when its lease ends. Before, the page read "ok"
// until the names moved.
func TestAMemberThatStopsRenewingIsShown(t *testing.T) {
	opts := testOptions()
	opts.TTL, opts.Margin = 4*time.Second, time.Second
	l := logrus.New()
	l.SetOutput(io.Discard)
	l.SetLevel(logrus.InfoLevel)
	stale := &infoCounter{prefix: `member "r0" has not renewed its lease`}
	gone := &infoCounter{prefix: `member "r0" is gone`}
	l.AddHook(stale)
	l.AddHook(gone)
	c := newCluster(t, 3, opts)
	victim := c.join("r0")
	c.opts.Logger = l
	watcher := c.join("r1")
	waitFor(t, "r1 to read r0's lease", func() bool {
		for _, m := range watcher.r.Status().Members {
			if m.ID == "r0" && m.Renewed != nil {
				return !m.NotRenewing && time.Duration(*m.Renewed) < opts.TTL/2
			}
		}
		return false
	})
	victim.proxy.cut()
	cut := time.Now()
	var seen MemberStatus
	waitFor(t, "r1 to show r0 not renewing", func() bool {
		for _, m := range watcher.r.Status().Members {
			if m.ID == "r0" && m.NotRenewing {
				seen = m
				return true
			}
		}
		return false
	})
	took := time.Since(cut)
	t.Logf("r0 shown not renewing %v after the cut (renewed %v ago; TTL %v)", took.Round(time.Millisecond), seen.Renewed, opts.TTL)
	if took >= opts.TTL {
		t.Errorf("shown not renewing %v after the cut, not before its lease ran out (TTL %v)", took, opts.TTL)
	}
	if time.Duration(*seen.Renewed) < opts.TTL/2-time.Second {
		t.Errorf("r0 not renewing, but renewed %v ago", seen.Renewed)
	}
	waitFor(t, "r0 to be gone", func() bool { return gone.n.Load() > 0 })
	if n := stale.n.Load(); n != 1 {
		t.Errorf("%d Info lines about r0 not renewing, want 1", n)
	}
	victim.proxy.heal()
}
