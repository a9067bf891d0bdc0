// Leases that end early: a lease the server ends before its TTL ran out
// (a revoke by another client, a stale etcd leader waking up) stops its
// holder at once, and its names wait before they start elsewhere (rule 5
// in doc.go).

package ha

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// leavingSuffix ends the value of a member key whose replica is leaving:
// its controllers have all terminated, and the revocation of its lease
// that follows is no early end (see markLeaving).
const leavingSuffix = " (leaving)"

// goneMember is what the view knew of a member whose key is gone.
type goneMember struct {
	lease   clientv3.LeaseID // the lease its key was under
	leaving bool             // it marked itself leaving under that lease
}

// quarantined is a name whose claim ended with a lease that may have ended
// early: its holder may still be running it, until its own fence, or its
// own sight of the end, stops it. Not claimed before until, unless the
// holder joins again first (it does so only once every controller of
// the old lease has terminated).
type quarantined struct {
	holder string
	lease  clientv3.LeaseID
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
// once; others' claims are checked for an early end (claimGoneLocked).
func (r *Replica) endsLocked(ep *epoch, e *lastEnds, now time.Time) {
	if e.own >= 2 && ep.fence.open() {
		r.log.Warn("the lease's keys were deleted together while it is renewed: etcd ended it early (a revoke, or a stale leader); stopping every controller here at once", "lease", leaseHex(ep.lease))
		ep.fence.expire(errLeaseEnded)
	}
	for name, c := range e.claims {
		r.claimGoneLocked(name, c, now)
	}
	e.own = 0
	clear(e.claims)
}

// claimGoneLocked decides whether name, whose claim c the view saw go at
// now, may be claimed at once. It may when the holder deleted it itself
// (its member key still under c's lease: a release), when the holder has
// moved on from that lease (a member key under another lease: it joined
// again after every controller of c's lease terminated), when the holder
// marked itself leaving, when the holder is this replica (its controllers
// of an ended epoch have all terminated), and when the lease simply ran
// out (earlyLocked). Otherwise the lease ended early and the holder may
// still run the name: quarantined until TTL from now, by when its fence
// has passed and its code returned, whatever it saw (rule 5).
func (r *Replica) claimGoneLocked(name string, c claimView, now time.Time) {
	if c.holder == r.opts.ID {
		return
	}
	if _, member := r.memberLeases[c.holder]; member {
		return
	}
	if g, ok := r.gone[c.holder]; ok && (g.lease != c.lease || g.leaving) {
		return
	}
	if !r.earlyLocked(c.lease, now) {
		return
	}
	if _, ok := r.quarantine[name]; !ok && !r.quarantinedLease(c.lease) {
		r.log.Warn(fmt.Sprintf("member %q's lease ended on the server before its TTL ran out (a revoke, or a stale etcd leader): its names wait until it joins again, or %v", c.holder, r.opts.TTL), "lease", leaseHex(c.lease))
	}
	r.quarantine[name] = quarantined{holder: c.holder, lease: c.lease, until: now.Add(r.opts.TTL)}
	r.dirty[name] = struct{}{}
}

// quarantinedLease reports whether a name is quarantined under lease l
// already (for logging once per lease).
func (r *Replica) quarantinedLease(l clientv3.LeaseID) bool {
	for _, q := range r.quarantine {
		if q.lease == l {
			return true
		}
	}
	return false
}

// earlyLocked reports whether lease l, whose keys the view saw go at now,
// may have ended before its TTL ran out. The lease poller (pollLeases)
// records, for every member's lease, the earliest moment it could run
// out: the send time of a TimeToLive request plus the whole seconds it
// answered. A lease that ran out (its holder crashed, or stopped
// renewing) goes at that moment or later; one that goes earlier ended
// early. Unknown (never polled): early.
func (r *Replica) earlyLocked(l clientv3.LeaseID, now time.Time) bool {
	at, ok := r.leaseExpiry[l]
	return !ok || now.Before(at)
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
func (r *Replica) gateLocked(prevClaims map[string]claimView, prevMembers map[string]clientv3.LeaseID, prevLeaving map[string]clientv3.LeaseID, now time.Time) {
	for id, lease := range prevMembers {
		if id == r.opts.ID {
			continue
		}
		if _, member := r.memberLeases[id]; member {
			continue // alive, or joined again
		}
		leaving := prevLeaving[id] == lease
		r.gone[id] = goneMember{lease: lease, leaving: leaving}
		if leaving || !r.earlyLocked(lease, now) {
			continue
		}
		r.log.Warn(fmt.Sprintf("member %q left while this replica was not watching, its lease before its TTL ran out: no free name is claimed until it joins again, or %v", id, r.opts.TTL), "lease", leaseHex(lease))
		r.gates[id] = gate{lease: lease, until: now.Add(r.opts.TTL)}
	}
	for name, c := range prevClaims {
		if _, held := r.claims[name]; !held {
			r.claimGoneLocked(name, c, now)
		}
	}
}

// gate is a member whose lease ended unseen, maybe early.
type gate struct {
	lease clientv3.LeaseID
	until time.Time
}

// pollLeases asks etcd, every keepAliveEvery, how long each other
// member's lease has left, and records the earliest moment each could run
// out (earlyLocked). Owned by the loop, started with the epoch; joined by
// endEpoch through ep.wg.
func (r *Replica) pollLeases(ep *epoch) {
	defer ep.wg.Done()
	every := r.opts.keepAliveEvery()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		r.mu.Lock()
		leases := make([]clientv3.LeaseID, 0, len(r.memberLeases))
		for id, l := range r.memberLeases {
			if id != r.opts.ID {
				leases = append(leases, l)
			}
		}
		now := time.Now()
		for l, at := range r.leaseExpiry {
			if now.Sub(at) > r.opts.TTL {
				delete(r.leaseExpiry, l) // long gone
				delete(r.leaseLast, l)
			}
		}
		r.mu.Unlock()
		for _, l := range leases {
			sent := time.Now()
			ctx, cancel := context.WithTimeout(clientv3.WithRequireLeader(ep.ctx), r.opts.RequestTimeout)
			resp, err := r.cli.TimeToLive(ctx, l)
			cancel()
			if err != nil || resp.TTL < 0 {
				continue
			}
			at := sent.Add(time.Duration(resp.TTL) * time.Second)
			a := leaseAnswer{sent: sent, ttl: time.Duration(resp.TTL) * time.Second, granted: time.Duration(resp.GrantedTTL) * time.Second}
			r.mu.Lock()
			if at.After(r.leaseExpiry[l]) {
				r.leaseExpiry[l] = at
			}
			prev, seen := r.leaseLast[l]
			r.leaseLast[l] = a
			if a.stale() && (!seen || !prev.stale()) {
				r.log.Info(fmt.Sprintf("member %q has not renewed its lease for %v: it stopped, or cannot reach etcd; its names move when the lease runs out, in %v unless it renews", r.holderOfLocked(l), a.since(sent).Round(time.Second), a.ttl), "lease", leaseHex(l))
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

// leaseAnswer is one TimeToLive answer for a member's lease.
type leaseAnswer struct {
	sent    time.Time     // when the request was sent
	ttl     time.Duration // the time left, in whole seconds (etcd truncates)
	granted time.Duration // the lease's TTL
}

// since returns how long before now the member last renewed its lease, as
// etcd counts: the TTL less the time left, plus the answer's age. etcd
// truncates the time left to whole seconds, so the time left is taken to
// be half a second more than it says: within half a second.
func (a leaseAnswer) since(now time.Time) time.Duration {
	return max(a.granted-a.ttl-time.Second/2+now.Sub(a.sent), 0)
}

// stale reports whether the member had not renewed its lease for half
// its TTL or more: a replica renews every (TTL − Margin)/4, so it missed
// several keepalives.
func (a leaseAnswer) stale() bool { return a.ttl < a.granted/2 }

// holderOfLocked returns the member whose key is under lease l, "" when
// none is in the view.
func (r *Replica) holderOfLocked(l clientv3.LeaseID) string {
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
func (r *Replica) revokeOld(ep *epoch, old clientv3.LeaseID) {
	defer ep.wg.Done()
	wait := retryAfter
	for {
		ctx, cancel := context.WithTimeout(clientv3.WithRequireLeader(ep.ctx), r.opts.RequestTimeout)
		_, err := r.cli.Revoke(ctx, old)
		cancel()
		if err == nil || isLeaseNotFound(err) {
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
func (r *Replica) markLeaving(ctx context.Context, lease clientv3.LeaseID) {
	key := r.keys.members + r.opts.ID
	_, err := r.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.LeaseValue(key), "=", int64(lease))).
		Then(clientv3.OpPut(key, memberValue(r.opts.ID, r.digestString(), true), clientv3.WithLease(lease))).Commit()
	if err != nil {
		r.log.Debug("marking the member key leaving", "error", err)
	}
}
