// The store on etcd: where a group keeps its sessions (etcd leases),
// member records, claims and published sets of names, and how a DoFunc
// fences its own writes with a claim.

package etcd

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/bgctl/controller/ha"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Store returns the store on etcd that cli reaches: the group lives under
// Options.Prefix, its sessions are etcd leases, and a DoFunc fences its
// own writes with [Held]. cli must outlive every Replica made on it;
// closing it without Leave is how a crash looks to the others.
func Store(cli *clientv3.Client) ha.Store { return store{cli} }

// store is the Store that Store returns.
type store struct{ cli *clientv3.Client }

// Backend returns an etcdBackend for c.
func (s store) Backend(c ha.BackendConfig) (ha.Backend, error) {
	if s.cli == nil {
		return nil, fmt.Errorf("%w: the etcd client must not be nil", ha.ErrInvalidOptions)
	}
	return newEtcdBackend(s.cli, c), nil
}

// Held returns the comparison that is true in an etcd transaction while
// the holding c lasts:
//
//	resp, err := cli.Txn(ctx).If(etcd.Held(claim)).Then(clientv3.OpPut(k, v)).Commit()
//	// resp.Succeeded is false when the claim was lost.
func Held(c ha.Claim) clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(c.Key), "=", c.Revision)
}

// keys are the etcd keys and prefixes of one Options.Prefix.
type keys struct {
	all, members, claims, names string
}

// The key elements after the Prefix under which member records, claims
// and the published sets of names live: <Prefix>/name-sets/<ID>/<digest>/
// <i>-of-<n> for a set. ha refuses a Prefix that holds any of them as an
// element of its own, so that no two groups' keys can be taken for each
// other's.
const (
	membersSegment = "members"
	claimsSegment  = "claims"
	namesSegment   = "name-sets"
)

// keysOf returns the keys of the group prefix.
func keysOf(prefix string) keys {
	return keys{all: prefix + "/", members: prefix + "/" + membersSegment + "/", claims: prefix + "/" + claimsSegment + "/", names: prefix + "/" + namesSegment + "/"}
}

// digestMark introduces the digest in a member key's value.
const digestMark = " names="

// leavingSuffix ends the value of a member key whose replica is leaving:
// its controllers have all terminated, and the revocation of its lease
// that follows is no early end (see markLeaving).
const leavingSuffix = " (leaving)"

// memberValue is the value of a member key: the ID, the digest of the
// member's names, and the leaving suffix when it leaves, as in
// "r0 names=00…ff (leaving)". A replica of an earlier version writes the
// ID alone ("r0", "r0 (leaving)"): its names are not known.
func memberValue(id, digest string, leaving bool) string {
	v := id + digestMark + digest
	if leaving {
		v += leavingSuffix
	}
	return v
}

// parseMemberValue returns the digest in the member key value v of id,
// "" when it has none, and whether v marks the member leaving.
func parseMemberValue(id, v string) (digest string, leaving bool) {
	rest, ok := strings.CutPrefix(v, id)
	if !ok {
		return "", false
	}
	rest, leaving = strings.CutSuffix(rest, leavingSuffix)
	digest, _ = strings.CutPrefix(rest, digestMark)
	if digest == rest {
		digest = "" // no mark: an earlier version's value
	}
	return digest, leaving
}

// chunkKey returns the key of chunk i of n of the set with digest of
// member id.
func (k keys) chunkKey(id, digest string, i, n int) string {
	return fmt.Sprintf("%s%s/%s/%d-of-%d", k.names, id, digest, i, n)
}

// parseChunkKey splits rest, a key after keys.names, into the member,
// the digest and the chunk's place; ok is false for a key of another form.
func parseChunkKey(rest string) (id, digest string, i, n int, ok bool) {
	parts := strings.Split(rest, "/")
	if len(parts) != 3 {
		return "", "", 0, 0, false
	}
	is, ns, found := strings.Cut(parts[2], "-of-")
	i, err1 := strconv.Atoi(is)
	n, err2 := strconv.Atoi(ns)
	if !found || err1 != nil || err2 != nil || n < 1 || n > 1<<16 || i < 0 || i >= n {
		return "", "", 0, 0, false
	}
	return parts[0], parts[1], i, n, true
}

// parseChunk returns the chunk that key, holding value, is; ok is false
// for a key that is not a chunk's.
func (k keys) parseChunk(key string, value []byte) (c ha.Chunk, ok bool) {
	rest, ok := strings.CutPrefix(key, k.names)
	if !ok {
		return ha.Chunk{}, false
	}
	c.Member, c.Digest, c.Index, c.Count, ok = parseChunkKey(rest)
	c.Data = value
	return c, ok
}
