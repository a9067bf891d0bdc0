// Tests of claiming in batches: names held elsewhere do not hold up the
// others, a server that takes fewer operations per transaction gets
// smaller batches, and a join holds no goroutine per name.

package etcd

import (
	"context"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bgctl/controller"
	"github.com/bgctl/controller/ha"
	"github.com/bgctl/controller/ha/internal/probe"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// idleParams run once and then wait an hour.
func idleParams(ran *atomic.Int64) controller.ControllerParams {
	return controller.ControllerParams{
		DoFunc:      func(context.Context) error { ran.Add(1); return nil },
		RunInterval: time.Hour,
	}
}

// joinIdle registers names on n with idleParams, then joins, and returns
// how many DoFuncs ran.
func joinIdle(t *testing.T, n *node, names []string) *atomic.Int64 {
	t.Helper()
	var ran atomic.Int64
	for _, name := range names {
		if err := n.r.UpdateController(name, idleParams(&ran)); err != nil {
			t.Fatal(err)
		}
	}
	if err := n.r.Join(t.Context()); err != nil {
		t.Fatal(err)
	}
	return &ran
}

// awaitAcquired reads events until n names were acquired, and returns
// them.
func awaitAcquired(t *testing.T, events <-chan ha.Event, n int) map[string]bool {
	t.Helper()
	got := map[string]bool{}
	for len(got) < n {
		if ev := nextEvent(t, events); ev.Kind == ha.Acquired {
			got[ev.Name] = true
		}
	}
	return got
}

// Claims another lease holds make a batch's transaction fail: the replica
// then claims the rest, runs them, and waits for the held ones, which it
// takes as soon as their holder lets them go.
func TestHeldClaimsDoNotHoldUpTheBatch(t *testing.T) {
	c := newCluster(t, 300, testOptions())
	other := newClient(t, testEtcd)
	defer other.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	g, err := other.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	held := map[string]bool{}
	for i := 0; i < len(c.names); i += 30 { // one name in each batch or so
		name := c.names[i]
		if _, err := other.Put(ctx, c.prefix+"/claims/"+name, "other", clientv3.WithLease(g.ID)); err != nil {
			t.Fatal(err)
		}
		held[name] = true
	}
	n := c.newNode("solo")
	events := n.r.Events(t.Context())
	joinIdle(t, n, c.names)
	for name := range awaitAcquired(t, events, len(c.names)-len(held)) {
		if held[name] {
			t.Errorf("%s acquired while another lease holds its claim", name)
		}
	}
	if _, err := other.Revoke(ctx, g.ID); err != nil {
		t.Fatal(err)
	}
	for name := range awaitAcquired(t, events, len(held)) {
		if !held[name] {
			t.Errorf("%s acquired twice", name)
		}
	}
}

// A server started with --max-txn-ops below a batch refuses its
// transaction; the replica halves its batches until the server takes them,
// and claims every name.
func TestBatchesShrinkToTheServersMaxTxnOps(t *testing.T) {
	needEtcd(t)
	addr, stop, err := startEtcdOnce(testEtcdBin, "--max-txn-ops", "20")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	c := newCluster(t, 200, testOptions())
	n := c.newNodeVia("solo", addr)
	events := n.r.Events(t.Context())
	joinIdle(t, n, c.names)
	awaitAcquired(t, events, len(c.names))
	if got := probe.ClaimBatch(n.r); got > 20 || got < 10 {
		t.Errorf("batches of %d names against a server that takes 20 operations, want 16", got)
	}
	c.crash(n)
}

// A replica that joins with many names claims them with a few workers: the
// goroutines it holds beyond its controllers' stay bounded, where there
// used to be one per name until its claim was answered.
func TestJoinHoldsNoGoroutinePerName(t *testing.T) {
	const names = 3000
	c := newCluster(t, names, testOptions())
	base := runtime.NumGoroutine()
	n := c.newNode("solo")
	var ran atomic.Int64
	for _, name := range c.names {
		if err := n.r.UpdateController(name, idleParams(&ran)); err != nil {
			t.Fatal(err)
		}
	}
	// extra counts the goroutines beyond the controllers, or returns
	// false when a controller was installed while it counted.
	extra := func() (int, bool) {
		before := len(n.r.Manager().GetStatusModel())
		g := runtime.NumGoroutine()
		return g - base - before, len(n.r.Manager().GetStatusModel()) == before
	}
	if err := n.r.Join(t.Context()); err != nil {
		t.Fatal(err)
	}
	most, samples := 0, 0
	for deadline := time.Now().Add(30 * time.Second); ran.Load() < names; time.Sleep(time.Millisecond) {
		if e, exact := extra(); exact {
			most, samples = max(most, e), samples+1
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d names ran within 30s", ran.Load(), names)
		}
	}
	t.Logf("at most %d goroutines beyond the controllers while %d names were claimed (%d samples)", most, names, samples)
	if most > 200 {
		t.Errorf("%d goroutines beyond the controllers while %d names were claimed: one per name?", most, names)
	}
}

// A server whose gRPC limit (--max-request-bytes plus etcd's 512 KiB of
// overhead) refuses a whole batch as too large, and whose --max-txn-ops
// then refuses the halved chunk as too many operations: every refusal
// must shrink the next chunk, and every name must be claimed. Names of
// 3,000 bytes make a batch of 128 about 780 KB, above the 576 KiB the
// server's gRPC takes; 64 pass it and meet --max-txn-ops 20; 16 pass that
// and exceed --max-request-bytes itself (64 KiB, ErrRequestTooLarge).
func TestBatchesShrinkForTooLargeThenTooManyOps(t *testing.T) {
	needEtcd(t)
	addr, stop, err := startEtcdOnce(testEtcdBin, "--max-txn-ops", "20", "--max-request-bytes", "65536")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	c := newCluster(t, 0, testOptions())
	long := strings.Repeat("x", 3000)
	for i := range 256 {
		c.names = append(c.names, long+"-"+strconv.Itoa(i))
	}
	n := c.newNodeVia("solo", addr)
	ran := joinIdle(t, n, c.names)
	const limit = 20 * time.Second
	for deadline := time.Now().Add(limit); ran.Load() < int64(len(c.names)); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d names ran within %v (claim batch %d): the refused chunks did not shrink", ran.Load(), len(c.names), limit, probe.ClaimBatch(n.r))
		}
	}
	if got := probe.ClaimBatch(n.r); got > 20 {
		t.Errorf("batches of %d names against a server that takes 20 operations", got)
	}
	c.crash(n)
}
