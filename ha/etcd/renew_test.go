// The hedged keepalive: one endpoint that holds requests does not hold the
// fence.

package etcd

import (
	"context"
	"testing"
	"time"
)

// A client with two endpoints, one of which stops passing bytes while its
// connection stays up (as a member whose peers are gone holds a forwarded
// renewal), keeps its fence open: keepalives that wait on it are hedged
// on the other. Without the hedge, the first keepalive the balancer puts
// on the held connection waits until the fence passes.
func TestHeldEndpointDoesNotHoldTheFence(t *testing.T) {
	opts := testOptions()
	c := newCluster(t, 10, opts)
	held := newProxy(t, testEtcd)
	n := c.newNodeVia("r0", testEtcd)
	// The client gets the held endpoint besides its own proxy's; both
	// connections are up before the cut, so the balancer uses both.
	n.cli.SetEndpoints(held.addr(), n.proxy.addr())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.r.Join(ctx); err != nil {
		t.Fatal(err)
	}
	c.register(n)
	c.waitPlacement(c.expected([]string{"r0"}), 10*time.Second)
	for range 10 { // a request on each connection, surely
		if _, err := n.cli.Get(ctx, "/held"); err != nil {
			t.Fatal(err)
		}
	}

	passed := fencesPassed.n.Load()
	from := c.rec.Now()
	held.cut()
	time.Sleep(3 * opts.TTL)
	stop, name := c.rec.LongestStop(c.names, from, c.rec.Now())
	held.heal()
	if p := fencesPassed.n.Load() - passed; p != 0 {
		t.Errorf("%d fences passed while one of two endpoints held its requests; want none", p)
	}
	if stop > 0 {
		t.Errorf("%s ran nowhere for %v", name, stop)
	}
	c.rec.AssertNoOverlap(t)
}
