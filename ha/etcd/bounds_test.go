// Stopping within bounds and the member key across a relist, against
// etcd: RemoveControllerAndWait right after a fence pass, Leave and Close
// while etcd does not answer, a member key lost while the watch was down.

package etcd

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bgctl/controller"
	"github.com/bgctl/controller/ha"
	"github.com/bgctl/controller/ha/internal/probe"
	"github.com/sirupsen/logrus"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// reset closes every connection through the proxy, as a network that
// resets them: the client reconnects (through the gate, if cut).
func (p *proxy) reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
}

// RemoveControllerAndWait promises to wait until the name no longer runs
// on this replica. Right after a fence pass the epoch has taken the slots,
// but the controller still runs (its DoFunc may use Margin after the
// cancellation): the call must wait for it.
func TestRemoveControllerAndWaitAfterAFencePassWaitsForTheController(t *testing.T) {
	opts := testOptions()
	c := newCluster(t, 0, opts)
	n := c.join("solo")
	var running, returned atomic.Bool
	err := n.r.UpdateController("b", controller.ControllerParams{
		DoFunc: func(ctx context.Context) error {
			running.Store(true)
			<-ctx.Done()
			time.Sleep(opts.Margin * 9 / 10) // within the contract
			returned.Store(true)
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b to run", running.Load)
	n.proxy.cut()
	waitFor(t, "the fence to pass", func() bool { return n.r.Status().Lease == "" })
	called := time.Now()
	if err := n.r.RemoveControllerAndWait("b"); err != nil {
		t.Fatal(err)
	}
	if !returned.Load() {
		t.Errorf("RemoveControllerAndWait(b) returned after %v while b's DoFunc still ran", time.Since(called))
	}
	n.proxy.heal()
}

// Leave returns when its context ends, and Close within TTL, also while
// the loop waits for etcd after a fence pass (the best-effort revoke, the
// grants of the rejoin): those requests wait RequestTimeout each.
func TestStopWhileEtcdDoesNotAnswer(t *testing.T) {
	for _, tc := range []struct {
		name  string
		opts  func() ha.Options
		leave bool
		bound func(ha.Options) time.Duration
	}{
		{"Leave, default RequestTimeout", func() ha.Options {
			o := testOptions()
			o.TTL, o.Margin = 4*time.Second, time.Second // RequestTimeout 1.5s
			return o
		}, true, func(ha.Options) time.Duration { return 100 * time.Millisecond }},
		{"Close, RequestTimeout above TTL", func() ha.Options {
			o := testOptions()
			o.RequestTimeout = 4 * time.Second
			return o
		}, false, func(o ha.Options) time.Duration { return o.TTL }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := tc.opts()
			c := newCluster(t, 0, opts)
			n := c.join("solo")
			n.proxy.cut()
			waitFor(t, "the fence to pass", func() bool { return n.r.Status().Lease == "" })
			time.Sleep(100 * time.Millisecond)
			bound := tc.bound(opts)
			start := time.Now()
			var err error
			if tc.leave {
				ctx, cancel := context.WithTimeout(context.Background(), bound)
				err = n.r.Leave(ctx)
				cancel()
			} else {
				err = n.r.Close()
			}
			took := time.Since(start)
			t.Logf("returned after %v (bound %v, RequestTimeout %v): %v", took, bound, probe.Options(n.r).(ha.Options).RequestTimeout, err)
			if took > bound+500*time.Millisecond {
				t.Errorf("took %v, past its bound %v", took, bound)
			}
			n.proxy.heal()
			delete(c.nodes, n.id)
			n.cli.Close()
		})
	}
}

// cutResetCompact takes n's watch down (connections reset, the link cut),
// runs do against etcd directly, compacts the store past the watch's
// revision, and heals: the watch resumes into ErrCompacted, and the
// replica relists. A probe watch through the same proxy, from the same
// moment, shows that it did.
func cutResetCompact(t *testing.T, c *cluster, n *node, do func(ctx context.Context, admin *clientv3.Client)) {
	t.Helper()
	admin := newClient(t, testEtcd)
	defer admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	probe := newClient(t, n.proxy.addr())
	defer probe.Close()
	now, err := probe.Get(ctx, c.prefix+"/unrelated")
	if err != nil {
		t.Fatal(err)
	}
	wch := probe.Watch(ctx, c.prefix+"/", clientv3.WithPrefix(), clientv3.WithRev(now.Header.Revision+1))
	n.proxy.cut()
	n.proxy.reset()
	do(ctx, admin)
	var resp *clientv3.PutResponse
	for range 2 { // the compaction must pass the probe's start revision
		if resp, err = admin.Put(ctx, c.prefix+"/unrelated", "x"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := admin.Compact(ctx, resp.Header.Revision); err != nil {
		t.Fatal(err)
	}
	n.proxy.heal()
	for wr := range wch {
		if wr.Err() != nil {
			t.Logf("probe watch: %v", wr.Err())
			return
		}
		if len(wr.Events) > 0 {
			t.Fatalf("the probe watch resumed with %d events, not compacted: the setup does not force a relist", len(wr.Events))
		}
	}
	t.Fatal("the probe watch ended without an error")
}

// A member key deleted while the replica's watch was down (a reset
// connection, a compaction before it resumed) is seen only by the relist:
// the replica must write it again there too, or it runs nothing for good
// while it renews its lease.
func TestMemberKeyDeletedWhileTheWatchIsDownIsWrittenAgain(t *testing.T) {
	opts := testOptions()
	opts.TTL, opts.Margin = 4*time.Second, time.Second // room for the outage
	c := newCluster(t, 3, opts)
	n := c.join("solo")
	want := c.expected([]string{"solo"})
	c.waitPlacement(want, 10*time.Second)
	key := c.prefix + "/members/solo"
	cutResetCompact(t, c, n, func(ctx context.Context, admin *clientv3.Client) {
		if _, err := admin.Delete(ctx, key); err != nil {
			t.Fatal(err)
		}
	})
	deadline := time.Now().Add(2 * opts.TTL)
	for {
		st := n.r.Status()
		got := c.rec.Placement()
		lease := ha.SessionID(probe.Session(n.r))
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := n.cli.Get(ctx, key)
		cancel()
		if err == nil && len(resp.Kvs) == 1 && ha.SessionID(resp.Kvs[0].Lease) == lease &&
			len(st.Members) == 1 && len(got) == len(want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v after the heal: lease %q, members %v, %d of %d names running; member key: %v (err %v)",
				2*opts.TTL, st.Lease, st.Members, len(got), len(want), resp.Kvs, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	c.rec.AssertNoOverlap(t)
}

// Disproved: the relist finds the member key under the replica's own
// lease and does not take it for lost (no rewrite, no warning).
func TestRelistDoesNotTakeTheOwnMemberKeyForLost(t *testing.T) {
	opts := testOptions()
	opts.TTL, opts.Margin = 4*time.Second, time.Second
	hook := &warnCounter{prefix: "member key was deleted"}
	l := logrus.New()
	l.SetOutput(quietLogger().(*logrus.Logger).Out)
	l.AddHook(hook)
	opts.Logger = l
	c := newCluster(t, 3, opts)
	n := c.join("solo")
	want := c.expected([]string{"solo"})
	c.waitPlacement(want, 10*time.Second)
	cutResetCompact(t, c, n, func(context.Context, *clientv3.Client) {})
	time.Sleep(time.Second) // the relist comes retryAfter after the error
	if got := hook.n.Load(); got != 0 {
		t.Errorf("%d member-key rewrites after a relist that found the key under the live lease", got)
	}
	c.waitPlacement(want, 10*time.Second)
	c.rec.AssertNoOverlap(t)
}

// Disproved: a DoFunc blocked in RemoveControllerAndWait on a name whose
// StopFunc ignores its context keeps neither Close past TTL nor, after a
// fence pass, Leave past its context.
func TestStopWithADoFuncWaitingOnAStuckName(t *testing.T) {
	for _, leave := range []bool{false, true} {
		t.Run(map[bool]string{false: "Close", true: "Leave after a fence pass"}[leave], func(t *testing.T) {
			opts := testOptions()
			c := newCluster(t, 0, opts)
			n := c.join("solo")
			r := n.r
			unblock := make(chan struct{})
			defer close(unblock)
			bRunning, waiting := make(chan struct{}), make(chan struct{})
			var once sync.Once
			err := r.UpdateController("b", controller.ControllerParams{
				DoFunc: func(ctx context.Context) error {
					once.Do(func() { close(bRunning) })
					if leave {
						<-unblock // ignores its context: breaks the contract
					}
					return nil
				},
				StopFunc: func(context.Context) error { <-unblock; return nil },
			})
			if err != nil {
				t.Fatal(err)
			}
			<-bRunning
			err = r.UpdateController("a", controller.ControllerParams{
				DoFunc: func(ctx context.Context) error {
					select {
					case <-waiting:
						<-ctx.Done()
						return nil
					default:
					}
					close(waiting)
					return r.RemoveControllerAndWait("b")
				},
			})
			if err != nil {
				t.Fatal(err)
			}
			<-waiting
			bound := opts.TTL
			if leave {
				n.proxy.cut()
				waitFor(t, "the fence to pass", func() bool { return r.Status().Lease == "" })
				bound = 300 * time.Millisecond
			}
			start := time.Now()
			if leave {
				ctx, cancel := context.WithTimeout(context.Background(), bound)
				err = r.Leave(ctx)
				cancel()
			} else {
				err = r.Close()
			}
			took := time.Since(start)
			t.Logf("returned after %v (bound %v): %v", took, bound, err)
			if err == nil {
				t.Error("returned nil with b still running")
			}
			if took > bound+500*time.Millisecond {
				t.Errorf("took %v, past its bound %v", took, bound)
			}
			n.proxy.heal()
			delete(c.nodes, n.id)
			n.cli.Close()
		})
	}
}

// Disproved: a replica of the same ID that takes the member key under its
// own lease (the key deleted, then written by the other) makes this
// replica stop every name and stay out while that lease lives; once it
// is gone, this replica joins again and runs its names.
func TestSameIDTakesTheMemberKey(t *testing.T) {
	opts := testOptions()
	c := newCluster(t, 3, opts)
	n := c.join("solo")
	want := c.expected([]string{"solo"})
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
	if _, err := admin.Delete(ctx, key); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Put(ctx, key, "solo", clientv3.WithLease(other.ID)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the replica to stop every name", func() bool {
		return n.r.Status().Lease == "" && len(c.rec.Placement()) == 0
	})
	time.Sleep(opts.TTL) // it stays out while the other lease lives
	if st := n.r.Status(); st.Lease != "" || len(c.rec.Placement()) != 0 {
		t.Fatalf("with the key under another lease: lease %q, %d names running", st.Lease, len(c.rec.Placement()))
	}
	if _, err := admin.Revoke(ctx, other.ID); err != nil {
		t.Fatal(err)
	}
	c.waitPlacement(want, 10*time.Second)
	c.rec.AssertNoOverlap(t)
}
