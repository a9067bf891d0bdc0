// Claims: the holding a replica must have on its store to run a name, and
// how a DoFunc reads it from its context to fence its own writes.

package ha

import "context"

// Claim identifies one holding of a name by this replica. A replica runs
// a name only while it holds it; the holding lives under the replica's
// session, so it ends when the replica leaves, releases the name, or its
// session ends.
//
// The local fence stops a replica that cannot reach its store, but it
// cannot stop a process that was frozen (SIGSTOP, a long pause) and
// wakes up after the name passed to another replica. A write that must
// never come from a former holder carries the claim as its guard: on
// etcd, a transaction guarded by Held in github.com/bgctl/controller/ha/etcd, which etcd refuses once
// the holding is gone or the name held anew; on PostgreSQL, Held in
// github.com/bgctl/controller/ha/postgres, called inside the user's own
// transaction, which then commits only while the claim holds;
// elsewhere, the Token, which
// an external store compares with the highest it has seen for Name and
// refuses when lower.
type Claim struct {
	// Name is the name held.
	Name string
	// Key is the store's record the holding lives in: on etcd the claim
	// key, <Prefix>/claims/<name>, one per name; on Kubernetes the
	// name's bucket Lease, which other names share. A store may keep
	// several names in one record, so Key is not Token's scope.
	Key string
	// Revision is the store's position that created the holding: it
	// changes with every new holding, by this replica or another.
	Revision int64
	// Token only grows from one holding of the name to the next, across
	// replicas: a write carrying a lower token than one already seen
	// for the name comes from a former holder. It says nothing across
	// names: another name's holding may carry a higher token while this
	// one lasts. On etcd it is Revision.
	Token int64
}

type claimKey struct{}

// ClaimFrom returns the claim under which the DoFunc or StopFunc that got
// ctx runs. The contexts a [Replica] gives its controllers carry it; any
// other context returns false.
func ClaimFrom(ctx context.Context) (Claim, bool) {
	c, ok := ctx.Value(claimKey{}).(Claim)
	return c, ok
}

func withClaim(ctx context.Context, c Claim) context.Context {
	return context.WithValue(ctx, claimKey{}, c)
}
