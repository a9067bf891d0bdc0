// The etcd client's logs written to the service's slog handler.

package etcd_test

import (
	"log/slog"
	"os"

	"github.com/bgctl/controller/ha/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The client's lines reach the handler of the service's logger. A request
// its caller cancelled, as Leave cancels the DoFuncs' and the replica's
// own, is a Debug line, below this handler's level.
func ExampleClientLogger() {
	logger := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey && len(groups) == 0 {
				return slog.Attr{} // for a stable output
			}
			return a
		},
	}))
	cfg := clientv3.Config{
		Endpoints: []string{"127.0.0.1:2379"},
		Logger:    etcd.ClientLogger(logger), // or zap.NewNop(): no client lines at all
	}

	// Two lines the client logs, written here by hand.
	cfg.Logger.Warn("retrying of unary invoker failed",
		zap.String("method", "/etcdserverpb.KV/Txn"),
		zap.Error(status.Error(codes.Unavailable, "connection refused")))
	cfg.Logger.Warn("retrying of unary invoker failed",
		zap.String("method", "/etcdserverpb.KV/Txn"),
		zap.Error(status.Error(codes.Canceled, "context canceled")))
	// Output:
	// level=WARN msg="retrying of unary invoker failed" logger=etcd-client method=/etcdserverpb.KV/Txn error="rpc error: code = Unavailable desc = connection refused"
}
