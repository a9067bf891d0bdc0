package ha

import (
	"context"
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
	cli, err := clientv3.New(clientv3.Config{Endpoints: n.cli.Endpoints(), DialTimeout: 2 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(lag)}})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	n.etcd().cli = cli
	listingIsOneRead(t, n, prefix, "every page refused serializably")
	if serial.Load() == 0 || lin.Load() != serial.Load() {
		t.Errorf("serializable attempts %d, linearizable fallbacks %d", serial.Load(), lin.Load())
	}
	t.Logf("pages %d, each refused once and read again linearizably", serial.Load())
}
