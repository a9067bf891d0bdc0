// The loop's work within an epoch: keep the view of members and claims up
// to date from a watch, and bring each name to where the view says it runs.

package ha

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"time"
)

// retryAfter is the pause before a failed list, watch or claim request is
// tried again.
const retryAfter = 100 * time.Millisecond

// resultKind says what a worker did.
type resultKind uint8

const (
	acquired   resultKind = iota // a batch of claims, each ours or held by another
	released                     // the controller terminated and the claim is deleted
	rewrote                      // the member key is ours again (ok) or held under another lease
	redigested                   // the member key carries digest (ok), or was not under the lease
	published                    // the set of names of digest is published ("": withdrawn)
	fetched                      // the published sets of unconfirmed members, read directly
)

// result is a worker's report to the loop.
type result struct {
	kind   resultKind
	name   string       // released
	ok     bool         // rewrote: the member key is ours; redigested: it was written
	digest string       // rewrote, redigested, published: the digest written
	other  *SessionID   // rewrote and not ok: the lease the member key is under (0: none); nil: the key is gone
	claims []Claimed    // acquired: the outcome of each name of the batch
	sets   []fetchedSet // fetched: what each read found
}

// serve runs one epoch until its fence passes (it returns nil) or a stop
// request comes (it returns the request).
func (r *Replica) serve(ep *epoch) *stopRequest {
	for {
		if ep.watch == nil && ep.retry == nil {
			if err := r.relist(ep); err != nil {
				r.log.Debug("listing members and claims", "error", err)
				r.retryLater(ep)
			}
		}
		// The names first: when a member with other names joins, the
		// reconcile below starts a release per moved name, whose requests
		// would otherwise go ahead of the set the newcomer waits for.
		r.keepNameSet(ep)
		r.keepFetch(ep)
		r.reconcile(ep)
		r.keepMemberKey(ep)
		r.keepDigest(ep)
		var retry, settled, unblocked, publish, fetch <-chan time.Time
		if ep.retry != nil {
			retry = ep.retry.C
		}
		if ep.publishLater != nil {
			publish = ep.publishLater.C
		}
		if ep.fetchLater != nil {
			fetch = ep.fetchLater.C
		}
		if ep.unblock != nil {
			unblocked = ep.unblock.C
		}
		if ep.settle != nil {
			settled = ep.settle.C
		}
		var batches <-chan FeedBatch
		if ep.watch != nil {
			batches = ep.watch.Batches()
		}
		select {
		case <-ep.fence.ctx.Done():
			return nil
		case req := <-r.stopReq:
			return &req
		case b := <-batches:
			if b.Err != nil {
				r.dropWatch(ep)
				if !errors.Is(b.Err, ErrFeedSilent) {
					r.retryLater(ep) // a silent one is given up after a long wait already
				}
				continue
			}
			r.apply(ep, b)
		case <-r.wake:
		case res := <-ep.results:
			r.handle(ep, res)
		case <-settled:
			ep.settle = nil
			r.mu.Lock()
			r.handed = nil
			r.allDirty = true
			r.mu.Unlock()
		case <-publish:
			ep.publishLater = nil // keepNameSet, at the top, publishes if still wanted
		case <-fetch:
			ep.fetchLater = nil // keepFetch, at the top, reads if still unconfirmed
		case <-unblocked:
			ep.unblock = nil
			r.mu.Lock()
			r.allDirty = true // names waited on a lease that ended early
			r.mu.Unlock()
		case <-retry:
			ep.retry = nil
			r.mu.Lock()
			for _, name := range ep.retryNames {
				r.dirty[name] = struct{}{}
			}
			ep.retryNames = ep.retryNames[:0]
			r.mu.Unlock()
		}
	}
}

// retryLater arms the retry timer unless it is armed.
func (r *Replica) retryLater(ep *epoch, names ...string) {
	ep.retryNames = append(ep.retryNames, names...)
	if ep.retry == nil {
		ep.retry = time.NewTimer(retryAfter)
	}
}

// relist lists the group (backend.list), replaces the view with the
// listing, and starts the feed from its position (backend.watch).
func (r *Replica) relist(ep *epoch) error {
	// The loop waits for the listing (a fence pass, Close and Leave's
	// context still end it at once): a listing of 100,000 claims under
	// load may take seconds.
	ctx, cancel := context.WithCancel(ep.ctx)
	defer cancel()
	stop := context.AfterFunc(ep.fence.ctx, cancel)
	defer stop()
	records, rev, err := r.be.List(ctx)
	if err != nil {
		return err
	}
	before := r.handedBeforeListing(ctx, ep)
	r.mu.Lock()
	prevMembers, prevLeaving := r.prevMembers, r.prevLeaving
	if prevMembers == nil {
		prevMembers, prevLeaving = maps.Clone(r.memberLeases), maps.Clone(r.leaving)
	}
	clear(r.members)
	clear(r.memberLeases)
	clear(r.leaving)
	clear(r.memberNames)
	clear(r.sets)
	clear(r.badSets)
	prev := r.claims
	if r.prevClaims != nil {
		prev = r.prevClaims // the view of the epoch before, which ended at a fence pass
	}
	r.prevClaims, r.prevMembers, r.prevLeaving = nil, nil, nil
	r.claims = make(map[string]claimView, len(prev))
	r.place = nil
	r.listedRev = rev
	r.heard = time.Now()
	for _, c := range records {
		r.putLocked(c, time.Time{})
	}
	for name, c := range r.claims {
		if p, ok := prev[name]; ok && p.rev == c.rev {
			c.since = p.since // the same holding, seen before this listing
			r.claims[name] = c
		}
	}
	// What went before the previous view is of no use any more: the
	// comparison below records what went since (gateLocked), and the
	// map does not grow with every member ever seen.
	clear(r.gone)
	r.gateLocked(prev, prevMembers, prevLeaving, r.heard)
	for name := range before {
		if _, held := r.claims[name]; !held && r.handed != nil {
			r.handed[name] = struct{}{}
		}
	}
	r.viewRev = rev
	r.allDirty = true
	if _, ok := r.members[r.opts.ID]; !ok {
		r.memberLost = true // deleted while no watch ran (putLocked saw any other lease)
	}
	r.mu.Unlock()
	w := r.be.Watch(rev, &ep.wg)
	ep.watch, ep.watchCancel = w, w.Stop
	return nil
}

// handedBeforeListing returns, at the first listing of a settling epoch,
// the names held when the member record was written (backend.heldAt): the
// other members may have released them to this replica before the watch,
// which starts at the listing, could show it. Those still held at the
// listing are left out by the caller; the others were handed over, and
// are claimed at once rather than after the settling. Nil when there is
// nothing to look for, or the store cannot say (etcd: the revision
// compacted): then they wait for the settling's end, as before. ctx
// bounds it, as it does the listing.
func (r *Replica) handedBeforeListing(ctx context.Context, ep *epoch) map[string]bool {
	r.mu.Lock()
	settling := r.handed != nil
	r.mu.Unlock()
	rev := ep.joinedAt
	ep.joinedAt = 0
	if !settling || rev == 0 {
		return nil
	}
	names, err := r.heldAt(ctx, rev)
	if err != nil {
		return nil
	}
	return names
}

// apply brings a batch of the feed into the view, and moves the view's
// position to the batch's (feedBatch.at). The deletions of a session's
// end come at one position, in one batch: they are judged a position at
// a time (endsLocked).
func (r *Replica) apply(ep *epoch, b FeedBatch) {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.heard = now
	var ends lastEnds
	for _, c := range b.Changes {
		if c.At != ends.rev {
			r.endsLocked(ep, &ends, now)
			ends.rev = c.At
		}
		r.changeLocked(ep, &ends, c, now)
	}
	r.endsLocked(ep, &ends, now)
	r.viewRev = max(r.viewRev, b.At)
}

// changeLocked brings a change the watch delivered at seen into the
// view; the deletions of its position are collected in ends.
func (r *Replica) changeLocked(ep *epoch, ends *lastEnds, c Change, seen time.Time) {
	switch c.Kind {
	case MemberPut, ClaimPut, ChunkPut:
		r.putLocked(c, seen)
	case MemberGone:
		id := c.Member
		if id == r.opts.ID && c.At > r.listedRev {
			// (A deletion at or before the listing comes again from a
			// watch that starts at the listed revision: the relist saw
			// it already.)
			r.memberLost = true
		}
		if lease, had := r.memberLeases[id]; had {
			if id == r.opts.ID && lease == ep.lease {
				ends.own++
			}
			r.gone[id] = goneMember{lease: lease, leaving: r.leaving[id] == lease}
			if id != r.opts.ID {
				if r.gone[id].leaving {
					r.log.Info(fmt.Sprintf("member %q left", id), "lease", leaseHex(lease))
				} else {
					r.log.Info(fmt.Sprintf("member %q is gone: its key was deleted, with its lease or alone", id), "lease", leaseHex(lease))
				}
			}
		}
		delete(r.memberLeases, id)
		delete(r.leaving, id)
		delete(r.memberNames, id)
		if _, had := r.members[id]; had {
			delete(r.members, id)
			r.membershipChangedLocked()
		}
	case ClaimGone:
		name := c.Name
		if held, had := r.claims[name]; had {
			if held.lease == ep.lease {
				ends.own++
			} else {
				if ends.claims == nil {
					ends.claims = make(map[string]claimView) // only when others' claims go
				}
				ends.claims[name] = held
			}
		}
		delete(r.claims, name)
		r.dirty[name] = struct{}{}
		if r.handed != nil {
			r.handed[name] = struct{}{}
		}
	case ChunkGone:
		r.deleteChunkLocked(c.Chunk)
	}
}

// putLocked brings a record put into the view. seen is when the watch
// delivered it; zero from a listing.
func (r *Replica) putLocked(c Change, seen time.Time) {
	switch c.Kind {
	case MemberPut:
		id, lease := c.Member, SessionID(c.Session)
		if id == r.opts.ID && lease != r.lease {
			r.memberLost = true
		}
		r.memberLeases[id] = lease
		if c.Leaving {
			r.leaving[id] = lease
		}
		r.liftLocked(id)
		if rev, had := r.members[id]; !had || rev != c.Created {
			r.members[id] = c.Created
			r.membershipChangedLocked()
		}
		if old, had := r.memberNames[id]; !had || old != c.Digest {
			r.memberNames[id] = c.Digest
			r.membershipChangedLocked() // whose published set counts changed
		}
	case ClaimPut:
		v := claimView{holder: c.Member, lease: SessionID(c.Session), rev: c.Created}
		if old, had := r.claims[c.Name]; had && old.rev == v.rev && !old.since.IsZero() {
			v.since = old.since // the same holding, put again (a watch replayed from the listing)
		} else if v.rev > r.listedRev {
			v.since = seen // created after the listing: seen within a round trip
		}
		r.claims[c.Name] = v
		r.dirty[c.Name] = struct{}{}
	case ChunkPut:
		r.putChunkLocked(c.Chunk)
	}
}

// membershipChangedLocked drops the placement, to be built again from the
// view, and steps every name: an owner may have changed.
func (r *Replica) membershipChangedLocked() {
	r.place = nil
	r.allDirty = true
}

// reconcile steps every dirty name, then wakes a claim worker for the
// names it queued (claimQueue.flush).
func (r *Replica) reconcile(ep *epoch) {
	defer ep.claims.flush()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.allDirty {
		r.allDirty = false
		clear(r.dirty)
		for name := range r.regs {
			r.stepLocked(ep, name)
		}
		for name := range r.slots {
			if _, ok := r.regs[name]; !ok {
				r.stepLocked(ep, name)
			}
		}
		for name, c := range r.claims {
			if _, ok := r.regs[name]; !ok && c.lease == ep.lease && r.slots[name] == nil {
				r.stepLocked(ep, name) // a stray claim of ours: see stepLocked
			}
		}
		return
	}
	for name := range r.dirty {
		delete(r.dirty, name)
		r.stepLocked(ep, name)
	}
}

// stepLocked starts what name needs: a claim request when the name is
// ours and free, a release when it runs here but is no longer ours or was
// unregistered (slot.removed, even if registered again since), or
// when a claim under this epoch's lease has no slot although the name is
// not ours (an acquire whose answer was lost to a timeout while the name
// moved: the lease, renewed, would keep the owner waiting for good).
// Names in acquiring or releasing wait for their worker.
func (r *Replica) stepLocked(ep *epoch, name string) {
	_, registered := r.regs[name]
	ours := registered && r.ownerLocked(name) == r.opts.ID
	s := r.slots[name]
	switch {
	case s == nil && ours:
		if c, held := r.claims[name]; held && c.lease != ep.lease {
			return // held elsewhere: wait until its key is deleted
		}
		if r.handed != nil {
			if _, ok := r.handed[name]; !ok {
				return // nobody handed it over: claimed when the settling ends
			}
		}
		if until, blocked := r.blockedLocked(name); blocked {
			ep.unblockAt(until) // its holder's lease ended early: see claimGoneLocked
			return
		}
		s = newSlot(acquiring)
		r.slots[name] = s
		ep.claims.add(name, int(r.claimBatch.Load())) // a claim worker takes it
	case s == nil:
		if c, held := r.claims[name]; held && c.lease == ep.lease {
			s = newSlot(releasing)
			s.claim = Claim{Name: name, Revision: c.rev} // enough for Release
			s.stray = true
			r.slots[name] = s
			r.releaseLocked(ep, name, s, false, "")
		}
	case s != nil && s.state == running:
		c, held := r.claims[name]
		lost := r.viewRev >= s.claim.Revision && (!held || c.rev != s.claim.Revision)
		if lost {
			r.log.Warn("claim deleted under a running controller: stopping it", controllerAttr(name))
		}
		switch {
		case lost:
			r.releaseLocked(ep, name, s, true, ReasonLost)
		case !ours || s.removed:
			r.releaseLocked(ep, name, s, true, notOursReason(registered && !s.removed))
		}
	}
}

// notOursReason is why a name that is not ours is released: removed when
// it is no longer registered here, else moved to another member.
func notOursReason(registered bool) Reason {
	if registered {
		return ReasonMoved
	}
	return ReasonRemoved
}

func (r *Replica) report(ep *epoch, res result) {
	select {
	case ep.results <- res:
	case <-ep.ctx.Done():
	}
}

// releaseLocked moves s to releasing: it removes name's controller (when
// installed), and a worker waits until it has terminated, StopFunc
// included, and only then deletes the claim. reason is the release's:
// moved, removed or lost, for the metrics (whose reason label takes these
// values) and, when its controller was installed, for the Released event;
// "" for a stray claim, never counted as acquired either (nothing ran
// under it), so that acquired − released is the claims held.
func (r *Replica) releaseLocked(ep *epoch, name string, s *slot, installed bool, reason Reason) {
	if reason != "" {
		r.opts.Metrics.released[string(reason)].Inc()
	}
	s.state = releasing
	if installed {
		s.reason = reason
	}
	var terminated chan struct{}
	if installed {
		terminated = r.inner.TerminationChannel(name) // before the removal, which forgets the name
		_ = r.inner.RemoveController(name)
	}
	ep.wg.Add(1)
	go r.release(ep, name, s.claim, terminated) // owned by the loop; joined by endEpoch through ep.wg
}

// release waits for the controller to terminate, then deletes the claim,
// guarded by its revision so that a claim someone else holds by now is
// left alone; it retries until the delete is answered or the epoch ends.
// An epoch that ends first (Leave past its context, a passed fence) leaves
// the claim to its lease: revoked, or left to expire.
func (r *Replica) release(ep *epoch, name string, c Claim, terminated chan struct{}) {
	defer ep.wg.Done()
	if terminated != nil {
		select {
		case <-terminated:
		case <-ep.ctx.Done():
			return
		}
	}
	res := result{kind: released, name: name}
	for {
		select {
		case ep.sem <- struct{}{}:
		case <-ep.ctx.Done():
			return
		}
		ctx, cancel := r.request(ep.ctx)
		err := r.be.Release(ctx, c)
		cancel()
		<-ep.sem
		if err == nil {
			break
		}
		if !pause(ep.ctx, retryAfter) {
			return
		}
	}
	r.report(ep, res)
}

// keepMemberKey writes the member key again when the watch showed it
// deleted or taken under the live lease (an operator, a same-ID replica):
// without it the replica drops out of its own view and runs nothing while
// it renews its lease. One worker at a time.
func (r *Replica) keepMemberKey(ep *epoch) {
	r.mu.Lock()
	start := r.memberLost && !ep.rewriting
	if start {
		r.memberLost, ep.rewriting = false, true
	}
	r.mu.Unlock()
	if start {
		ep.wg.Add(1)
		go r.rewriteMember(ep) // owned by the loop; joined by endEpoch through ep.wg
	}
}

// rewriteMember creates the member key under the epoch's lease if it is
// absent, retrying until etcd answers or the epoch ends, and reports
// whether the key is ours.
func (r *Replica) rewriteMember(ep *epoch) {
	defer ep.wg.Done()
	for {
		digest := r.digestString()
		ctx, cancel := r.request(ep.ctx)
		under, found, err := r.be.EnsureMember(ctx, SessionID(ep.lease), digest)
		cancel()
		if errors.Is(err, ErrSessionEnded) {
			ep.fence.expire(errLeaseLost) // the key went with the lease
			return
		}
		if err == nil {
			res := result{kind: rewrote, ok: found && under == SessionID(ep.lease), digest: digest}
			if found && !res.ok {
				other := SessionID(under)
				res.other = &other
			}
			r.report(ep, res)
			return
		}
		if !pause(ep.ctx, retryAfter) {
			return
		}
	}
}

// controllerAttr names a controller in a log line as the core does: on
// slog in the group "controller", so that it does not collide with a
// "name" of the user's logger; on logrus, where Manager.Logger renders
// this group as the core's own entries, under Cilium's key, name.
func controllerAttr(name string) slog.Attr {
	return slog.Group("controller", slog.String("name", name))
}

// pause waits for d, and reports false if ctx ended first.
func pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// handle applies a worker's report.
func (r *Replica) handle(ep *epoch, res result) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch res.kind {
	case redigested:
		ep.redigesting = false
		if res.ok {
			ep.wroteDigest = res.digest
		} else {
			// Not under the lease: the watch shows why (rewriteMember
			// follows); meanwhile it is tried again after a pause.
			ep.redigestAt = time.Now().Add(retryAfter)
			r.retryLater(ep)
		}
		return
	case published:
		ep.publishing, ep.published = false, res.digest
		return
	case fetched:
		ep.fetching = false
		r.putFetchedLocked(res.sets)
		return
	}
	if res.kind == rewrote {
		ep.rewriting = false
		if res.ok {
			ep.wroteDigest = res.digest
		}
		switch {
		case res.ok:
			r.log.Warn("member key was deleted under the live lease: written again")
		case res.other != nil:
			// Another lease holds our ID: stop everything and join
			// again, which fails with ErrDuplicateID while it lives.
			ep.fence.expire(fmt.Errorf("%w: the member record of %s held by session %x", ErrDuplicateID, r.opts.ID, int64(*res.other)))
		default:
			r.memberLost = true // deleted again meanwhile
		}
		return
	}
	if res.kind == acquired {
		for _, c := range res.claims {
			r.handleClaimedLocked(ep, c)
		}
		return
	}
	s := r.slots[res.name]
	if s == nil {
		return
	}
	switch res.kind {
	case released:
		delete(r.slots, res.name)
		if c, ok := r.claims[res.name]; ok && c.rev == s.claim.Revision {
			// Deleted: the view would keep it until the watch brings the
			// deletion, and take it meanwhile for a stray claim of this
			// lease, to release a second time.
			delete(r.claims, res.name)
		}
		s.end()
		r.log.Info("released: stopped here, claim deleted", controllerAttr(res.name))
		r.dirty[res.name] = struct{}{}
		if s.reason != "" {
			r.emit(Event{Kind: Released, Lease: ep.lease, Name: res.name, Revision: s.claim.Revision, Reason: s.reason})
		}
	}
}

// dropWatch stops the epoch's feed; the loop lists and watches anew.
func (r *Replica) dropWatch(ep *epoch) {
	ep.watch.Stop()
	ep.watch, ep.watchCancel = nil, nil
}
