// A genuine duplicate ID against a real etcd: the replica that finds its
// ID taken says so at Warn, rate-limited, and in Status, and joins again
// once the other is gone.

package etcd

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bgctl/controller/ha"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A replica cut off until its lease expired finds, once healed, another
// live replica joined under its ID. It retries, backing off to one attempt
// per TTL (TestDuplicateIDRejoinBacksOff); it must
// say why at Warn once, not at every attempt, show it in Status, and join
// again as soon as the other leaves.
func TestDuplicateIDIsReported(t *testing.T) {
	opts := testOptions()
	warned := countWarnings(&opts, "cannot join again")
	c := newCluster(t, 3, opts)
	a := c.join("r0")
	c.waitPlacement(c.expected([]string{"r0"}), 10*time.Second)
	a.proxy.cut()

	// The other replica of the same ID joins once a's lease, which a no
	// longer renews, has run out: its Join waits for that, as for a
	// crashed incarnation of itself.
	bcli := newClient(t, testEtcd)
	bopts := opts
	bopts.Prefix, bopts.ID = c.prefix, "r0"
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	start := time.Now()
	b, err := ha.Join(ctx, Store(bcli), bopts)
	cancel()
	if err != nil {
		t.Fatalf("the second r0's Join, while the first r0's lease runs out: %v", err)
	}
	t.Logf("the second r0 joined %v after it called Join", time.Since(start).Round(time.Millisecond))
	t.Cleanup(func() { b.Close(); bcli.Close() })
	for _, name := range c.names {
		if err := b.UpdateController(name, c.rec.Params("r0 (second)", name)); err != nil {
			t.Fatal(err)
		}
	}
	second := map[string]string{}
	for _, name := range c.names {
		second[name] = "r0 (second)"
	}
	c.waitPlacement(second, 10*time.Second)

	a.proxy.heal()
	const watchFor = 3 * time.Second // some nine attempts
	time.Sleep(watchFor)
	st := a.r.Status()
	t.Logf("%v after the heal: %d warnings; status: lease %q, join error %q", watchFor, warned.n.Load(), st.Lease, st.JoinError)
	if n := warned.n.Load(); n != 1 {
		t.Errorf("%d warnings about the duplicate ID in %v, want 1 (at Warn, at most once in that time)", n, watchFor)
	}
	if st.Lease != "" || !strings.Contains(st.JoinError, ha.ErrDuplicateID.Error()) {
		t.Errorf("the first r0's status: lease %q, join error %q; want no lease and an error that says %q", st.Lease, st.JoinError, ha.ErrDuplicateID)
	}

	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.Leave(ctx); err != nil {
		t.Fatalf("the second r0's Leave: %v", err)
	}
	took := c.waitPlacement(c.expected([]string{"r0"}), 10*time.Second)
	st = a.r.Status()
	t.Logf("the first r0 runs every name again %v after the second left; status: lease %q, join error %q", took, st.Lease, st.JoinError)
	if st.Lease == "" || st.JoinError != "" {
		t.Errorf("the first r0's status after it joined again: lease %q, join error %q; want a lease and no error", st.Lease, st.JoinError)
	}
	c.rec.AssertNoOverlap(t)
}

// countingLease counts the leases a replica's client grants, and when.
type countingLease struct {
	clientv3.Lease
	mu     sync.Mutex
	grants []time.Time // guarded by mu
}

func (l *countingLease) Grant(ctx context.Context, ttl int64) (*clientv3.LeaseGrantResponse, error) {
	l.mu.Lock()
	l.grants = append(l.grants, time.Now())
	l.mu.Unlock()
	return l.Lease.Grant(ctx, ttl)
}

// grantsSince returns how many grants were asked for since t.
func (l *countingLease) grantsSince(t time.Time) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, g := range l.grants {
		if !g.Before(t) {
			n++
		}
	}
	return n
}

// Another live replica takes this replica's member key under its own
// lease: the replica stops and tries to join again, and each attempt
// grants a lease, finds the key held, and revokes the lease. While the
// other lives, the attempts back off to one per TTL, instead of one every
// 200ms for ever; once the other is gone, the replica joins again.
func TestDuplicateIDRejoinBacksOff(t *testing.T) {
	c := newCluster(t, 1, testOptions())
	n := c.newNode("r0")
	leases := &countingLease{Lease: n.cli.Lease}
	n.cli.Lease = leases
	c.register(n)
	events := n.r.Events(t.Context())
	if err := n.r.Join(t.Context()); err != nil {
		t.Fatal(err)
	}
	expectEvent(t, events, ha.Acquired, "", ha.LeaseGained)
	op := newClient(t, testEtcd)
	defer op.Close()
	other, err := op.Grant(t.Context(), 60)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := op.Put(t.Context(), c.prefix+"/members/r0", "r0", clientv3.WithLease(other.ID)); err != nil {
		t.Fatal(err)
	}
	ev := expectEvent(t, events, ha.FencePassed, "", ha.Acquired)
	if !errors.Is(ev.Err, ha.ErrDuplicateID) {
		t.Fatalf("the fence passed with %v, want ErrDuplicateID", ev.Err)
	}
	since := time.Now()
	const window = 6 * time.Second
	ttl := c.opts.TTL
	// The pauses double from 20ms to TTL (7 doublings for 2s), then stay:
	// the attempts of the doublings, one per TTL after them, one for the
	// attempt under way.
	most := 8 + int(window/ttl) + 1
	time.Sleep(window) // the time over which the grants are counted, not an ordering
	got := leases.grantsSince(since)
	t.Logf("%d leases granted in the %v after the fence passed for a duplicate ID (TTL %v)", got, window, ttl)
	if got > most {
		t.Errorf("%d leases granted and revoked in %v while another live replica holds the ID, want at most %d: no backoff", got, window, most)
	}
	if _, err := op.Revoke(t.Context(), other.ID); err != nil {
		t.Fatal(err)
	}
	gone := time.Now()
	expectEvent(t, events, ha.LeaseGained, "", ha.Released, ha.LeaseLost)
	t.Logf("joined again %v after the other replica's lease was revoked", time.Since(gone))
	if took := time.Since(gone); took > ttl+2*time.Second {
		t.Errorf("joined again %v after the ID was free, want within TTL (%v) and a request", took, ttl)
	}
}
