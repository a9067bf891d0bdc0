// ha's feed on Kubernetes: the group's watch, from a listing, made into
// batches of record changes; the observer that judges sessions ended is
// fed by the same watch, and a session it counts ended leaves the view
// in one batch, at one position.

package kube

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/bgctl/controller/ha"
	coordinationv1 "k8s.io/api/coordination/v1"
)

// errNoListing fails a feed asked to start from a position that is not
// the backend's last listing's: the feed needs the view at its start to
// tell what each later version of a Lease changed.
var errNoListing = errors.New("kube: the feed starts only from the backend's last listing")

// kubeFeed is the feed of one watch of the group's Leases (group.feed),
// from a listing. Its view (groupView) is the listing's, and it delivers
// what each Lease's new version changes in it: a bucket's entries put or
// gone, at the bucket's resourceVersion; a member record put when its
// value or session changes (a renewal changes neither: progress alone);
// a chunk put once all its pieces have come, gone when one goes. A
// session's end is delivered only once this replica's observer counts it
// ended: its guarded delete proved it, or D passed since a time after
// the session's last renewal (observe.go). Its member record, holdings
// and chunks then go in one batch, at the position the feed has reached
// (endOf); entries the buckets still hold for it are out of the view
// from then on. Positions are resourceVersions, which compare as
// integers across the Leases since Kubernetes 1.35.
//
// It is the backend's feed in place of run: both feed the observer, and
// a backend runs one or the other. Its two goroutines, the watch's and
// the loop (run), are counted in the caller's WaitGroup; Stop ends them.
type kubeFeed struct {
	b      *kubeBackend       // immutable
	out    chan ha.FeedBatch  // one batch of room: the loop sends, the caller receives
	cancel context.CancelFunc // ends both goroutines
}

// Watch starts the feed from from, which must be the position of the
// backend's last listing (else its one batch is errNoListing). The
// observer takes the listing first, as a snapshot received when the list
// came, then every event of a watch from its resourceVersion: so it sees
// the group's versions in commit order with no gap, as its rule for a
// deletion it did not make needs (observe.go).
func (b *kubeBackend) Watch(from int64, wg *sync.WaitGroup) ha.Feed {
	ctx, cancel := context.WithCancel(context.Background())
	f := &kubeFeed{b: b, out: make(chan ha.FeedBatch, 1), cancel: cancel}
	b.mu.Lock()
	l := b.listed
	b.mu.Unlock()
	raw := make(chan change)
	failed := make(chan error, 1)
	if l == nil || l.at != from {
		failed <- fmt.Errorf("%w: asked from %d", errNoListing, from)
		l = nil
	}
	wg.Add(2)
	go func() { // owned by the feed; ends once stop cancelled ctx
		defer wg.Done()
		if l == nil {
			return
		}
		failed <- b.g.feed(ctx, strconv.FormatInt(from, 10), func(ch change) {
			select {
			case raw <- ch:
			case <-ctx.Done():
			}
		})
	}()
	go func() { // owned by the feed; ends once stop cancelled ctx
		defer wg.Done()
		f.run(ctx, l, raw, failed)
	}()
	return f
}

// Batches is where the feed delivers. It holds one batch the caller has
// not taken yet: the loop goes on taking in the watch's changes, and
// proving due sessions ended, while the caller is busy with the batch
// before; it waits for the caller at the next.
func (f *kubeFeed) Batches() <-chan ha.FeedBatch { return f.out }

// Stop ends the feed's goroutines; they end once they see it.
func (f *kubeFeed) Stop() { f.cancel() }

// run is the feed's loop: it takes in each change of the watch (the
// observer, the backend's bucket versions, the view), delivers what it
// changed, and every D/8 has the observer prove due sessions ended
// (proveDue) and delivers the ends it counts. A watch that fails or
// expires (errHistoryExpired), a bucket that does not decode, fail the
// feed.
func (f *kubeFeed) run(ctx context.Context, l *listing, raw <-chan change, failed <-chan error) {
	b := f.b
	var v *groupView
	var pos int64
	if l != nil {
		v, _ = newGroupView(b.g, l.leases, l.over) // list decoded them: no error
		pos = l.at
		b.observe(change{kind: changeSnapshot, leases: l.leases, rv: strconv.FormatInt(l.at, 10), at: l.received})
	}
	// changedAt is the position of the last batch that held changes,
	// sentAt the last batch's. An end counted by the clock while
	// changedAt is the position reached waits for the next event, from
	// waiting on and up to D/2, rather than come at that position in a
	// second batch.
	var changedAt, sentAt int64
	var waiting time.Time
	tick := time.NewTicker(b.g.duration / 8)
	defer tick.Stop()
	// due fires when the earliest stamp falls due (observer.nextDue), as
	// a tick: a silent session is proven ended then, not up to D/8 later
	// at the next tick. It fires once for a due time (fired): a proof
	// that failed is tried again at the ticks.
	due := time.NewTimer(0)
	defer due.Stop()
	var fired time.Time
	for {
		var fb ha.FeedBatch
		endsNow, ticked := false, false
		var now time.Time
		var dueC <-chan time.Time
		next, ok := b.o.nextDue()
		if ok && next.After(fired) {
			due.Reset(time.Until(next))
			dueC = due.C
		}
		select {
		case <-ctx.Done():
			return
		case err := <-failed:
			fb.Err = err
			if err == nil {
				fb.Err = errors.New("kube: the group's watch ended")
			}
		case ch := <-raw:
			b.observe(ch)
			changes, at, err := v.take(ch)
			if err != nil {
				fb.Err = err
				break
			}
			pos = max(pos, at)
			fb.Changes, fb.At, endsNow = changes, pos, true
		case now = <-tick.C:
			ticked = true
		case now = <-dueC:
			ticked, fired = true, next
		}
		if ticked {
			if v == nil {
				continue
			}
			b.proveDue(ctx)
			f.dropOver(ctx, v)
			if waiting.IsZero() {
				waiting = now
			}
			endsNow = changedAt < pos || now.Sub(waiting) >= b.g.duration/2
			fb.At = pos
		}
		if endsNow && v != nil {
			for _, identity := range v.sessions() {
				if b.o.ended(identity) {
					fb.Changes = append(fb.Changes, v.endOf(identity, pos)...)
				}
			}
			waiting = time.Time{}
		}
		if fb.Err == nil && len(fb.Changes) == 0 && fb.At <= sentAt {
			continue // nothing new to say
		}
		if len(fb.Changes) > 0 {
			changedAt = fb.At
		}
		sentAt = fb.At
		select {
		case f.out <- fb:
		case <-ctx.Done():
			return
		}
		if fb.Err != nil {
			return
		}
	}
}

// errHistoryExpired fails a feed whose watch's history expired (410):
// group.feed listed again, and the listing's versions may each stand for
// several writes. Compared with the view, two releases of one bucket
// would come as two deletions at one position, which ha takes for a
// session's end (its feed's contract); so the feed fails instead, and
// ha lists again, comparing its view with the new listing as it does
// after any gap.
var errHistoryExpired = errors.New("kube: the group's watch history expired: list again")

// take brings one change of the group's watch into the view, and
// returns what it changed, in the order of their positions, and the
// position the feed is at after it. A snapshot is errHistoryExpired.
func (v *groupView) take(ch change) ([]ha.Change, int64, error) {
	at, err := strconv.ParseInt(ch.rv, 10, 64)
	if err != nil {
		return nil, 0, fmt.Errorf("kube: resourceVersion %q is not an integer (a server before 1.35?)", ch.rv)
	}
	switch ch.kind {
	case changePut:
		chs, err := v.put(ch.lease, at)
		return chs, at, err
	case changeDelete:
		return v.deleted(ch.lease, at), at, nil
	}
	return nil, 0, errHistoryExpired
}

// dropOver deletes the piece Leases of sessions whose end the view has
// delivered, each on condition of the version seen: a crashed member's
// published sets go with it. Every replica that counts the end tries;
// the first delete wins and the others' find it gone.
func (f *kubeFeed) dropOver(ctx context.Context, v *groupView) {
	var drop []*coordinationv1.Lease
	for _, l := range v.pieces {
		if v.over[holder(l)] {
			drop = append(drop, l)
		}
	}
	for _, l := range drop {
		if err := f.b.deletePiece(ctx, l); err != nil {
			f.b.log.Debug(err.Error())
		}
	}
}

// deleted takes in the deletion of l at position at, and returns the
// changes it makes: a chunk withdrawn. A member Lease's deletion changes
// nothing yet (the member goes with its session's end: endOf); buckets
// are never deleted.
func (v *groupView) deleted(l *coordinationv1.Lease, at int64) []ha.Change {
	if l.Labels[kindLabel] != kindChunk {
		return nil
	}
	key, ok := v.pieceKey(l)
	if !ok {
		return nil
	}
	before := v.chunkRecord(key)
	delete(v.pieces, l.Name)
	return diffChunk(before, v.chunkRecord(key), key, at)
}

// endOf takes session identity out of the view for good, and returns
// the deletions that makes, all at position at, in one list: its member
// record (unless a later session of its ID has it), its holdings and its
// published chunks. ha's feed delivers them as one batch (the contract
// of its feed: a session's end at one position).
func (v *groupView) endOf(identity string, at int64) []ha.Change {
	var chs []ha.Change
	id, _ := identityID(identity)
	if l := v.members[id]; l != nil && holder(l) == identity {
		if v.memberRecord(id) != nil {
			chs = append(chs, ha.Change{Kind: ha.MemberGone, At: at, Member: id})
		}
		delete(v.members, id)
	}
	gone := map[int][]string{} // the names of identity's entries, by bucket
	for i, c := range v.claims {
		for name, e := range c {
			if e.session == identity {
				gone[i] = append(gone[i], name)
			}
		}
	}
	keys := v.chunkKeys()
	chunks := map[chunkKey]*ha.Change{}
	for _, k := range keys {
		chunks[k] = v.chunkRecord(k)
	}
	v.over[identity] = true
	// Its holdings are all that leave the buckets' records (claimRecords:
	// the entries of sessions not over), and nothing else changes there.
	for _, i := range slices.Sorted(maps.Keys(gone)) {
		slices.Sort(gone[i])
		for _, name := range gone[i] {
			chs = append(chs, ha.Change{Kind: ha.ClaimGone, At: at, Name: name})
		}
	}
	for _, k := range keys {
		chs = append(chs, diffChunk(chunks[k], v.chunkRecord(k), k, at)...)
	}
	return chs
}
