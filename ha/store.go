// Stores: where a group of replicas keeps its sessions, and how a Replica
// gets its Backend from one.

package ha

import (
	"context"
	"log/slog"
	"time"
)

// A Store is where a group of replicas keeps its members, sessions and
// holdings: etcd (the module github.com/bgctl/controller/ha/etcd), the Kubernetes API server (the module
// github.com/bgctl/controller/ha/kube), or PostgreSQL (the module
// github.com/bgctl/controller/ha/postgres). [New] asks it once for the
// Backend of the replica it makes.
type Store interface {
	// Backend returns the backend of the replica c describes. It sends
	// nothing and starts no goroutine.
	Backend(c BackendConfig) (Backend, error)
}

// BackendConfig is what a Replica tells its store about itself when it
// asks for its Backend: its options, normalized.
type BackendConfig struct {
	// Group is the group's name: Options.Prefix.
	Group string
	// ID is the replica's ID: Options.ID.
	ID string
	// TTL is the validity of the replica's sessions: Options.TTL.
	TTL time.Duration
	// RequestTimeout bounds each request the backend makes for the
	// replica: Options.RequestTimeout.
	RequestTimeout time.Duration
	// RenewEvery is how often the replica renews its session, a quarter
	// of Window: a feed checks its health about this often.
	RenewEvery time.Duration
	// Window is TTL − Margin, how long a renewal keeps the fence open: a
	// feed silent this long is given up and listed again.
	Window time.Duration
	// Logger is the replica's logger.
	Logger *slog.Logger
	// Stopping is done once the replica stops (Close, or Join failed):
	// it bounds the requests the backend makes on its own, outside any
	// caller's context.
	Stopping context.Context
}
