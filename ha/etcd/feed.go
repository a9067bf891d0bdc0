// The etcd backend's feed: the group's keys decoded into changes, and
// listings of the prefix at one revision, read in pages.

package etcd

import (
	"context"
	"errors"
	"strings"

	"github.com/bgctl/controller/ha"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// decode returns the change kv is, put (deleted false) or deleted, at its
// mod revision; ok is false for a key of the prefix that is none of a
// member's, a claim's or a chunk's.
func (k keys) decode(kv *mvccpb.KeyValue, deleted bool) (c ha.Change, ok bool) {
	key := string(kv.Key)
	c.At = kv.ModRevision
	if id, ok := strings.CutPrefix(key, k.members); ok {
		c.Kind, c.Member = ha.MemberPut, id
		if deleted {
			c.Kind = ha.MemberGone
			return c, true
		}
		c.Session, c.Created = ha.SessionID(kv.Lease), kv.CreateRevision
		c.Digest, c.Leaving = parseMemberValue(id, string(kv.Value))
		return c, true
	}
	if name, ok := strings.CutPrefix(key, k.claims); ok {
		c.Kind, c.Name = ha.ClaimPut, name
		if deleted {
			c.Kind = ha.ClaimGone
			return c, true
		}
		c.Member, c.Session, c.Created = string(kv.Value), ha.SessionID(kv.Lease), kv.CreateRevision
		return c, true
	}
	if c.Chunk, ok = k.parseChunk(key, kv.Value); ok {
		c.Kind = ha.ChunkPut
		if deleted {
			c.Kind, c.Chunk.Data = ha.ChunkGone, nil
		}
		return c, true
	}
	return ha.Change{}, false
}

// List reads the prefix at one revision: the claims and members a page of
// listPage keys at a time, the published sets setPage chunks at a time,
// and what else the prefix holds (nothing of ours) like the first.
func (b *etcdBackend) List(ctx context.Context) ([]ha.Change, int64, error) {
	k := b.keys
	setsStart, setsEnd := k.names, clientv3.GetPrefixRangeEnd(k.names)
	kvs, rev, err := b.listRange(ctx, k.all, setsStart, 0, b.listPage)
	if err != nil {
		return nil, 0, err
	}
	sets, _, err := b.listRange(ctx, setsStart, setsEnd, rev, setPage)
	if err != nil {
		return nil, 0, err
	}
	rest, _, err := b.listRange(ctx, setsEnd, clientv3.GetPrefixRangeEnd(k.all), rev, b.listPage)
	if err != nil {
		return nil, 0, err
	}
	records := make([]ha.Change, 0, len(kvs)+len(sets)+len(rest))
	for _, part := range [][]*mvccpb.KeyValue{kvs, sets, rest} {
		for _, kv := range part {
			if c, ok := k.decode(kv, false); ok {
				records = append(records, c)
			}
		}
	}
	return records, rev, nil
}

// HeldAt lists the claim keys, keys only, at revision at.
func (b *etcdBackend) HeldAt(ctx context.Context, at int64) (map[string]bool, error) {
	kvs, _, err := b.listAll(ctx, b.keys.claims, at, clientv3.WithKeysOnly())
	if err != nil {
		return nil, err
	}
	names := make(map[string]bool, len(kvs))
	for _, kv := range kvs {
		names[strings.TrimPrefix(string(kv.Key), b.keys.claims)] = true
	}
	return names, nil
}

// listPage is how many keys one request of a listing reads at most
// (etcdBackend.listPage; tests set less). A listing of 100,000 claims in
// one answer, about 10 MB, outlasted RequestTimeout (750ms at TTL 2s) on
// a server busy with the releases of a join, and was read again whole
// after each timeout, for 4 s (TestUpgradeScaleMeasurement); a page of
// 10,000 keys takes a tenth.
const listPage = 10000

// setPage is how many chunks of published sets one request of a listing
// reads: at most maxChunk each, 1 MiB a page, where a page of listPage
// chunks could be as large as the whole listing once was.
const setPage = 2

// listAll reads every key under prefix at one revision (see listRange),
// listPage keys a page.
func (b *etcdBackend) listAll(ctx context.Context, prefix string, rev int64, opts ...clientv3.OpOption) ([]*mvccpb.KeyValue, int64, error) {
	return b.listRange(ctx, prefix, clientv3.GetPrefixRangeEnd(prefix), rev, b.listPage, opts...)
}

// listRange reads every key in [start, end) at one revision, rev or (0)
// the revision of the first page's read, perPage keys per request, each
// bounded by RequestTimeout and by ctx (which the loop ends when the
// fence passes: it waits for the answer, and must see the fence pass).
// It returns the keys, in order, and the revision read. Any error fails
// it, a revision compacted between pages included: the caller lists
// again. The loop waits for every page: a listing of 100,000 claims under
// load may take seconds (a fence pass, Close and Leave's context still
// end it at once).
func (b *etcdBackend) listRange(ctx context.Context, start, end string, rev int64, perPage int, opts ...clientv3.OpOption) ([]*mvccpb.KeyValue, int64, error) {
	var kvs []*mvccpb.KeyValue
	for key := start; ; {
		page := append([]clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(int64(perPage))}, opts...)
		if rev != 0 {
			page = append(page, clientv3.WithRev(rev))
		}
		resp, err := b.readPage(ctx, key, rev != 0, page)
		if err != nil {
			return nil, 0, err
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		kvs = append(kvs, resp.Kvs...)
		if !resp.More || len(resp.Kvs) == 0 {
			return kvs, rev, nil
		}
		key = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00" // the next key after the page's last
	}
}

// readPage reads one page of a listing. A page at a revision already read (known)
// is read serializably: answered by the member the client reaches from
// what it has applied, without waiting, as a linearizable read does, for
// the member to apply every write committed before it. A join's 25,000
// releases kept each linearizable page of 10,000 claims waiting about
// 0.5 s (TestUpgradeScaleMeasurement). The data at a revision does not
// change, so any member that has applied it answers alike; one that has
// not yet (a follower behind) refuses with a future-revision error, and
// the page is read again linearizably.
func (b *etcdBackend) readPage(ctx context.Context, key string, known bool, page []clientv3.OpOption) (*clientv3.GetResponse, error) {
	get := func(opts []clientv3.OpOption) (*clientv3.GetResponse, error) {
		rctx, cancel := b.Request(ctx)
		defer cancel()
		return b.cli.Get(rctx, key, opts...)
	}
	if !known {
		return get(page)
	}
	resp, err := get(append(page[:len(page):len(page)], clientv3.WithSerializable()))
	if isFutureRev(err) {
		return get(page)
	}
	return resp, err
}

// isFutureRev reports whether err is etcd's refusal of a read at a
// revision the member has not applied yet.
func isFutureRev(err error) bool {
	return errors.Is(err, rpctypes.ErrFutureRev) || errors.Is(err, rpctypes.ErrGRPCFutureRev)
}
