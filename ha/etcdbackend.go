// The etcd backend: a session is an etcd lease, the member record and the
// claims are keys under it.

package ha

import (
	"log/slog"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// etcdBackend is the backend on etcd. It reads cli's fields at every
// call, so that a test may swap one (a Lease that counts its grants)
// before Join.
type etcdBackend struct {
	// Immutable after newEtcdBackend.
	cli            *clientv3.Client
	log            *slog.Logger
	requestTimeout time.Duration // Options.RequestTimeout
}

// newEtcdBackend returns the backend of a replica with options opts
// (normalized), logging to log.
func newEtcdBackend(cli *clientv3.Client, opts Options, log *slog.Logger) *etcdBackend {
	return &etcdBackend{cli: cli, log: log, requestTimeout: opts.RequestTimeout}
}
