// The seam between what every store needs (placement, the fence, slots,
// reconcile, events, health, metrics, the page) and the store that keeps
// the replicas' sessions: the contract a backend fulfils.

package ha

import "context"

// backend is the store a replica's group lives in, seen from the shared
// part of the package. Its methods are safe for concurrent use; none
// starts a goroutine that outlives the call.
//
// The seam is being cut one group of calls at a time (etcd's is
// etcdBackend). Still outside it, and etcd-typed: the claims and their
// releases, the member record's rewrites, the watch and the listings
// (Replica.cli), and the lease IDs and revisions the view and the
// public types carry.
type backend interface {
	// checkServers asks the servers the backend reaches which release
	// they run and logs at Warn, once, the oldest that is too old for the
	// fence to hold. It returns within Options.RequestTimeout and does
	// not fail: a server it cannot ask is logged at Debug.
	checkServers(ctx context.Context)
}
