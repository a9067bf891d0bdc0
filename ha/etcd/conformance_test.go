// The contract every store keeps (package hatest), against the etcd the
// tests start, in real time.

package etcd

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/bgctl/controller/ha"
	"github.com/bgctl/controller/ha/hatest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Each case against etcd, every case in a group of its own.
func TestBackendConformanceEtcd(t *testing.T) {
	needEtcd(t)
	for _, tc := range hatest.Cases() {
		compacts := tc.Name == "LostHistoryFailsHeldAtAndTheFeedThatNeedsIt"
		t.Run(tc.Name, func(t *testing.T) {
			if !compacts {
				// Each in a group of its own; the waits overlap. The
				// case that compacts runs alone, before them: a
				// compaction is the whole etcd's, and would take the
				// history the others read.
				t.Parallel()
			}
			prefix := fmt.Sprintf("/test/conformance/%s/%d", tc.Name, time.Now().UnixNano())
			// A client of its own, whose faults are the case's.
			cli := newClient(t, testEtcd)
			defer cli.Close()
			lease, kv := &slowLease{Lease: cli.Lease}, &losingKV{KV: cli.KV}
			cli.Lease, cli.KV = lease, kv
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			tc.Test(t, hatest.Group{
				Backend: func(id string) ha.Backend {
					w := hatest.TTL - hatest.TTL/4
					return newEtcdBackend(cli, ha.BackendConfig{Group: prefix, ID: id, RequestTimeout: 2 * time.Second,
						RenewEvery: w / 4, Window: w, Logger: slog.New(slog.DiscardHandler), Stopping: ctx})
				},
				Slack:     time.Second,
				Early:     300 * time.Millisecond,
				SlowBegin: func(d time.Duration) { lease.hold.Store(int64(d)) },
				LoseBegin: func() { kv.lose.Store(true) },
				EndEarly: func(id string) {
					resp, err := cli.Get(ctx, keysOf(prefix+"/replicas").members+id)
					if err == nil && len(resp.Kvs) != 1 {
						err = fmt.Errorf("%d member keys", len(resp.Kvs))
					}
					if err == nil {
						_, err = cli.Revoke(ctx, clientv3.LeaseID(resp.Kvs[0].Lease))
					}
					if err != nil {
						t.Fatalf("revoking %s's lease: %v", id, err)
					}
				},
				NewReplica: func(id string, o ha.Options) (*ha.Replica, error) {
					o.Prefix, o.ID = prefix+"/replicas", id
					return ha.New(Store(cli), o) // closed after the case, which closes its replicas
				},
				Compact: func() {
					resp, err := cli.Get(ctx, prefix)
					if err == nil {
						_, err = cli.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical())
					}
					if err != nil {
						t.Fatalf("compacting etcd: %v", err)
					}
				},
			})
		})
	}
}
