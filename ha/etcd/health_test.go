// Tests of Health against etcd: a replica through a quiet spell, a
// partition, a same-ID replica and its Close (the reasons' table is in
// package ha).

package etcd

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/bgctl/controller/ha"
	"github.com/bgctl/controller/ha/internal/probe"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A replica is healthy once joined and stays so through a quiet spell
// longer than TTL − Margin (its watch, asked for progress, keeps it
// current); a partition makes it report no lease, and the heal healthy
// again; a same-ID replica's key makes it report the duplicate; Close,
// closed. HealthHandler serves each as 200 or 503.
func TestHealthAgainstEtcd(t *testing.T) {
	opts := testOptions()
	c := newCluster(t, 3, opts)
	n := c.join("solo")
	want := c.expected([]string{"solo"})
	c.waitPlacement(want, 10*time.Second)
	h := ha.HealthHandler(n.r)
	if err := n.r.Health(); err != nil {
		t.Fatalf("Health after joining: %v", err)
	}
	time.Sleep(probe.Window(opts) + 500*time.Millisecond) // nothing changes meanwhile
	if err := n.r.Health(); err != nil {
		t.Fatalf("Health after a quiet %v: %v", probe.Window(opts)+500*time.Millisecond, err)
	}
	if resp, body := get(t, h, http.MethodGet, "/readyz", ""); resp.StatusCode != http.StatusOK || body != "ok\n" {
		t.Errorf("HealthHandler of a healthy replica: %d %q", resp.StatusCode, body)
	}

	n.proxy.cut()
	waitFor(t, "Health to report no lease", func() bool { return errors.Is(n.r.Health(), ha.ErrNoLease) })
	err := n.r.Health()
	if !errors.Is(err, ha.ErrFencePassed) || !strings.Contains(err.Error(), `replica "solo": no lease: its fence passed`) {
		t.Errorf("Health while cut off: %v", err)
	}
	if resp, body := get(t, h, http.MethodGet, "/readyz", ""); resp.StatusCode != http.StatusServiceUnavailable || body != err.Error()+"\n" {
		t.Errorf("HealthHandler while cut off: %d %q", resp.StatusCode, body)
	}
	n.proxy.heal()
	waitFor(t, "Health to be nil after the heal", func() bool { return n.r.Health() == nil })
	c.waitPlacement(want, 10*time.Second)

	admin := newClient(t, testEtcd)
	defer admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	other, err := admin.Grant(ctx, 30)
	if err != nil {
		t.Fatal(err)
	}
	key := c.prefix + "/members/solo"
	if _, err := admin.Put(ctx, key, "solo", clientv3.WithLease(other.ID)); err != nil {
		t.Fatal(err)
	}
	// Between the two, while its controllers stop, it reports the fence
	// passed for the duplicate ID and still holds its lease.
	waitFor(t, "Health to report the duplicate ID, and no lease once the controllers stopped", func() bool {
		err := n.r.Health()
		return errors.Is(err, ha.ErrDuplicateID) && errors.Is(err, ha.ErrNoLease)
	})
	if _, err := admin.Revoke(ctx, other.ID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "Health to be nil once the other lease is gone", func() bool { return n.r.Health() == nil })
	c.waitPlacement(want, 10*time.Second)

	c.leave(n)
	if err := n.r.Health(); !errors.Is(err, ha.ErrClosed) {
		t.Errorf("Health after Leave: %v, want ErrClosed", err)
	}
	c.rec.AssertNoOverlap(t)
}
