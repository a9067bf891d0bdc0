package etcd

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// A member that answers every serializable page at a known
// revision with ErrFutureRev (a follower behind) must still give the
// whole listing at the first page's revision, through the linearizable
// fallback, while another client writes between the pages.
func TestListingFallsBackFromALaggingMember(t *testing.T) {
	n, prefix := listingNode(t, 1)
	ctx := context.Background()
	for i := range 10 {
		if _, err := n.cli.Put(ctx, fmt.Sprintf("%sk%02d", prefix, i), "v0"); err != nil {
			t.Fatal(err)
		}
	}
	var refused, serial, lin atomic.Int64
	lag := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if rr, ok := req.(*pb.RangeRequest); ok && rr.Revision != 0 {
			if rr.Serializable {
				serial.Add(1)
				refused.Add(1)
				// a write lands between the refusal and the fallback
				if _, err := n.cli.Put(context.Background(), prefix+"k00", fmt.Sprint("v", refused.Load())); err != nil {
					return err
				}
				return rpctypes.ErrGRPCFutureRev
			}
			lin.Add(1)
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	throughInterceptor(t, n, lag)
	listingIsOneRead(t, n, prefix, "every page refused serializably")
	if serial.Load() == 0 || lin.Load() != serial.Load() {
		t.Errorf("serializable attempts %d, linearizable fallbacks %d", serial.Load(), lin.Load())
	}
	t.Logf("pages %d, each refused once and read again linearizably", serial.Load())
}

// A listing whose revision is compacted between two of its pages fails
// (the caller lists again) rather than answer the pages it read: a
// listing cut short would hold only some of the group's records, and
// the view would take the names it misses for free.
func TestListingFailsWhenItsRevisionIsCompactedBetweenPages(t *testing.T) {
	n, _ := listingNode(t, 2)
	ctx := context.Background()
	k := n.etcd().keys
	for i := range 10 {
		if _, err := n.cli.Put(ctx, fmt.Sprintf("%sname-%02d", k.claims, i), "r9"); err != nil {
			t.Fatal(err)
		}
	}
	var compacted atomic.Bool
	compact := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if rr, ok := req.(*pb.RangeRequest); ok && rr.Revision != 0 && !compacted.Swap(true) {
			// a page after the first: etcd compacts past the listing's revision
			resp, err := n.cli.Put(context.Background(), k.claims+"name-99", "r9")
			if err != nil {
				return err
			}
			if _, err := n.cli.Compact(context.Background(), resp.Header.Revision); err != nil {
				return err
			}
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	throughInterceptor(t, n, compact)
	records, at, err := n.etcd().List(ctx)
	if !compacted.Load() {
		t.Fatal("the listing read no second page: the setup compacted nothing")
	}
	if !errors.Is(err, rpctypes.ErrCompacted) {
		t.Fatalf("the listing compacted between pages answered %d records at %d, %v; want etcd's compacted error", len(records), at, err)
	}
	if records, _, err = n.etcd().List(ctx); err != nil || len(records) != 11 {
		t.Errorf("the listing made again read %d records, %v; want 11", len(records), err)
	}
}

// throughInterceptor points n's etcd backend at a client of its own whose
// unary calls pass through ic; the client is closed when the test ends.
func throughInterceptor(t *testing.T, n *node, ic grpc.UnaryClientInterceptor) {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: n.cli.Endpoints(), DialTimeout: 2 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(ic)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	n.etcd().cli = cli
}
