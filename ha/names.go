// Which names each member registers: a digest of its names in its member
// key, and its whole set of names published while the members' digests
// differ (a rolling upgrade), so that a name is owned only by a member
// that registers it.

package ha

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/bgctl/controller/ha/internal/nameset"
	"github.com/bgctl/controller/ha/internal/place"
)

// digestString returns the digest of the names registered here.
func (r *Replica) digestString() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.digest.String()
}

// namesDigest identifies a set of names: per lane, the sum modulo 2⁶⁴ of
// a 64-bit piece of each name's SHA-256. A sum, not a hash of the sorted
// names, so that a registration changes it in O(1), with no sorting and
// no memory per name; two different sets share it with a chance of about
// 2⁻¹²⁸ (the sets come from programs, not from an adversary). Every
// version sharing a prefix must compute it alike (TestNamesDigestIsStable).
type namesDigest [2]uint64

func (d *namesDigest) add(name string)    { d.step(name, 1) }
func (d *namesDigest) remove(name string) { d.step(name, ^uint64(0)) } // adds −1 × the hash

func (d *namesDigest) step(name string, sign uint64) {
	h := sha256.Sum256([]byte(name))
	d[0] += sign * binary.BigEndian.Uint64(h[0:8])
	d[1] += sign * binary.BigEndian.Uint64(h[8:16])
}

// String returns the digest as 32 hex digits.
func (d namesDigest) String() string { return fmt.Sprintf("%016x%016x", d[0], d[1]) }

// nameSet is a set of names a member published, as the view has it: its
// chunks until they have all come, then the names.
type nameSet struct {
	// chunks by index, kept once complete: a chunk deleted (the old lease
	// of a replica that wrote them again under a new one) makes the set
	// incomplete, and the chunk written again completes it anew.
	chunks [][]byte
	have   int                 // chunks present
	names  map[string]struct{} // nil while incomplete
}

// putChunkLocked brings a chunk of a published set into the view; the set
// is decoded once its last chunk came, and placement is computed afresh.
// A replica's own set is not kept: it knows its names.
func (r *Replica) putChunkLocked(c Chunk) {
	id, digest, i, n := c.Member, c.Digest, c.Index, c.Count
	if id == r.opts.ID {
		return
	}
	k := id + "/" + digest
	delete(r.badSets, k) // a chunk written again: worth decoding again
	s := r.sets[k]
	if s == nil {
		s = &nameSet{chunks: make([][]byte, n)}
		r.sets[k] = s
	}
	if len(s.chunks) != n {
		return // another split of the same digest: ignored
	}
	if s.chunks[i] == nil {
		s.have++
	}
	s.chunks[i] = c.Data
	if s.have < n || s.names != nil {
		return // incomplete, or a chunk written again into a complete set
	}
	names, err := nameset.Decode(s.chunks)
	if err != nil {
		r.log.Warn(fmt.Sprintf("member %q published a set of names that does not decode: its names count as unknown", id), "error", err)
		delete(r.sets, k)
		r.badSets[k] = struct{}{}
		return
	}
	s.names = names
	r.membershipChangedLocked()
}

// deleteChunkLocked takes a deleted chunk out of its set, which is then
// incomplete until the chunk is written again: a member withdraws a set
// whole (or its lease takes it), and a replica whose fence passed writes
// its set again under its new lease while its old lease, revoked, takes
// the chunks not written again yet. Dropping the whole set there would
// leave it incomplete for good. A set with no chunk left is forgotten.
func (r *Replica) deleteChunkLocked(c Chunk) {
	i, n := c.Index, c.Count
	k := c.Member + "/" + c.Digest
	s := r.sets[k]
	if s == nil || len(s.chunks) != n || s.chunks[i] == nil {
		return
	}
	s.chunks[i] = nil
	s.have--
	if s.names != nil {
		s.names = nil
		r.membershipChangedLocked()
	}
	if s.have == 0 {
		delete(r.sets, k)
	}
}

// placement is what ownerLocked computes owners from, built from the
// view when first needed after it changed.
type placement struct {
	// ids are the live members: sorted by ID in Spread mode, from the
	// oldest in Leader mode.
	ids []string
	// known are, by index of ids, the names each member is known to
	// register: the complete set it published for the digest in its
	// member key; nil when none is known, and the member then counts as
	// registering every name, as before members published their names.
	// All nil in the common case, where every member registers the same
	// names and none publishes.
	known    []map[string]struct{}
	narrowed bool // some entry of known is non-nil
}

// placementLocked returns the placement of the current view.
func (r *Replica) placementLocked() *placement {
	if r.place != nil {
		return r.place
	}
	p := &placement{ids: make([]string, 0, len(r.members))}
	for id := range r.members {
		p.ids = append(p.ids, id)
	}
	if r.opts.Mode == Leader {
		slices.SortFunc(p.ids, func(a, b string) int {
			if c := r.members[a] - r.members[b]; c != 0 {
				return int(max(min(c, 1), -1))
			}
			return strings.Compare(a, b)
		})
	} else {
		slices.Sort(p.ids)
	}
	p.known = make([]map[string]struct{}, len(p.ids))
	for i, id := range p.ids {
		if d := r.memberNames[id]; d != "" && id != r.opts.ID {
			if s := r.sets[id+"/"+d]; s != nil && s.names != nil {
				p.known[i], p.narrowed = s.names, true
			}
		}
	}
	r.place = p
	return p
}

// registers reports whether member i is known, or taken, to register
// name.
func (p *placement) registers(i int, name string) bool {
	if p.known[i] == nil {
		return true
	}
	_, ok := p.known[i][name]
	return ok
}

// ownerLocked returns the member that should run name, a name registered
// here, in the current view: among the live members that register it
// (this one does), by rendezvous hashing in Spread mode, the oldest in
// Leader mode; "" when there are no members. A member whose names are
// not known counts as registering it. In the common case, every member's
// names the same and none published, it is the owner over all members.
func (r *Replica) ownerLocked(name string) string {
	p := r.placementLocked()
	if len(p.ids) == 0 {
		return ""
	}
	if r.opts.Mode == Leader {
		for i, id := range p.ids {
			if !p.narrowed || p.registers(i, name) {
				return id
			}
		}
		return ""
	}
	if !p.narrowed {
		return place.Owner(name, p.ids)
	}
	return place.OwnerWhere(name, p.ids, func(i int) bool { return p.registers(i, name) })
}

// unconfirmedLocked returns the live members not known to register the
// names registered here: their digest differs from this replica's (or
// they publish none, an earlier version) and their set has not come. A
// name one of them owns may run nowhere while it lasts; nil when there
// are none, the common case.
func (r *Replica) unconfirmedLocked() map[string]bool {
	mine := r.digest.String()
	p := r.placementLocked()
	var out map[string]bool
	for i, id := range p.ids {
		if id == r.opts.ID || p.known[i] != nil || r.memberNames[id] == mine {
			continue
		}
		if out == nil {
			out = make(map[string]bool)
		}
		out[id] = true
	}
	return out
}

// differsLocked reports whether a live member publishes a digest other
// than this replica's: then this replica publishes its set of names, so
// that the other can tell which of its names this one registers.
func (r *Replica) differsLocked() bool {
	mine := r.digest.String()
	for id := range r.members {
		if d := r.memberNames[id]; id != r.opts.ID && d != "" && d != mine {
			return true
		}
	}
	return false
}

// keepDigest writes the member key again, guarded by the epoch's lease,
// when the names registered here changed since the digest it carries was
// written. One write at a time, so the changes of a burst of
// registrations are coalesced into a few writes.
func (r *Replica) keepDigest(ep *epoch) {
	if ep.redigesting || ep.rewriting || time.Now().Before(ep.redigestAt) {
		return
	}
	r.mu.Lock()
	d := r.digest.String()
	start := d != ep.wroteDigest && !r.memberLost
	r.mu.Unlock()
	if start {
		ep.redigesting = true
	}
	if start {
		ep.wg.Add(1)
		go r.writeDigest(ep, d) // owned by the loop; joined by endEpoch through ep.wg
	}
}

// writeDigest puts the member key with digest d, if it is under the
// epoch's lease, retrying until etcd answers or the epoch ends. A key
// under another lease, or gone, is left to the watch and rewriteMember.
func (r *Replica) writeDigest(ep *epoch, d string) {
	defer ep.wg.Done()
	for {
		ctx, cancel := context.WithTimeout(ep.ctx, r.opts.RequestTimeout)
		written, err := r.be.PutMember(ctx, SessionID(ep.lease), d, false)
		cancel()
		if errors.Is(err, ErrSessionEnded) {
			ep.fence.expire(errLeaseLost)
			return
		}
		if err == nil {
			r.report(ep, result{kind: redigested, digest: d, ok: written})
			return
		}
		if !pause(ep.ctx, retryAfter) {
			return
		}
	}
}

// publishAfter is how long a difference between digests must last before
// this replica publishes its set: a keepalive period, (TTL − Margin)/4,
// 375ms at TTL 2s and Margin 500ms, 1.875s at the defaults.
func (r *Replica) publishAfter() time.Duration { return r.opts.keepAliveEvery() }

// keepNameSet publishes this replica's set of names, under the epoch's
// lease, while a live member's digest differs from its own, and deletes
// it once none does. One worker at a time; a set published for a digest
// that changed since is replaced.
func (r *Replica) keepNameSet(ep *epoch) {
	if ep.publishing {
		return
	}
	r.mu.Lock()
	want := ""
	if r.differsLocked() {
		want = r.digest.String()
	}
	start := want != ep.published
	var names []string
	if start && want != "" {
		names = make([]string, 0, len(r.regs))
		for name := range r.regs {
			names = append(names, name)
		}
	}
	r.mu.Unlock()
	if want != ep.wanted {
		ep.wanted, ep.wantedSince = want, time.Now()
	}
	if start && want != "" {
		// Published only once the difference has lasted publishAfter:
		// replicas that register a name a moment apart (names that come
		// from watched objects) differ for that moment, and publishing
		// every set then would cost every replica its whole set for each
		// name added. A withdrawal is not held back.
		if wait := time.Until(ep.wantedSince.Add(r.publishAfter())); wait > 0 {
			if ep.publishLater == nil {
				ep.publishLater = time.NewTimer(wait)
			}
			return
		}
	}
	if start {
		ep.publishing = true
		ep.wg.Add(1)
		go r.publishNames(ep, want, ep.published, names) // owned by the loop; joined by endEpoch through ep.wg
	}
}

// publishNames publishes names as the set with digest want (none when
// want is ""), withdrawing the set of digest old (backend.publish); it
// tries again until the store answers or the epoch ends.
func (r *Replica) publishNames(ep *epoch, want, old string, names []string) {
	defer ep.wg.Done()
	var chunks [][]byte
	if want != "" {
		slices.Sort(names)
		chunks = nameset.Encode(names)
	}
	for {
		err := r.be.Publish(ep.ctx, SessionID(ep.lease), want, old, chunks)
		if errors.Is(err, ErrSessionEnded) {
			ep.fence.expire(errLeaseLost)
			return
		}
		if err == nil {
			break
		}
		if !pause(ep.ctx, retryAfter) {
			return
		}
	}
	r.report(ep, result{kind: published, digest: want})
}

// unpublishedLocked returns, by ID, the digest of each live member not
// known to register the names registered here whose set may be
// published: it writes a digest (an earlier version's member publishes
// none) other than this replica's, and its set for it has not come, or
// came and did not decode (badSets: read again, it would not either).
func (r *Replica) unpublishedLocked() map[string]string {
	var out map[string]string
	for id := range r.unconfirmedLocked() {
		d := r.memberNames[id]
		if _, bad := r.badSets[id+"/"+d]; d != "" && !bad {
			if out == nil {
				out = make(map[string]string)
			}
			out[id] = d
		}
	}
	return out
}

// keepFetch reads the published sets of the members not yet confirmed
// directly: at once, and every half publishAfter while some remain (a
// member publishes publishAfter after it sees the difference, which may
// be before or after this replica does). The watch
// brings the sets too, but behind every event before them: when a
// member with other names joins a large group, the releases of the names
// that move to it, one deletion each, come first, and the names only it
// registers would wait on them to run (TestUpgradeScaleMeasurement: 5.7 s
// for 100,000 names at TTL 2 s). One worker at a time.
func (r *Replica) keepFetch(ep *epoch) {
	if ep.fetching {
		return
	}
	r.mu.Lock()
	want := r.unpublishedLocked()
	r.mu.Unlock()
	now := time.Now()
	if want == nil {
		ep.fetchAt = time.Time{}
		return
	}
	if !ep.fetchAt.IsZero() && now.Before(ep.fetchAt) {
		if ep.fetchLater == nil {
			ep.fetchLater = time.NewTimer(ep.fetchAt.Sub(now))
		}
		return
	}
	ep.fetching, ep.fetchAt = true, now.Add(r.publishAfter()/2)
	ep.wg.Add(1)
	go r.fetchNameSets(ep, want) // owned by the loop; joined by endEpoch through ep.wg
}

// fetchedSet is what one read of a member's published set found: its
// chunks, at the position at.
type fetchedSet struct {
	at     int64
	chunks []Chunk
}

// fetchNameSets reads the set each member in want published for its
// digest, one request per member, and reports what it found; a request
// that fails is left to the next round.
func (r *Replica) fetchNameSets(ep *epoch, want map[string]string) {
	defer ep.wg.Done()
	var sets []fetchedSet
	for id, d := range want {
		ctx, cancel := r.request(ep.ctx)
		chunks, at, err := r.be.Fetch(ctx, id, d)
		cancel()
		if err == nil && len(chunks) > 0 {
			sets = append(sets, fetchedSet{at: at, chunks: chunks})
		}
	}
	r.report(ep, result{kind: fetched, sets: sets})
}

// putFetchedLocked brings the chunks read by fetchNameSets into the view,
// each read only if it is ahead of the view: changes up to its position
// are still to come from the feed, which brings every later change of
// these chunks. A read the view has passed is dropped, as the feed
// brought the same chunks or their deletion. A chunk that comes twice is
// taken once (putChunkLocked).
func (r *Replica) putFetchedLocked(sets []fetchedSet) {
	for _, s := range sets {
		if s.at <= r.viewRev {
			continue
		}
		for _, c := range s.chunks {
			r.putChunkLocked(c)
		}
	}
}
