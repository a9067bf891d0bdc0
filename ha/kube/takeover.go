// A crashed replica's share handed to the survivors: each bucket by the
// one survivor that owns it, one write per bucket, the writes split over
// the survivors.

package kube

import (
	"context"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/bgctl/controller/ha"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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

// awaitHandOvers waits, within ctx, until a new version comes of each
// bucket of byBucket (names by bucket index) whose version known gives
// one of its names to a session the observer counts ended: the takeOver
// of the live member that owns the bucket (bucketOwner) rewrites it,
// giving such names to their owners, and a claim that wrote it first
// would cost the bucket a second write, and the owner's write a
// conflict. The versions come from the feed, or from a list of the
// buckets every handOverPoll: the feed goes at the pace its receiver
// takes its batches, and ha's, busy with the names that moved, may take
// seconds to let through the rewrites of a hundred buckets. It gives up
// once a request timeout passes with none of them rewritten (the
// survivor that owns them crashed too, or never asked), and D (or a
// request timeout, if longer) after it began at the latest; a bucket not
// rewritten by then is written by the claim, as any other. It waits only
// within a request timeout of its ha's last TakeOver (noteHandOver),
// which ha makes from its loop before it claims the names: a claim with
// no hand-over asked for (ha saw the end in a listing, or the backend is
// driven without a Replica) does not wait. A bucket this replica owns
// is waited for only while a takeOver of its own runs (handing): none
// other writes it. An ended session whose buckets a wait left unwritten
// is waited for no more (unhanded): the next claims of its names would
// each wait again for a hand-over that does not come.
func (b *kubeBackend) awaitHandOvers(ctx context.Context, byBucket map[int][]string) {
	if !b.askedToHandOver() {
		return // its ha asked for no hand-over lately: no survivor's rewrite to wait for
	}
	members := b.liveMembers()
	if _, live := members[b.id]; !live {
		return // the feed does not show this replica yet: there is no takeOver to wait for
	}
	pending := map[int]int64{}     // bucket → the version known
	waitsFor := map[int][]string{} // bucket → the ended sessions its version gives the names to
	b.mu.Lock()
	unhanded := maps.Clone(b.unhanded)
	b.mu.Unlock()
	for i, names := range byBucket {
		k := b.known(i)
		if k == nil || k.lease == nil {
			continue
		}
		c, err := claimsOf(k.lease)
		if err != nil {
			continue
		}
		for _, n := range names {
			if e, held := c[n]; held && !unhanded[e.session] && b.o.ended(e.session) {
				pending[i] = rvOf(k.lease)
				waitsFor[i] = append(waitsFor[i], e.session)
			}
		}
	}
	if len(pending) == 0 {
		return
	}
	// The give-up timer starts again at each rewrite seen: a survivor
	// rewriting its buckets at its client's rate limit, on a loaded
	// machine, may take longer than a request timeout for all of them
	// (measured: 5 s for 138 buckets at 50 requests a second, under
	// -race beside other suites), and a claim that gave up on it then
	// would write the rest a second time, each a conflict for the
	// survivor's rewrite.
	whole := time.Now().Add(max(b.g.duration, b.requestTimeout))
	limit := time.NewTimer(b.requestTimeout)
	defer limit.Stop()
	poll := time.NewTicker(handOverPoll)
	defer poll.Stop()
	polled := time.Now() // this wait's last poll, at first its start (rememberBuckets)
	for {
		moved := b.bucketsMoved() // before the look: a version remembered, or a takeOver ended, after it closes it
		handing := b.handingOver()
		rewritten := false
		for i, rv := range pending {
			if k := b.known(i); k != nil && k.lease != nil && rvOf(k.lease) > rv {
				delete(pending, i)
				rewritten = true
			} else if !handing && bucketOwner(i, members) == b.id {
				delete(pending, i) // this replica's own takeOver would write it, and none runs: no sign of a hand-over going on
			}
		}
		if len(pending) == 0 {
			return
		}
		if rewritten {
			limit.Reset(min(b.requestTimeout, time.Until(whole))) // a hand-over goes on: wait for the rest
		}
		select {
		case <-moved:
		case <-poll.C:
			polled = b.rememberBuckets(ctx, polled)
		case <-limit.C:
			b.mu.Lock()
			if b.unhanded == nil {
				b.unhanded = map[string]bool{}
			}
			for i := range pending {
				for _, id := range waitsFor[i] {
					b.unhanded[id] = true
				}
			}
			b.mu.Unlock()
			return
		case <-ctx.Done():
			return
		}
	}
}

// handingOver reports whether a takeOver of this backend runs.
func (b *kubeBackend) handingOver() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.handing > 0
}

// listBuckets lists every bucket Lease of the group with one quorum
// list (no resourceVersion).
func (g *group) listBuckets(ctx context.Context) (*coordinationv1.LeaseList, error) {
	return g.leases.List(ctx, metav1.ListOptions{LabelSelector: groupLabel + "=" + g.name + "," + kindLabel + "=" + kindBucket})
}

// handOverPoll is how often awaitHandOvers lists the buckets: a list of
// every bucket is one request, of about 2.5 MB at 100,000 names.
const handOverPoll = 250 * time.Millisecond

// rememberBuckets lists every bucket Lease of the group, bounded by the
// request timeout and ctx, and remembers each version (remember keeps
// the later of it and the one known), unless another wait began a list
// since last, the previous poll of the wait calling (the versions it
// brings wake every waiter). It answers the time of this poll. A list
// that fails is logged at Debug. Not a list begun less than
// handOverPoll ago: a wait's ticks come a little late one time and less
// the next, and it would skip every other list of its own.
func (b *kubeBackend) rememberBuckets(ctx context.Context, last time.Time) time.Time {
	b.mu.Lock()
	now := time.Now()
	shared := b.polledAt.After(last)
	if !shared {
		b.polledAt = now
	}
	b.mu.Unlock()
	if shared {
		return now
	}
	rctx, cancel := b.request(ctx)
	defer cancel()
	ls, err := b.g.listBuckets(rctx)
	if err != nil {
		b.log.Debug(fmt.Sprintf("kube: listing the buckets of %s: %v", b.g.name, err))
		return now
	}
	for k := range ls.Items {
		if i, ok := b.bucketIndex(ls.Items[k].Name); ok {
			b.remember(i, &ls.Items[k])
		}
	}
	return now
}

// TakeOver notes that the replica's ha is handing over (so that its
// claims wait for the survivors' rewrites: awaitHandOvers), then hands
// an ended session's names to their owners on a goroutine counted in wg,
// one write per bucket this replica owns among the live members
// (takeOver), each bounded by the request timeout and ctx. A failure is
// logged at Debug: the claims that follow write what it did not.
func (b *kubeBackend) TakeOver(ctx context.Context, id ha.SessionID, ownerOf func(name string) string, wg *sync.WaitGroup) {
	b.noteHandOver() // counted as running from here, so that a claim that comes first waits for it
	wg.Go(func() {
		defer b.handOverDone()
		if _, err := b.takeOver(ctx, id, ownerOf); err != nil {
			b.log.Debug(fmt.Sprintf("kube: handing over the names of ended sessions: %v", err))
		}
	})
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
// left as it is (claimChange.othersOnly). Each write is bounded by the
// request timeout and ctx. It answers the number of buckets written.
func (b *kubeBackend) takeOver(ctx context.Context, id ha.SessionID, ownerOf func(name string) string) (int, error) {
	s := b.live(id)
	if s == nil {
		return 0, b.ended(id)
	}
	members := b.liveMembers()
	b.mu.Lock()
	b.handing++
	defer func() {
		b.mu.Lock()
		b.handing--
		b.wakeLocked() // the claims waiting for this replica's buckets
		b.mu.Unlock()
	}()
	owned := map[int]known{} // the versions planned from, copied under the lock, decoded outside it
	for i, k := range b.buckets {
		if k.lease != nil && bucketOwner(i, members) == b.id {
			owned[i] = k
		}
	}
	b.mu.Unlock()
	type plan struct {
		from known
		give map[string]string
	}
	byIndex := map[int]plan{}
	for i, k := range owned {
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
			byIndex[i] = plan{from: k, give: give}
		}
	}
	var mu sync.Mutex
	var wrote int
	var errs []error
	buckets := slices.Collect(maps.Keys(byIndex))
	b.each(buckets, func(i int) {
		p := byIndex[i]
		rctx, cancel := b.request(ctx) // each bucket's write on its own, as claim's
		res, err := b.g.change(rctx, b.o, i, claimChange{give: p.give, othersOnly: true}, s.writer(), &p.from)
		cancel()
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

// noteHandOver records that this replica's ha asked for a hand-over now,
// and counts it running (handing) until handOverDone.
func (b *kubeBackend) noteHandOver() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.handOverAt = time.Now()
	b.handing++
}

// handOverDone ends what noteHandOver counted, and wakes the claims
// waiting for this replica's own buckets.
func (b *kubeBackend) handOverDone() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.handing--
	b.wakeLocked()
}

// askedToHandOver reports that this replica's ha asked for a hand-over
// within the last request timeout.
func (b *kubeBackend) askedToHandOver() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return !b.handOverAt.IsZero() && time.Since(b.handOverAt) < b.requestTimeout
}
