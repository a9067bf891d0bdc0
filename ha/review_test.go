// Review tests: attempts to break "never two at once" and "never stuck"
// in the code of earlyend.go, fence.go, renew.go, restart.go.

package ha

import (
	"context"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// leaseOf returns n's current lease and fence deadline (zero: none).
func leaseOf(n *node) (clientv3.LeaseID, time.Time) {
	n.r.mu.Lock()
	l, f := n.r.lease, n.r.fence
	n.r.mu.Unlock()
	if l == 0 || f == nil {
		return 0, time.Time{}
	}
	return l, f.passedAt()
}

// readExpiry returns what n's lease poller holds as the earliest moment
// lease l could run out (earlyLocked), and whether it has read it.
func readExpiry(n *node, l clientv3.LeaseID) (time.Time, bool) {
	n.r.mu.Lock()
	defer n.r.mu.Unlock()
	at, ok := n.r.leaseExpiry[l]
	return at, ok
}

// A holder cut off from etcd, whose lease another client (or a stale
// leader) revokes late in its TTL, but before its DoFuncs returned, must
// not have its names started elsewhere before they returned: rule 5 says
// the others wait for a lease that ended early.
//
// The others tell an early end from a lease that ran out by the earliest
// moment the lease could run out, (send time) + the whole seconds
// TimeToLive answered. etcd truncates, so that bound is up to a second
// (plus the poll period) earlier than the lease's true expiry: a revoke
// after the bound and before the true expiry reads as "ran out", and the
// names are claimed at once, while the cut-off holder's fence has not
// passed yet, or its DoFuncs use their Margin. With TTL 2s, Margin 0.5s,
// the holder's DoFuncs return by (last renewal) + 1.9s, and the bound
// lands between (last renewal) + 1.6s and + 2s: about half the cuts leave
// a window. The test waits for one and revokes in it (an attempt with no
// window is skipped: the holder's lease runs out, and it comes back).
func TestReviewRevokeLateInACutOffHoldersTTLReadsAsRanOut(t *testing.T) {
	c, placed := slowCluster(t)
	admin := newClient(t, testEtcd)
	defer admin.Close()
	lingers := c.opts.Margin * 9 / 10 // slowParams
	watchers := []*node{c.nodes["r1"], c.nodes["r2"]}
	tried := 0
	for attempt := 0; attempt < 16 && tried < 6; attempt++ {
		victim := c.nodes["r0"]
		lease, _ := leaseOf(victim)
		deadline := time.Now().Add(10 * time.Second)
		for !func() bool {
			for _, w := range watchers {
				if _, ok := readExpiry(w, lease); !ok {
					return false
				}
			}
			return true
		}() {
			if time.Now().After(deadline) {
				for _, w := range watchers {
					w.r.mu.Lock()
					t.Logf("%s: members %v, expiry %v, last %v", w.id, w.r.memberLeases, w.r.leaseExpiry, w.r.leaseLast)
					w.r.mu.Unlock()
				}
				t.Fatalf("r1 and r2 have not read r0's lease %x", lease)
			}
			time.Sleep(2 * time.Millisecond)
		}
		victim.proxy.cut()
		revoked := false
		var fenceAt time.Time
		for {
			if l, f := leaseOf(victim); l == lease {
				fenceAt = f // its last value stays once the fence passed
			}
			// Each watcher judges alone, by its own readings: the one
			// whose bound is earlier claims its share of r0's names.
			var bound time.Time
			for _, w := range watchers {
				at, _ := readExpiry(w, lease)
				if bound.IsZero() || at.Before(bound) {
					bound = at
				}
			}
			now := time.Now()
			if fenceAt.IsZero() || now.After(fenceAt.Add(lingers-100*time.Millisecond)) {
				t.Logf("no window: others' bound %v after r0's fence", bound.Sub(fenceAt).Round(time.Millisecond))
				break // no window this time
			}
			if now.After(bound.Add(20 * time.Millisecond)) {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_, err := admin.Revoke(ctx, lease)
				cancel()
				if err != nil {
					t.Fatal(err)
				}
				revoked = true
				t.Logf("attempt %d: r0 cut; its lease revoked %v after the others' bound, %v after its fence (its DoFuncs go on %v past it; its lease would run out %v past it)",
					attempt, now.Sub(bound).Round(time.Millisecond), now.Sub(fenceAt).Round(time.Millisecond), lingers, c.opts.Margin+cancelLead)
				break
			}
			time.Sleep(time.Millisecond)
		}
		if revoked {
			tried++
			time.Sleep(c.opts.TTL + time.Second) // r0's DoFuncs have returned, the names moved
			c.rec.assertNoOverlap(t)
			if t.Failed() {
				victim.proxy.heal()
				t.Fatalf("attempt %d: a name of r0 started elsewhere before r0's DoFunc returned", attempt)
			}
		} else {
			t.Logf("attempt %d: no window (the others' bound came late enough)", attempt)
		}
		// Heal at a random moment, so that r0's keepalives, which its
		// new epoch starts, fall at another phase of the others' lease
		// polls (both tick every (TTL − Margin)/4).
		time.Sleep(time.Duration(rand.Int64N(int64(c.opts.keepAliveEvery()))))
		victim.proxy.heal()
		waitFor(t, "r0 to join again under a new lease", func() bool {
			l, _ := leaseOf(victim)
			return l != 0 && l != lease
		})
		c.waitPlacement(placed, 3*c.opts.TTL+10*time.Second)
	}
	if tried == 0 {
		t.Skip("no window in any attempt")
	}
}

// A replica whose watch is behind judges an early end by the time it
// sees it, not by the time it happened. r1 is cut off from etcd for
// 1.1s (less than its fence window, so it stays a member); meanwhile r0,
// connected and renewing, has its lease revoked by another client, sees
// it at once, and stops its DoFuncs, which return within their Margin.
// r1's last reading of r0's lease is more than a second old when its
// watch delivers the deletions, so the lease looks as if it ran out, and
// r1 claims its share of r0's names at once, while r0's DoFuncs are still
// returning. Deterministic: no phase needs to line up.
func TestReviewObserverBehindReadsAnEarlyEndAsRanOut(t *testing.T) {
	c, placed := slowCluster(t)
	admin := newClient(t, testEtcd)
	defer admin.Close()
	victim, late := c.nodes["r0"], c.nodes["r1"]
	for round := range 3 {
		lease, _ := leaseOf(victim)
		waitFor(t, "r1 to read r0's lease", func() bool { _, ok := readExpiry(late, lease); return ok })
		// Cut r1 right after a keepalive extended its fence, so that
		// its fence (TTL − Margin − 100ms from that keepalive) outlasts
		// the cut; revoke once r1's bound for r0's lease has passed.
		_, f0 := leaseOf(late)
		waitFor(t, "r1's fence to move", func() bool { _, f := leaseOf(late); return f.After(f0) })
		late.proxy.cut()
		var bound, now time.Time
		waitFor(t, "r1's bound for r0's lease to pass", func() bool {
			bound, _ = readExpiry(late, lease)
			now = time.Now()
			return now.After(bound.Add(20 * time.Millisecond))
		})
		if _, f := leaseOf(late); f.Before(now.Add(100 * time.Millisecond)) {
			t.Fatalf("r1's fence passes %v after the revoke: too soon for this test", f.Sub(now))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := admin.Revoke(ctx, lease)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(30 * time.Millisecond)
		late.proxy.heal()
		t.Logf("round %d: r0's lease revoked while r1 was cut off (r1's bound for it %v before the revoke); r1 healed 30ms later", round, now.Sub(bound).Round(time.Millisecond))
		time.Sleep(c.opts.TTL + time.Second)
		c.rec.assertNoOverlap(t)
		if t.Failed() {
			t.Fatalf("round %d: a name of r0 started on r1 before r0's DoFunc returned", round)
		}
		waitFor(t, "r0 to join again under a new lease", func() bool {
			l, _ := leaseOf(victim)
			return l != 0 && l != lease
		})
		c.waitPlacement(placed, 3*c.opts.TTL+10*time.Second)
	}
}

// A replica that restarts under the ID of a crashed incarnation waits
// for the old lease to run out. awaitPreviousIncarnation takes the lease
// for renewed when the expiry its TimeToLive answers imply, (send time)
// + whole seconds left, moves by more than 1.25s from the first answer.
// For a lease nobody renews those expiries spread over (a second of
// truncation) + (the first request's delay between its send time and the
// server): a first request held 1.5s on its way (within
// RequestTimeout, 3.75s at the default TTL) (a dead endpoint the
// client retried past, an election at the moment of the restart) makes
// the crashed incarnation look alive, and Join fails with ErrDuplicateID
// although nothing renews the lease.
func TestReviewRestartWithASlowFirstTimeToLiveIsNoDuplicate(t *testing.T) {
	c := newCluster(t, 1, testOptions())
	admin := newClient(t, testEtcd)
	defer admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	g, err := admin.Grant(ctx, 4) // the crashed incarnation's lease, renewed just before the crash
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Put(ctx, keysOf(c.prefix).members+"r0", "r0", clientv3.WithLease(g.ID)); err != nil {
		t.Fatal(err)
	}
	var first atomic.Bool
	slowFirst := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if strings.HasSuffix(method, "/LeaseTimeToLive") && first.CompareAndSwap(false, true) {
			time.Sleep(1500 * time.Millisecond) // held on its way to the server
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{testEtcd}, DialTimeout: 2 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(slowFirst)}})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	opts := c.opts
	opts.Prefix, opts.ID = c.prefix, "r0"
	// The defaults, TTL 10s and Margin 2.5s: RequestTimeout (TTL −
	// Margin)/2 = 3.75s lets the slow first answer count.
	opts.TTL, opts.Margin = 10*time.Second, 0
	r, err := New(cli, opts)
	if err != nil {
		t.Fatal(err)
	}
	jctx, jcancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer jcancel()
	start := time.Now()
	err = r.Join(jctx)
	t.Logf("Join returned after %v: %v", time.Since(start).Round(time.Millisecond), err)
	if err != nil {
		t.Errorf("Join = %v; want it to wait for the crashed incarnation's lease (nobody renews it) and join", err)
		return
	}
	if err := r.Leave(context.Background()); err != nil {
		t.Error(err)
	}
}
