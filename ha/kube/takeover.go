// A crashed replica's share handed to the survivors: each bucket by the
// one survivor that owns it, one write per bucket, the writes split over
// the survivors.

package kube

import (
	"context"
	"fmt"
	"hash/fnv"
	"strconv"
	"sync"
)

// liveMembers returns the members the feed shows whose sessions the
// observer does not count ended: member ID → session identity.
func (b *kubeBackend) liveMembers() map[string]string {
	b.mu.Lock()
	ids := make(map[string]string, len(b.members))
	for id, l := range b.members {
		ids[id] = holder(l)
	}
	b.mu.Unlock()
	for id, identity := range ids {
		if b.o.ended(identity) {
			delete(ids, id)
		}
	}
	return ids
}

// bucketOwner returns the owner of bucket i among the member IDs of
// members by rendezvous hashing: the ID with the highest score of ID and
// i (bucketScore). Every replica that sees the same members picks the
// same owner, and a member's leaving moves only its own buckets.
func bucketOwner(i int, members map[string]string) string {
	best, bestH := "", uint64(0)
	for id := range members {
		if v := bucketScore(id, i); best == "" || v > bestH || (v == bestH && id < best) {
			best, bestH = id, v
		}
	}
	return best
}

// bucketScore is FNV-1a (64 bits) of id, a zero byte and i in decimal,
// then mixed so that every bit of it depends on every input byte: FNV-1a
// alone barely moves its top bits for IDs that differ in one byte
// ("r0", "r1"), and one member would then own most buckets (measured: 246
// of 256 for r1 beside r0).
func bucketScore(id string, i int) uint64 {
	h := fnv.New64a()
	h.Write([]byte(id))
	h.Write([]byte{0})
	h.Write([]byte(strconv.Itoa(i)))
	v := h.Sum64()
	v = (v ^ v>>30) * 0xbf58476d1ce4e5b9
	v = (v ^ v>>27) * 0x94d049bb133111eb
	return v ^ v>>31
}

// takeOver hands the names of ended sessions to their new owners, in the
// buckets this replica owns among the live members (bucketOwner): for
// each, one change, by session id, giving every name of the bucket held
// by a session the observer counts ended to the live session of
// ownerOf(name), a member ID (a name whose owner is not a live member is
// left). The buckets are those the feed brought, at their versions then
// (a stale one costs a conflict and a read). So a crashed replica's
// share moves in one write per bucket, the writes split over the
// survivors, each counting the end as soon as its own observer does:
// the one whose guarded delete proved it, or one whose feed brought that
// deletion after the versions it stamped (observe.go). A name the
// bucket gives to this session by the time it writes (claimed here, or
// handed over by another survivor, since the version planned from) is
// left as it is (claimChange.othersOnly). It answers the number of
// buckets written.
func (b *kubeBackend) takeOver(ctx context.Context, id sessionID, ownerOf func(name string) string) (int, error) {
	s := b.live(id)
	if s == nil {
		return 0, b.ended(id)
	}
	members := b.liveMembers()
	b.mu.Lock()
	type plan struct {
		i    int
		from known
		give map[string]string
	}
	var plans []plan
	for i, k := range b.buckets {
		if k.lease == nil || bucketOwner(i, members) != b.id {
			continue
		}
		c, err := claimsOf(k.lease)
		if err != nil {
			continue
		}
		give := map[string]string{}
		for n, e := range c {
			if to, ok := members[ownerOf(n)]; ok && e.session != to && b.o.ended(e.session) {
				give[n] = to
			}
		}
		if len(give) > 0 {
			plans = append(plans, plan{i: i, from: k, give: give})
		}
	}
	b.mu.Unlock()
	var mu sync.Mutex
	var wrote int
	var errs []error
	byIndex := map[int]plan{}
	var buckets []int
	for _, p := range plans {
		byIndex[p.i] = p
		buckets = append(buckets, p.i)
	}
	b.each(buckets, func(i int) {
		p := byIndex[i]
		res, err := b.g.change(ctx, b.o, i, claimChange{give: p.give, othersOnly: true}, s.writer(), &p.from)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			errs = append(errs, err)
			return
		}
		b.remember(i, res.lease)
		if res.wrote {
			wrote++
		}
	})
	if len(errs) > 0 {
		return wrote, fmt.Errorf("kube: taking over %d buckets: %w", len(errs), errs[0])
	}
	return wrote, nil
}
