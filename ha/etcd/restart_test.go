// Restarts under a stable ID: a crashed incarnation's lease is waited
// for, however late the readings of it come, and a live duplicate is not.

package etcd

import (
	"context"
	"strings"
	"sync/atomic"
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
