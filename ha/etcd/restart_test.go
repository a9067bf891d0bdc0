// Restarts under a stable ID: a crashed incarnation's lease is waited
// for, however late the readings of it come, and a live duplicate is not.

package etcd

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/bgctl/controller/ha"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

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
func TestRestartWithASlowFirstReadingIsNoDuplicate(t *testing.T) {
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
	r, err := ha.New(Store(cli), opts)
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

// restartJoinBound is how long after the earlier run stopped a restarted
// run of its ID may take to join, at the children's TTL (testOptions):
// the TTL, etcd's whole-second truncation and 500ms expiry sweep, Join's
// poll of 500ms, and room for a loaded machine.
const restartJoinBound = 2*time.Second + 5*time.Second

// A replica process SIGKILLed while it holds a name and started again at
// once under its ID, as a container restarted in its pod is, waits in
// Join for the earlier run's lease to run out and joins, within the TTL
// and a few seconds, not with ErrDuplicateID; it takes the name again
// and its writes guarded by the new claim go through.
func TestProcessRestartedUnderItsIDJoins(t *testing.T) {
	c := newCluster(t, 0, testOptions())
	first := startChild(t, c.prefix, "r")
	first.expect("joined", 30*time.Second)
	first.expect("claim", 10*time.Second)
	first.expect("write ok", 5*time.Second)
	first.kill()
	killed := time.Now()
	again := startChild(t, c.prefix, "r")
	again.expect("joined", restartJoinBound+5*time.Second)
	joined := time.Since(killed)
	again.expect("claim", 10*time.Second)
	again.expect("write ok", 5*time.Second)
	t.Logf("r restarted under its ID joined %v after SIGKILL (TTL %v)", joined.Round(time.Millisecond), c.opts.TTL)
	if joined > restartJoinBound {
		t.Errorf("r restarted under its ID joined %v after SIGKILL; want within %v", joined, restartJoinBound)
	}
}

// A replica process SIGSTOPped while it holds a name, and started again
// under its ID while the earlier run is frozen: the new run joins only
// once the frozen run's lease has run out, a TTL after the stop at the
// earliest, and claims the name anew; resumed, the frozen run's DoFunc,
// which never looks at its context, goes on writing, and etcd refuses
// every write guarded by its old claim after the new one.
func TestProcessRestartedWhileItsEarlierRunIsFrozen(t *testing.T) {
	c := newCluster(t, 0, testOptions())
	first := startChild(t, c.prefix, "r")
	first.expect("joined", 30*time.Second)
	var oldRev, newRev int64
	if _, err := fmt.Sscanf(first.expect("claim", 10*time.Second), "claim %d", &oldRev); err != nil {
		t.Fatal(err)
	}
	first.expect("write ok", 5*time.Second)
	first.signal(syscall.SIGSTOP)
	stopped := time.Now()
	again := startChild(t, c.prefix, "r")
	again.expect("joined", restartJoinBound+5*time.Second)
	joined := time.Since(stopped)
	if _, err := fmt.Sscanf(again.expect("claim", 10*time.Second), "claim %d", &newRev); err != nil {
		t.Fatal(err)
	}
	again.expect("write ok", 5*time.Second)
	t.Logf("r restarted while frozen joined %v after SIGSTOP (TTL %v); claims at %d, then %d", joined.Round(time.Millisecond), c.opts.TTL, oldRev, newRev)
	if joined < c.opts.TTL-c.opts.Margin {
		t.Errorf("the restarted r joined %v after the earlier run froze, before its lease of %v could have run out", joined, c.opts.TTL)
	}
	if joined > restartJoinBound {
		t.Errorf("the restarted r joined %v after the earlier run froze; want within %v", joined, restartJoinBound)
	}
	first.signal(syscall.SIGCONT)
	first.awaitRefused(newRev)
	cli := newClient(t, testEtcd)
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	got, err := cli.Get(ctx, c.prefix+"/data")
	if want := fmt.Sprintf("from r %d", newRev); err != nil || len(got.Kvs) != 1 || string(got.Kvs[0].Value) != want {
		t.Fatalf("data = %v (err %v), want the restarted run's write %q", got.Kvs, err, want)
	}
}
