// Claims: the etcd key a replica must hold to run a name, and how a DoFunc
// reads it from its context to fence its own writes.

package ha

import (
	"context"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Claim identifies one holding of a name: the claim key in etcd and the
// revision at which this replica created it. A replica runs a name only
// while it holds the claim; the key lives under the replica's lease, so it
// disappears when the replica leaves, releases the name, or its lease
// expires.
//
// The local fence stops a replica that cannot reach etcd, but it cannot
// stop a process that was frozen (SIGSTOP, a long pause) and wakes up
// after its claim passed to another replica. A write that must never come
// from a former holder is made in an etcd transaction guarded by
// [Claim.Held]: etcd refuses it once the claim is gone or held anew.
type Claim struct {
	// Key is the claim key, <Prefix>/claims/<name>.
	Key string
	// Revision is the key's create revision: it changes with every new
	// holding, by this replica or another.
	Revision int64
}

// Held returns the comparison that is true in an etcd transaction while
// this holding of the claim lasts:
//
//	resp, err := cli.Txn(ctx).If(claim.Held()).Then(clientv3.OpPut(k, v)).Commit()
//	// resp.Succeeded is false when the claim was lost.
func (c Claim) Held() clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(c.Key), "=", c.Revision)
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
