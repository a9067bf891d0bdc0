// Leases that end early: a lease the server ends before its TTL ran out
// (a revoke by another client, a stale etcd leader waking up) stops its
// holder at once, and its names wait before they start elsewhere (rule 5
// in doc.go).

package ha

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// goneMember is what the view knew of a member whose key is gone.
type goneMember struct {
	lease   SessionID // the lease its key was under
	leaving bool      // it marked itself leaving under that lease
}

// quarantined is a name whose claim ended with a lease that may have ended
// early: its holder may still be running it, until its own fence, or its
// own sight of the end, stops it. Not claimed before until, unless the
// holder joins again first (it does so only once every controller of
// the old lease has terminated).
type quarantined struct {
	holder string
	lease  SessionID
	until  time.Time
}

// lastEnds collects the keys one revision of the watch deleted, so that
// a lease's end, which deletes all its keys in one revision, is told from
// a release, which deletes one claim.
type lastEnds struct {
	rev    int64
	own    int                  // keys under this epoch's lease
	claims map[string]claimView // others' claims, by name
}

// endsLocked acts on the deletions of one revision: this epoch's lease
// ended when two or more of its keys went at once (its member key and a
// claim, or two claims: a release deletes one), and the fence passes at
// once; others' claims are checked for an early end (claimGoneLocked),
// and those of sessions ended unseen handed over (takeOverLocked).
func (r *Replica) endsLocked(ep *epoch, e *lastEnds, now time.Time) {
	if e.own >= 2 && ep.fence.open() {
		r.log.Warn("the lease's keys were deleted together while it is renewed: etcd ended it early (a revoke, or a stale leader); stopping every controller here at once", "lease", leaseHex(ep.lease))
		ep.fence.expire(errLeaseEnded)
	}
	var warned map[SessionID]bool
	for name, c := range e.claims {
		r.claimGoneLocked(name, c, now, &warned)
	}
	r.takeOverLocked(ep, e.claims)
	e.own = 0
	clear(e.claims)
}

// claimGoneLocked decides whether name, whose claim c the view saw go at
// now, may be claimed at once. It may when the holder deleted it itself
// (its member key still under c's lease: a release), when the holder has
// moved on from that lease (a member key under another lease: it joined
// again after every controller of c's lease terminated), when the holder
// marked itself leaving, and when the holder is this replica (its
// controllers of an ended epoch have all terminated). Otherwise the lease
// ended, and the name waits until holdUntilLocked says the holder's code
// has returned (rule 5). An early end is logged once per lease among the
// calls that share warned (the deletions of one revision, or one listing):
// a scan of the quarantine per name would make a mass end quadratic.
func (r *Replica) claimGoneLocked(name string, c claimView, now time.Time, warned *map[SessionID]bool) {
	if !r.endedWithLeaseLocked(c) {
		return
	}
	until, early := r.holdUntilLocked(c.lease, now)
	if !until.After(now) {
		return
	}
	if early && !(*warned)[c.lease] {
		if *warned == nil {
			*warned = make(map[SessionID]bool)
		}
		(*warned)[c.lease] = true
		r.log.Warn(fmt.Sprintf("member %q's lease ended on the server while it was being renewed (a revoke, or a stale etcd leader): its names wait until it joins again, or %v", c.holder, r.opts.TTL), "lease", leaseHex(c.lease))
	}
	r.quarantine[name] = quarantined{holder: c.holder, lease: c.lease, until: until}
	r.dirty[name] = struct{}{}
}

// endedWithLeaseLocked reports whether claim c, which the view saw go,
// went with its holder's lease (claimGoneLocked): the holder is another
// replica, no member now, that neither marked itself leaving nor moved
// on to another lease.
func (r *Replica) endedWithLeaseLocked(c claimView) bool {
	if c.holder == r.opts.ID {
		return false
	}
	if _, member := r.memberLeases[c.holder]; member {
		return false
	}
	g, ok := r.gone[c.holder]
	return !ok || (g.lease == c.lease && !g.leaving)
}

// holdUntilLocked returns until when the names of lease l, whose keys the
// view saw go at now, must wait: by then the holder's fence has passed
// and its code returned, whatever it saw. early reports a lease that
// ended while it was being renewed.
//
// The lease poller (pollLeases) reads every member's remaining TTL. A
// lease its last reading showed not renewed for half its TTL or more
// (leaseAnswer.stale), read recently (within two poll periods of now),
// runs out by itself within the bounds the readings since its last
// renewal give (leaseAnswer.hi); its holder's fence passed, and its code
// returned, by then. Read every quarter period while stale, those bounds
// are a quarter period wide, and a crashed replica's names move as soon
// as etcd deletes its keys. Any other lease (renewed at the last reading,
// read too long ago, never read) may have ended early: its holder renewed
// it last before the end, so its code has returned TTL after the end at
// the latest, and the names wait TTL from now, unless the holder joins
// again first (liftLocked). A holder whose keepalives came more than half
// a TTL late, read as not renewing, and whose lease etcd ended early
// right after a late one arrived, is the case this cannot see (doc.go,
// rule 5).
func (r *Replica) holdUntilLocked(l SessionID, now time.Time) (until time.Time, early bool) {
	a, ok := r.leaseLast[l]
	if ok && a.stale() && now.Sub(a.recv) <= 2*r.opts.keepAliveEvery() {
		return a.hi, false
	}
	return now.Add(r.opts.TTL), true
}

// blockedLocked reports whether name must not be claimed yet, and until
// when: its claim ended with a lease that ended early, or a member's lease
// ended unseen while this replica was not watching (a gate on every
// unclaimed name). Expired entries are dropped.
func (r *Replica) blockedLocked(name string) (time.Time, bool) {
	if len(r.quarantine) == 0 && len(r.gates) == 0 {
		return time.Time{}, false
	}
	now := time.Now()
	var until time.Time
	if q, ok := r.quarantine[name]; ok {
		if now.Before(q.until) {
			until = q.until
		} else {
			delete(r.quarantine, name)
		}
	}
	for id, g := range r.gates {
		if !now.Before(g.until) {
			delete(r.gates, id)
		} else if g.until.After(until) {
			until = g.until
		}
	}
	return until, !until.IsZero()
}

// liftLocked ends the waits on member id, whose key the view now shows
// again. A key under a new lease means the member joined again,
// which it does only once every controller of its old lease terminated;
// a key written under the lease the waits are for proves that lease
// alive after its claims went, so they went one by one, released (the
// member key was deleted alone, and written again).
func (r *Replica) liftLocked(id string) {
	delete(r.gone, id)
	for name, q := range r.quarantine {
		if q.holder == id {
			delete(r.quarantine, name)
			r.dirty[name] = struct{}{}
		}
	}
	if _, ok := r.gates[id]; ok {
		delete(r.gates, id)
		r.allDirty = true
	}
}

// gateLocked compares the previous view (of this epoch, or of the last
// one) with a new listing: claims gone meanwhile are checked as the watch
// would have (claimGoneLocked), and a member gone meanwhile whose lease
// may have ended early gates every unclaimed name until it joins again or
// TTL passes, since the names it claimed after the previous view are not
// known.
func (r *Replica) gateLocked(prevClaims map[string]claimView, prevMembers map[string]SessionID, prevLeaving map[string]SessionID, now time.Time) {
	for id, lease := range prevMembers {
		if id == r.opts.ID {
			continue
		}
		if _, member := r.memberLeases[id]; member {
			continue // alive, or joined again
		}
		leaving := prevLeaving[id] == lease
		r.gone[id] = goneMember{lease: lease, leaving: leaving}
		if leaving {
			continue
		}
		until, early := r.holdUntilLocked(lease, now)
		if !until.After(now) {
			continue
		}
		if early {
			r.log.Warn(fmt.Sprintf("member %q left while this replica was not watching, maybe by an early end of its lease: no free name is claimed until it joins again, or %v", id, r.opts.TTL), "lease", leaseHex(lease))
		}
		r.gates[id] = gate{lease: lease, until: until}
	}
	var warned map[SessionID]bool
	for name, c := range prevClaims {
		if _, held := r.claims[name]; !held {
			r.claimGoneLocked(name, c, now, &warned)
		}
	}
}

// gate is a member whose lease ended unseen, maybe early.
type gate struct {
	lease SessionID
	until time.Time
}

// pollLeases reads each other member's remaining TTL (backend.peerLeft)
// every
// keepAliveEvery, and every quarter of that while the last reading showed
// it not renewed (leaseAnswer.stale), and records the readings
// (holdUntilLocked, Status). Owned by the loop, started with the epoch;
// joined by endEpoch through ep.wg.
func (r *Replica) pollLeases(ep *epoch) {
	defer ep.wg.Done()
	every := r.opts.keepAliveEvery()
	t := time.NewTicker(every / 4)
	defer t.Stop()
	for {
		r.mu.Lock()
		var due []SessionID
		now := time.Now()
		for id, l := range r.memberLeases {
			if a, ok := r.leaseLast[l]; id != r.opts.ID && (!ok || a.stale() || now.Sub(a.sent) >= every-every/8) {
				due = append(due, l)
			}
		}
		for l, a := range r.leaseLast {
			if now.Sub(a.hi) > r.opts.TTL {
				delete(r.leaseLast, l) // long gone
			}
		}
		r.mu.Unlock()
		for _, l := range due {
			sent := time.Now()
			ctx, cancel := r.request(ep.ctx)
			left, granted, err := r.be.PeerLeft(ctx, SessionID(l))
			cancel()
			if err != nil {
				continue
			}
			r.mu.Lock()
			prev, seen := r.leaseLast[l]
			a := prev.next(sent, time.Now(), left, granted, r.short)
			r.leaseLast[l] = a
			if a.stale() && (!seen || !prev.stale()) {
				r.log.Info(fmt.Sprintf("member %q has not renewed its lease for %v: it stopped, or cannot reach the store; its names move when the lease runs out, in %v unless it renews", r.holderOfLocked(l), a.since(sent).Round(time.Second), a.ttl), "lease", leaseHex(l))
			}
			r.mu.Unlock()
		}
		select {
		case <-ep.ctx.Done():
			return
		case <-t.C:
		}
	}
}

// leaseAnswer is the last reading of a member's lease (backend.peerLeft;
// etcd's TimeToLive), and
// what the readings since its last renewal tell of when it runs out.
//
// etcd answers the time left in whole seconds, truncated: a reading sent
// at s and received at v that says n means the lease runs out in [s + n,
// v + n + 1s), if nobody renews it; in general [s + n, v + n + short),
// short the backend's Rounding (0 on Kubernetes), and [s + n, v + n]
// when short is 0: an exact reading may put the end at v + n itself, and
// at one instant when answered the instant it was sent (meets). Readings that agree (their ranges
// meet) narrow the range to their intersection; one that does not was
// made after a renewal, and starts a new range. A sample, at TTL 2s, of a
// lease last renewed at 10.00s and never again, read every 94ms once
// stale: at 11.04s it says 0 ([11.04, 12.05)), at 10.95s it had said 1
// ([11.95, 12.96)); the intersection is [11.95s, 12.05s), around the true
// 12.00s.
type leaseAnswer struct {
	sent, recv time.Time     // the reading's request was sent, and answered
	ttl        time.Duration // the time left it answered, whole seconds on etcd
	granted    time.Duration // the lease's TTL
	short      time.Duration // how much short of the truth ttl may be: the backend's Rounding
	lo, hi     time.Time     // the lease runs out in [lo, hi), unless renewed after the readings
}

// next returns the reading sent at sent, answered at recv with ttl left
// of granted, up to short short of the truth, after a.
func (a leaseAnswer) next(sent, recv time.Time, ttl, granted, short time.Duration) leaseAnswer {
	b := leaseAnswer{sent: sent, recv: recv, ttl: ttl, granted: granted, short: short, lo: sent.Add(ttl), hi: recv.Add(ttl + short)}
	if lo, hi := later(a.lo, b.lo), earlier(a.hi, b.hi); !a.sent.IsZero() && a.meets(lo, hi) {
		b.lo, b.hi = lo, hi // the same expiry: no renewal between the readings
	}
	return b
}

// meets reports whether [lo, hi) is a range the end may lie in, two
// readings' ranges intersected: not empty; or, when the readings are
// exact (short 0), the one instant both put the end at. An exact
// reading answered the instant it was sent (a clock coarser than the
// request, a bubble's) puts the end at sent + ttl = recv + ttl itself,
// and every reading of an unrenewed session after it puts it there too:
// taken as empty, each would look like a renewal, and a crashed run like
// a live duplicate (awaitPreviousIncarnation).
func (a leaseAnswer) meets(lo, hi time.Time) bool {
	return lo.Before(hi) || (a.short == 0 && lo.Equal(hi))
}

// after reports whether b's range lies wholly past a's: the end moved
// between the readings, a renewal.
func (a leaseAnswer) after(b leaseAnswer) bool {
	if a.short == 0 && b.short == 0 {
		return b.lo.After(a.hi)
	}
	return !b.lo.Before(a.hi)
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func earlier(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// since returns how long before now the member last renewed its lease, as
// the store counts: the TTL less the time left, plus the answer's age.
// The time left may be up to short short of the truth (etcd truncates it
// to whole seconds), so it is taken to be half of that more than it
// says: within half a second on etcd.
func (a leaseAnswer) since(now time.Time) time.Duration {
	return max(a.granted-a.ttl-a.short/2+now.Sub(a.sent), 0)
}

// stale reports whether the member had not renewed its lease for half
// its TTL or more: a replica renews every (TTL − Margin)/4, so it missed
// several keepalives.
func (a leaseAnswer) stale() bool { return a.ttl < a.granted/2 }

// holderOfLocked returns the member whose key is under lease l, "" when
// none is in the view.
func (r *Replica) holderOfLocked(l SessionID) string {
	for id, ml := range r.memberLeases {
		if ml == l {
			return id
		}
	}
	return ""
}

// revokeOld revokes the lease of the epoch before ep, once ep's member
// key is written: the claims left under it (its fence passed, and etcd
// could not be told then, or still keeps the lease: a new etcd leader
// extends every lease by its TTL) go at once, and the others see that
// their holder had moved on, so they take them at once. Retried until
// etcd answers or the epoch ends. Owned by the loop; joined by endEpoch
// through ep.wg.
func (r *Replica) revokeOld(ep *epoch, old SessionID) {
	defer ep.wg.Done()
	wait := retryAfter
	for {
		ctx, cancel := r.request(ep.ctx)
		err := r.be.End(ctx, SessionID(old))
		cancel()
		if err == nil || errors.Is(err, ErrSessionEnded) {
			return
		}
		if !pause(ep.ctx, wait) {
			return
		}
		wait = min(2*wait, r.opts.keepAliveEvery())
	}
}

// markLeaving rewrites the member key, under lease, with the leaving
// suffix, so that the revocation that follows (Leave, once every
// controller here terminated) reads as a departure to the others, who
// then take the names at once, and not as an early end. Best effort: if
// it fails, the others wait for the names a little longer.
func (r *Replica) markLeaving(ctx context.Context, lease SessionID) {
	if _, err := r.be.PutMember(ctx, SessionID(lease), r.digestString(), true); err != nil {
		r.log.Debug("marking the member key leaving", "error", err)
	}
}
