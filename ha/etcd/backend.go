// The etcd backend: a session is an etcd lease, and the member record, the
// claims and the published sets of names are keys under it.

package etcd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/bgctl/controller/ha"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// etcdBackend is the backend on etcd. It reads cli's fields at every
// call, so that a test may swap one (a Lease that counts its grants)
// before Join.
type etcdBackend struct {
	// Immutable after newEtcdBackend.
	cli            *clientv3.Client
	log            *slog.Logger
	id             string        // Options.ID
	keys           keys          // of Options.Prefix
	memberKey      string        // <Prefix>/members/<ID>
	claimPrefix    string        // <Prefix>/claims/
	requestTimeout time.Duration // Options.RequestTimeout
	// checkEvery is how often the feed checks its watch's silence, and
	// silentLimit how long a silence it gives up after (checkWatch):
	// Options.keepAliveEvery and Options.window.
	checkEvery, silentLimit time.Duration
	// listPage is how many keys one request of a listing reads: listPage
	// (a constant); tests set less before Join.
	listPage int
	// stopping bounds the requests the backend makes on its own, outside
	// any caller's context (ending a session begin could not complete): the
	// replica's, which Close ends.
	stopping context.Context
}

// newEtcdBackend returns the backend of the replica c describes, on the
// etcd cli reaches.
func newEtcdBackend(cli *clientv3.Client, c ha.BackendConfig) *etcdBackend {
	k := keysOf(c.Group)
	return &etcdBackend{
		cli:            cli,
		log:            c.Logger,
		id:             c.ID,
		keys:           k,
		memberKey:      k.members + c.ID,
		claimPrefix:    k.claims,
		requestTimeout: c.RequestTimeout,
		checkEvery:     c.RenewEvery,
		silentLimit:    c.Window,
		listPage:       listPage,
		stopping:       c.Stopping,
	}
}

// Request returns the context of one request that needs etcd's leader (a
// write, a linearizable read, a keepalive), or of a listing's page read
// serializably (readPage: the leader is not needed there, and a member
// without one refusing it only sends the page elsewhere), bounded by
// RequestTimeout. It
// carries etcd's require-leader metadata: a member that has no leader
// (cut off from its peers, for about an election timeout after the cut)
// answers at once with ErrNoLeader, instead of holding the request until
// its timeout, and the client's next request goes to another endpoint
// (reads the client retries itself, on another endpoint). The metadata
// replaces the parent's outgoing metadata, which no caller sets.
func (b *etcdBackend) Request(parent context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(clientv3.WithRequireLeader(parent), b.requestTimeout)
}

// Begin grants a lease of ttl and writes the member key under it. The
// lease counts from the grant's send time.
func (b *etcdBackend) Begin(ctx context.Context, prev ha.SessionID, ttl time.Duration, digest string) (ha.Session, error) {
	sent := time.Now()
	gctx, cancel := b.Request(ctx)
	g, err := b.cli.Grant(gctx, int64(ttl/time.Second))
	cancel()
	if err != nil {
		return ha.Session{}, fmt.Errorf("ha: granting a lease of %v: %w", ttl, err)
	}
	if granted := time.Duration(g.TTL) * time.Second; granted != ttl {
		// The fence keeps counting with the TTL asked for, the shorter.
		b.log.Warn(fmt.Sprintf("etcd granted a lease of %v instead of %v: a crashed replica's names move after the longer one", granted, ttl))
	}
	joinedAt, err := b.writeMember(ctx, clientv3.LeaseID(prev), g.ID, digest)
	if err != nil {
		b.abandon(ha.SessionID(g.ID))
		return ha.Session{}, err
	}
	return ha.Session{ID: ha.SessionID(g.ID), Sent: sent, JoinedAt: joinedAt}, nil
}

// writeMember writes the member key under lease, if it is absent or under
// prev, as begin says, and returns the revision at which it was written,
// or read before it was moved.
func (b *etcdBackend) writeMember(ctx context.Context, prev, lease clientv3.LeaseID, digest string) (joinedAt int64, err error) {
	ctx, cancel := b.Request(ctx)
	defer cancel()
	key := b.memberKey
	value := memberValue(b.id, digest, false)
	created, kv, joinedAt, err := createIfAbsent(ctx, b.cli, key, value, lease)
	if err != nil {
		return 0, fmt.Errorf("ha: writing member key %q: %w", key, err)
	}
	if created {
		return joinedAt, nil
	}
	if kv != nil && (prev == 0 || clientv3.LeaseID(kv.Lease) != prev) {
		return 0, fmt.Errorf("%w: %q (member key %q is held by lease %x)", ha.ErrDuplicateID, b.id, key, kv.Lease)
	}
	// Our own key from the previous epoch: move it to the new lease,
	// guarded by the old one, so that a key a replica of the same ID
	// wrote meanwhile (our old lease expired) is never taken over.
	moved, err := b.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.LeaseValue(key), "=", int64(prev))).
		Then(clientv3.OpPut(key, value, clientv3.WithLease(lease))).Commit()
	switch {
	case err != nil:
		return 0, fmt.Errorf("ha: writing member key %q: %w", key, err)
	case !moved.Succeeded:
		return 0, fmt.Errorf("ha: member key %q changed while it was moved to the new lease; trying again", key)
	}
	return joinedAt, nil
}

// abandon revokes a lease that begin could not complete, best effort: it
// expires anyway. It waits at most RequestTimeout, and not past Close.
func (b *etcdBackend) abandon(id ha.SessionID) {
	ctx, cancel := context.WithTimeout(b.stopping, b.requestTimeout)
	defer cancel()
	_ = b.End(ctx, id)
}

// Renew sends one keepalive, requiring a leader. etcd counts the TTL it
// answers from the request's arrival, later than the caller's send time.
func (b *etcdBackend) Renew(ctx context.Context, id ha.SessionID) (time.Duration, error) {
	resp, err := b.cli.KeepAliveOnce(clientv3.WithRequireLeader(ctx), clientv3.LeaseID(id))
	if err != nil {
		return 0, sessionErr(err)
	}
	return time.Duration(resp.TTL) * time.Second, nil
}

// End revokes the lease, which deletes every key under it in one
// revision.
func (b *etcdBackend) End(ctx context.Context, id ha.SessionID) error {
	_, err := b.cli.Revoke(ctx, clientv3.LeaseID(id))
	return sessionErr(err)
}

// PutMember puts the member key in a transaction guarded by its lease.
func (b *etcdBackend) PutMember(ctx context.Context, id ha.SessionID, digest string, leaving bool) (bool, error) {
	lease := clientv3.LeaseID(id)
	resp, err := b.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.LeaseValue(b.memberKey), "=", int64(lease))).
		Then(clientv3.OpPut(b.memberKey, memberValue(b.id, digest, leaving), clientv3.WithLease(lease))).Commit()
	if err != nil {
		return false, sessionErr(err)
	}
	return resp.Succeeded, nil
}

// EnsureMember creates the member key, or reads it, in one transaction.
func (b *etcdBackend) EnsureMember(ctx context.Context, id ha.SessionID, digest string) (ha.SessionID, bool, error) {
	created, kv, _, err := createIfAbsent(ctx, b.cli, b.memberKey, memberValue(b.id, digest, false), clientv3.LeaseID(id))
	switch {
	case err != nil:
		return 0, false, sessionErr(err)
	case created:
		return id, true, nil
	case kv == nil:
		return 0, false, nil
	}
	return ha.SessionID(kv.Lease), true, nil
}

// Claim creates the claim keys of names under the lease in one
// transaction if none exists, and else reads them all. A claim already
// under this lease (an answer lost to a timeout) is ours as well. The
// reads are a second request rather than the transaction's Else: a third
// of every request for what seldom happens.
func (b *etcdBackend) Claim(ctx context.Context, id ha.SessionID, names []string) (got []ha.Claimed, absent []string, err error) {
	lease := clientv3.LeaseID(id)
	cmps := make([]clientv3.Cmp, len(names))
	puts := make([]clientv3.Op, len(names))
	for i, name := range names {
		key := b.claimPrefix + name
		cmps[i] = clientv3.Compare(clientv3.CreateRevision(key), "=", 0)
		puts[i] = clientv3.OpPut(key, b.id, clientv3.WithLease(lease))
	}
	resp, err := b.cli.Txn(ctx).If(cmps...).Then(puts...).Commit()
	if err != nil {
		return nil, nil, claimErr(err)
	}
	got = make([]ha.Claimed, 0, len(names))
	if resp.Succeeded {
		for _, name := range names {
			got = append(got, ha.Claimed{Name: name, Mine: true, Revision: resp.Header.Revision, Key: b.claimPrefix + name, Token: resp.Header.Revision})
		}
		return got, nil, nil
	}
	gets := make([]clientv3.Op, len(names))
	for i, name := range names {
		gets[i] = clientv3.OpGet(b.claimPrefix + name)
	}
	if resp, err = b.cli.Txn(ctx).Then(gets...).Commit(); err != nil {
		return nil, nil, claimErr(err)
	}
	hdr := resp.Header.Revision
	for i, name := range names {
		kvs := resp.Responses[i].GetResponseRange().GetKvs()
		if len(kvs) == 0 {
			absent = append(absent, name)
			continue
		}
		kv := kvs[0]
		c := ha.Claimed{Name: name, At: hdr}
		if clientv3.LeaseID(kv.Lease) == lease {
			c.Mine, c.Key, c.Token = true, b.claimPrefix+name, kv.CreateRevision
		} else {
			c.Holder, c.Session = string(kv.Value), ha.SessionID(kv.Lease)
		}
		c.Revision = kv.CreateRevision
		got = append(got, c)
	}
	return got, absent, nil
}

// maxClaimBatch is how many names one claim transaction creates at most:
// etcd's default --max-txn-ops, which bounds each of a transaction's
// comparisons, its operations on success and those on failure. A server
// started with less answers ErrTooManyOps; the replica then halves the
// refused chunk until the server takes them.
const maxClaimBatch = 128

// maxClaimBytes bounds the bytes of one claim transaction: below etcd's
// default request limit (--max-request-bytes, 1.5 MiB) and the client's
// (2 MiB), so that long names are claimed in smaller batches rather than
// refused whole (ClaimCost counts a name's bytes).
const maxClaimBytes = 1 << 20

// ClaimLimits returns etcd's defaults: maxClaimBatch names, maxClaimBytes.
func (b *etcdBackend) ClaimLimits() (names, bytes int) { return maxClaimBatch, maxClaimBytes }

// ClaimCost counts a name's key twice (the comparison and the put) and
// the value once.
func (b *etcdBackend) ClaimCost(name string) int {
	return 2*(len(b.claimPrefix)+len(name)) + len(b.id) + 32
}

// claimErr maps etcd's refusals of a claim transaction to errTooManyOps
// (more operations than --max-txn-ops) and errTooLarge (more bytes than
// --max-request-bytes, or the client's limit), and an unknown lease to
// errSessionEnded, keeping etcd's error in the chain.
func claimErr(err error) error {
	switch {
	case errors.Is(err, rpctypes.ErrTooManyOps) || errors.Is(err, rpctypes.ErrGRPCTooManyOps):
		return fmt.Errorf("%w: %w", ha.ErrTooManyOps, err)
	case errors.Is(err, rpctypes.ErrRequestTooLarge) || errors.Is(err, rpctypes.ErrGRPCRequestTooLarge) ||
		status.Code(err) == codes.ResourceExhausted:
		return fmt.Errorf("%w: %w", ha.ErrTooLarge, err)
	}
	return sessionErr(err)
}

// Release deletes the claim key in a transaction guarded by its create
// revision (Held).
func (b *etcdBackend) Release(ctx context.Context, c ha.Claim) error {
	c.Key = b.claimPrefix + c.Name
	_, err := b.cli.Txn(ctx).If(Held(c)).Then(clientv3.OpDelete(c.Key)).Commit()
	return err
}

// MemberSession reads the member key and returns its lease.
func (b *etcdBackend) MemberSession(ctx context.Context) (ha.SessionID, bool, error) {
	resp, err := b.cli.Get(ctx, b.memberKey)
	switch {
	case err != nil:
		return 0, false, fmt.Errorf("ha: reading member key %q: %w", b.memberKey, err)
	case len(resp.Kvs) == 0:
		return 0, false, nil
	}
	return ha.SessionID(resp.Kvs[0].Lease), true, nil
}

var _ ha.Rounding = (*etcdBackend)(nil)

// Rounding is a second: etcd answers a lease's time left in whole
// seconds, truncated.
func (b *etcdBackend) Rounding() time.Duration { return time.Second }

// TimeLeft reads the lease's remaining TTL, which etcd truncates to whole
// seconds; a TTL of -1 is a lease that has expired.
func (b *etcdBackend) TimeLeft(ctx context.Context, id ha.SessionID) (left, granted time.Duration, err error) {
	resp, err := b.cli.TimeToLive(ctx, clientv3.LeaseID(id))
	switch {
	case err != nil:
		return 0, 0, sessionErr(err)
	case resp.TTL < 0:
		return 0, 0, fmt.Errorf("%w: lease %x has expired", ha.ErrSessionEnded, int64(id))
	}
	return time.Duration(resp.TTL) * time.Second, time.Duration(resp.GrantedTTL) * time.Second, nil
}

// Publish puts each chunk under the lease, then deletes the old set's
// keys (every set's, when digest is ""), one request each.
func (b *etcdBackend) Publish(ctx context.Context, id ha.SessionID, digest, old string, chunks [][]byte) error {
	var ops []clientv3.Op
	if digest != "" {
		for i, c := range chunks {
			ops = append(ops, clientv3.OpPut(b.keys.chunkKey(b.id, digest, i, len(chunks)), string(c), clientv3.WithLease(clientv3.LeaseID(id))))
		}
	}
	mine := b.keys.names + b.id + "/"
	switch {
	case digest == "":
		ops = append(ops, clientv3.OpDelete(mine, clientv3.WithPrefix()))
	case old != "" && old != digest:
		ops = append(ops, clientv3.OpDelete(mine+old+"/", clientv3.WithPrefix()))
	}
	for _, op := range ops {
		rctx, cancel := context.WithTimeout(ctx, b.requestTimeout)
		_, err := b.cli.Do(rctx, op)
		cancel()
		if err != nil {
			return sessionErr(err)
		}
	}
	return nil
}

// Fetch reads the set's keys in one request, at its header's revision.
func (b *etcdBackend) Fetch(ctx context.Context, member, digest string) ([]ha.Chunk, int64, error) {
	resp, err := b.cli.Get(ctx, b.keys.names+member+"/"+digest+"/", clientv3.WithPrefix())
	if err != nil {
		return nil, 0, err
	}
	var chunks []ha.Chunk
	for _, kv := range resp.Kvs {
		if c, ok := b.keys.parseChunk(string(kv.Key), kv.Value); ok {
			chunks = append(chunks, c)
		}
	}
	return chunks, resp.Header.Revision, nil
}

// PeerLeft asks etcd, as timeLeft does: any client may read any lease's
// TTL.
func (b *etcdBackend) PeerLeft(ctx context.Context, id ha.SessionID) (left, granted time.Duration, err error) {
	return b.TimeLeft(ctx, id)
}

// sessionErr returns err, wrapping errSessionEnded as well when etcd
// answered that it does not know the lease.
func sessionErr(err error) error {
	if isLeaseNotFound(err) {
		return fmt.Errorf("%w: %w", ha.ErrSessionEnded, err)
	}
	return err
}

func isLeaseNotFound(err error) bool {
	return errors.Is(err, rpctypes.ErrLeaseNotFound) || errors.Is(err, rpctypes.ErrGRPCLeaseNotFound)
}

// createIfAbsent creates key, holding value, under lease if the key does
// not exist, and reads it otherwise, in one transaction. It returns
// whether it created the key, the key it found instead (nil when it
// created it), and the transaction's header revision.
func createIfAbsent(ctx context.Context, kv clientv3.KV, key, value string, lease clientv3.LeaseID) (created bool, found *mvccpb.KeyValue, hdr int64, err error) {
	resp, err := kv.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, value, clientv3.WithLease(lease))).
		Else(clientv3.OpGet(key)).Commit()
	if err != nil {
		return false, nil, 0, err
	}
	if resp.Succeeded {
		return true, nil, resp.Header.Revision, nil
	}
	// The Else read the key in the same transaction: it exists.
	if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) == 1 {
		found = kvs[0]
	}
	return false, found, resp.Header.Revision, nil
}
