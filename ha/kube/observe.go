// Expiry judged by observers: with no TTL on the server, a session is
// proven ended only by what this replica itself saw: a delete of its
// member Lease that this observer made after seeing it unchanged for its
// duration on its own clock, guarded so that it fails if the holder
// renewed meanwhile; a version of the Lease in which its session wrote
// its own end (session.markEnded); or the Lease found gone (or of
// another incarnation), and the holder's fence shown past by this
// observer's clock since.

package kube

import (
	"context"
	"fmt"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// stamp is what an observer knows of one session's member Lease: the
// version it last saw, and when it first saw that version on its own
// monotonic clock. It is used to judge the session expired while the
// observer does not know of its end; after a read found the Lease gone,
// the feed's versions still restamp it, for the feed's Deleted event
// (observer.observe).
type stamp struct {
	name     string // the member Lease's name
	uid      types.UID
	rv       string        // the resourceVersion seen
	seen     time.Time     // monotonic: first receipt of rv (a watch event or a read), after its commit, and never before an earlier stamp's
	duration time.Duration // D: the widest the observer had seen in the group (observer.widest) when it stamped, so never less than rv's own, the group's or an earlier stamp's
	// fed: the feed has shown a version of this session's Lease. From
	// then on it shows every later version (as an event, or in a
	// listing) before the Lease's deletion, in commit order.
	fed bool
}

// due returns when the stamped version may be judged expired: seen + D.
func (st stamp) due() time.Time { return st.seen.Add(st.duration) }

// endSign is what an observer knows of the end of one session whose
// member Lease is gone or of another incarnation: either the observer's
// own guarded delete proved it, or the session counts as ended from
// since + duration on the observer's clock.
type endSign struct {
	proven   bool          // this observer's guarded delete of the session's Lease succeeded, or it saw the session's own end mark (endMarked)
	since    time.Time     // monotonic: a time after the commit of the session's last renewal (see observer)
	duration time.Duration // D: the widest the observer had seen in the group (observer.widest) when it recorded the end, and at least its stamp's
}

// observer judges other sessions ended, and proves it where it can by
// deleting their member Leases.
//
// # The rule
//
// For each member Lease, the observer stamps every new resourceVersion it
// sees (from the feed or its own reads) with its monotonic receipt time
// t. If the version is still the current one at t + D, by a quorum read
// (a GET with no resourceVersion, served from etcd, never from the watch
// cache), the observer deletes the Lease with preconditions {UID,
// resourceVersion}. The delete succeeds only if nothing was committed to
// the Lease after that version; so the holder's last successful renewal
// is that version's (or an earlier one), sent at s < commit < t, and its
// validity s + D, and its fence s + D − Margin, passed before t + D. A
// renewal still in flight then fails its precondition (404) and the
// holder knows its session lost. Sample, D = 3 s:
//
//	t = 50.0  observer sees rv 41 (stamp: due 53.0)
//	t = 51.0  holder's renewal commits rv 42; the feed is stalled and
//	          the observer does not see it
//	t = 53.0  due: quorum read answers rv 42 → restamp (due 56.0), no delete
//	          (had the read come before the renewal: delete on rv 41 → 409,
//	          a wasted write, then a read and a restamp as above)
//
// # A Lease gone by no delete of this observer's (DESIGN.md, "An early end")
//
// An administrator may delete a member Lease by hand (kubectl delete),
// and another replica's observer deletes Leases too. Such a deletion
// proves nothing by itself: the holder may have renewed just before it,
// and its fence, counted from that renewal's send time, stays open until
// its next renewal is answered 404, or for D − Margin if that renewal
// never arrives (a paused or partitioned holder). So the observer counts
// D from a time it knows to be after the commit of the holder's last
// renewal:
//
//   - the feed reported the deletion (a Deleted event) of a Lease whose
//     versions it had been showing (fed): the feed shows every version
//     of the Lease in commit order from the first it showed, so the
//     holder's last renewal is a version the feed showed before the
//     deletion, and the stamp (its first receipt, or a later restamp) is
//     after its commit: D counts from the stamp;
//   - otherwise, the Lease found absent or of another incarnation by a
//     read that is known to come after the session's Lease existed (a
//     quorum read of the Lease of a session stamped or named by a bucket
//     read before it, or the feed's listing after it showed the Lease):
//     renewals may have committed since the last version stamped, unseen
//     (a stalled feed), so the stamp proves nothing; D counts from the
//     receipt of that read, which came after the deletion, itself after
//     every renewal of the session.
//
// Whichever comes first counts. Nothing else ends a session: in
// particular not a Lease of another incarnation that a read brings while
// the older one is stamped, as two reads may be answered out of their
// order (the older one would then look like the newer's end), nor a
// listing that lacks a session only reads showed (the listing may be
// older than those reads). Sample, D = 3 s, an administrator's delete at
// 54.5 while the feed is stalled from 50.1:
//
//	t = 50.0  the feed brings rv 41 (stamp 50.0); then it stalls
//	t = 51.0 … 54.0  the holder renews (rv 42 … 45), sent at 54.0 last
//	t = 54.5  the administrator deletes the Lease
//	t = 55.0  a claim's quorum read finds it absent: ended from 58.0
//	          (D from the stamp, 53.0, would be before the holder's
//	          validity, 57.0, runs out)
//	t = 55.2  the holder's renewal is answered 404: its fence passes
//	          (had it been paused, its fence would pass by 57.0 − Margin)
//	t = 56.0  the feed recovers and brings rv 42 … 45 (stamped at 56.0:
//	          the feed's versions of an ending session still restamp
//	          it), then the Deleted event: the stamp (56.0) is later
//	          than the read's 55.0, which stands (58.0)
//
// Had the feed brought rv 45 at 54.1 and the Deleted event after the
// read, the end would count from 54.1 instead: every version before the
// deletion was shown, and the last one stamped after its commit. That
// is how, of two observers racing to prove a silent session ended, the
// loser (its read finds the Lease gone after the winner's delete) still
// counts from its stamp once its feed brings the deletion, not D from
// its read (TestReviewDeleteRaceLoserDoesNotWaitAnotherD).
//
// # A session's own end (DESIGN.md, rule 9)
//
// A session that ends gracefully first writes its end into its member
// Lease (endedAnnotation, naming itself), by a write guarded as its
// renewals are, once nothing runs under it any more. The holder says it
// itself, so no clock needs to pass: the observer takes the session as
// proven ended as soon as it sees that version, from the feed or a read,
// and its feed delivers the session's records gone in one batch at that
// version's position. A renewal cannot follow the mark (the session
// writes nothing after it but its delete, and a renewal in flight with
// an older precondition is refused), and no one else writes it: a holder
// that still renews is never taken for ended by it.
//
// # Which D
//
// Every stamp and every end counts the largest D the observer has seen
// in the group (widest): its own group's, and the leaseDurationSeconds of
// every member Lease it has read or the feed brought, the deleted one's
// included. begin refuses a member whose D differs from the live
// members', but two begins may race, and an administrator may shorten a
// Lease's leaseDurationSeconds after its holder's last renewal: neither
// then makes an observer count less than the holder's own D, as long as
// it saw that D once.
//
// # A session's life as the observer sees it
//
//	unknown ──see (a version of its Lease)──▶ present (stamp; restamped by every new version)
//	present ──this observer's guarded delete succeeded──▶ proven
//	any ──a version of its Lease that carries its own end mark (endMarked)──▶ proven
//	present (fed) ──the feed's Deleted event, or its listing without it──▶ ending (since = the stamp, or the listing's receipt)
//	present, unknown ──absent or another incarnation, by a read after it existed──▶ ending (since = receipt)
//	ending ──an earlier safe since──▶ ending (the earlier)
//	ending (a stamp) ──a version from the feed──▶ ending (restamped; the Deleted event may bring since down to it)
//	ending ──since + D passed──▶ ended (by the clock: nothing is written)
//
// proven and ending are kept per identity and never undone: an identity
// never comes back (begin creates a member Lease only if absent, with a
// new incarnation), so a version of it read after its end is an old one,
// and is not stamped; the feed's versions are (above), as the feed shows
// them in commit order before the deletion.
//
// # What a stalled or late feed can do
//
// A feed that stops delivering delays nothing but expiry of versions it
// never showed, and can never make a live holder look dead: the quorum
// read before the delete sees the renewal, and if the renewal commits
// between the read and the delete, the delete's precondition fails; and
// an absence found by a read counts from the read. A version delivered
// late is stamped late, which only delays its expiry. The observer never
// orders resourceVersions (it needs no order): a different one is a new
// version.
//
// # What is assumed
//
// An observer has seen the widest D of the group's live members once
// (see "Which D"; begin keeps the members' D equal, so its own group's D
// is that D). The rate difference of the holder's and the observer's
// monotonic clocks is covered by Margin; clocks need not be synchronized
// (renewTime is never read).
type observer struct {
	g *group // immutable

	mu     sync.Mutex
	stamps map[string]stamp   // guarded by mu: session identity → its member Lease's last version seen, until the Lease's deletion, a listing without it, or a proof ends it
	ends   map[string]endSign // guarded by mu: session identity → the sign of its end
	widest time.Duration      // guarded by mu: the largest D seen: the group's, or any member Lease's leaseDurationSeconds, from a read or the feed; it only grows
}

// newObserver returns an observer of g's member Leases that has seen
// none.
func newObserver(g *group) *observer {
	return &observer{g: g, stamps: make(map[string]stamp), ends: make(map[string]endSign), widest: g.duration}
}

// see records the member Lease l, as a read received it at the monotonic
// time at: a version it has not stamped yet is stamped at; the version it
// has keeps its first stamp. A version of a session whose end is known is
// an old one, and ignored, as is a Lease with no session identity.
func (o *observer) see(l *coordinationv1.Lease, at time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.seeLocked(l, at, false)
}

// sessionOf returns the session identity that holds the member Lease l,
// and false if l has none, or if l's name is not the member Lease name of
// that identity's ID: such a Lease (written by hand, or restored from
// another group) is not that session's, and judging the session by it
// would have expire read and delete a Lease that proves nothing of it,
// or a deletion of it end a session whose own Lease lives.
func (o *observer) sessionOf(l *coordinationv1.Lease) (string, bool) {
	identity := holder(l)
	id, ok := identityID(identity)
	if !ok || l.Name != o.g.memberName(id) {
		return "", false
	}
	return identity, true
}

// seeLocked is see; fed says the feed brought l. A version that carries
// its session's own end mark (endMarked) proves the session ended, read
// or fed, whatever the observer knew of it. A version that differs from
// the stamped one is stamped at at, or at the earlier stamp's time if
// that is later: a read answered at at may take the lock after the feed
// stamped a later version, and a stamp moved back in time would count D
// from before the commit of a renewal it had already seen.
func (o *observer) seeLocked(l *coordinationv1.Lease, at time.Time, fed bool) {
	id, ok := o.sessionOf(l)
	if !ok {
		return
	}
	o.widenLocked(l)
	if endMarked(l) {
		// The session's own end (session.markEnded): written only once
		// nothing runs under it, and never followed by a renewal.
		delete(o.stamps, id)
		o.ends[id] = endSign{proven: true}
		return
	}
	if e, over := o.ends[id]; over && (e.proven || !fed) {
		return
	}
	st, ok := o.stamps[id]
	fed = fed || (ok && st.fed)
	if ok && st.uid == l.UID && st.rv == l.ResourceVersion {
		st.fed = fed
		o.stamps[id] = st
		return
	}
	if ok && st.seen.After(at) {
		at = st.seen
	}
	o.stamps[id] = stamp{name: l.Name, uid: l.UID, rv: l.ResourceVersion, seen: at, duration: o.widest, fed: fed}
}

// widenLocked raises widest to l's leaseDurationSeconds if larger. So
// every stamp and end counts the largest D the observer has seen in the
// group: a Lease's own D (which an administrator may have shortened
// since the holder's last renewal), the group's, and any D seen before,
// of this session or another (a member whose D differs from the
// group's, which begin refuses unless two begins raced).
func (o *observer) widenLocked(l *coordinationv1.Lease) {
	if d := l.Spec.LeaseDurationSeconds; d != nil {
		o.widest = max(o.widest, time.Duration(*d)*time.Second)
	}
}

// observe takes in one change of the group's feed, which must reach the
// observer whole and in order: member Leases put are seen; a member
// Lease deleted (the feed's Deleted event, in commit order after all its
// versions) ends its session from the stamp of its last version if the
// feed showed its versions, else from the event's receipt; a listing
// that lacks the Lease of a session the feed showed ends it from the
// listing's receipt. Bucket Leases are not the observer's.
func (o *observer) observe(ch change) {
	o.mu.Lock()
	defer o.mu.Unlock()
	switch ch.kind {
	case changeSnapshot:
		listed := map[string]string{} // member Lease name → its holder
		for _, l := range ch.leases {
			if isMember(l) {
				listed[l.Name] = holder(l)
				o.seeLocked(l, ch.at, true)
			}
		}
		for id, st := range o.stamps {
			if st.fed && listed[st.name] != id {
				delete(o.stamps, id) // gone: no later version will come
				o.endingLocked(id, ch.at, st.duration)
			}
		}
	case changePut:
		if isMember(ch.lease) {
			o.seeLocked(ch.lease, ch.at, true)
		}
	case changeDelete:
		if !isMember(ch.lease) {
			return
		}
		id, ok := o.sessionOf(ch.lease)
		if !ok {
			return
		}
		o.widenLocked(ch.lease)
		since, d := ch.at, time.Duration(0)
		if st, ok := o.stamps[id]; ok {
			d = st.duration
			if st.fed && st.uid == ch.lease.UID && st.seen.Before(since) {
				since = st.seen
			}
			delete(o.stamps, id) // gone: no later version will come
		}
		o.endingLocked(id, since, d)
	}
}

// endingLocked records that the session identity counts as ended from
// since + D, D the larger of d and widest (and of the D of an end
// recorded before), unless its end is proven or counts from earlier
// already. It keeps the session's stamp: a fed stamp of an ending
// session is still restamped by the feed's later versions (never by a
// read's: a version a read brings after the end may be an old one), so
// that the feed's Deleted event can bring since down to it.
func (o *observer) endingLocked(identity string, since time.Time, d time.Duration) {
	d = max(d, o.widest)
	if e, ok := o.ends[identity]; ok {
		if e.proven || !since.Before(e.since) {
			return
		}
		d = max(d, e.duration)
	}
	o.ends[identity] = endSign{since: since, duration: d}
}

// absent records that a read answered at the monotonic time at, and sent
// after the session identity's member Lease was known to exist, found it
// absent or of another incarnation: the session counts as ended from
// at + D, or earlier if the feed's Deleted event comes and its stamp is
// earlier (observe).
func (o *observer) absent(identity string, at time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	d := time.Duration(0)
	if st, ok := o.stamps[identity]; ok {
		d = st.duration
	}
	o.endingLocked(identity, at, d)
}

// proven records that the observer's delete of identity's member Lease,
// guarded by the version it stamped, succeeded: the session is proven
// ended.
func (o *observer) proven(identity string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.stamps, identity)
	o.ends[identity] = endSign{proven: true}
}

// ended reports whether the session identity is proven ended by what
// this observer saw (see observer): its own guarded delete of the
// session's member Lease, or D passed on its clock since a time after
// the session's last renewal committed. It is the ended of the claims'
// rule (bucketClaims.apply); it reads nothing, so the observer must have
// learnt of the identity first (learn).
func (o *observer) ended(identity string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	e, ok := o.ends[identity]
	return ok && (e.proven || !time.Now().Before(e.since.Add(e.duration)))
}

// learn makes sure the observer knows something of each session of
// identities, which the caller knows existed (a bucket read before the
// call names them): one it has neither stamped nor seen end is looked up
// by a quorum read of its ID's member Lease, which stamps it, or starts
// the clock of its end when the Lease is absent or of another
// incarnation. An identity that is not one ("<ID>/<incarnation>") is an
// error.
func (o *observer) learn(ctx context.Context, identities []string) error {
	for _, identity := range identities {
		id, ok := identityID(identity)
		if !ok {
			return fmt.Errorf("kube: holder %q is not a session identity", identity)
		}
		if o.knows(identity) {
			continue
		}
		cur, err := o.g.leases.Get(ctx, o.g.memberName(id), metav1.GetOptions{}) // no resourceVersion: a quorum read
		switch {
		case apierrors.IsNotFound(err):
			o.absent(identity, time.Now())
		case err != nil:
			return fmt.Errorf("kube: reading the member Lease of %s: %w", id, err)
		default:
			at := time.Now()
			o.see(cur, at)
			if holder(cur) != identity {
				o.absent(identity, at)
			}
		}
	}
	return nil
}

// knows reports whether the observer has stamped identity's member Lease
// or knows of its end.
func (o *observer) knows(identity string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	_, stamped := o.stamps[identity]
	_, over := o.ends[identity]
	return stamped || over
}

// stampOf returns the observer's stamp of identity's member Lease, and
// false if it has none or knows of the session's end (the stamp of an
// ending session is kept only for the feed's Deleted event).
func (o *observer) stampOf(identity string) (stamp, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	st, ok := o.stamps[identity]
	_, over := o.ends[identity]
	return st, ok && !over
}

// due returns the sessions whose stamped version is due at now, and
// whose end the observer does not know of.
func (o *observer) due(now time.Time) []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var ids []string
	for id, st := range o.stamps {
		if _, over := o.ends[id]; !over && !now.Before(st.due()) {
			ids = append(ids, id)
		}
	}
	return ids
}

// nextDue returns the earliest time a stamped version falls due, of the
// sessions whose end the observer does not know of, and false if there
// is none.
func (o *observer) nextDue() (time.Time, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	var next time.Time
	for id, st := range o.stamps {
		if _, over := o.ends[id]; !over && (next.IsZero() || st.due().Before(next)) {
			next = st.due()
		}
	}
	return next, !next.IsZero()
}

// expire proves the session identity ended if it can: if the stamped
// version of its member Lease is due, it reads the Lease with a quorum
// read, and if that shows the same version, deletes it on condition of
// it (deleteIfUnchanged). It answers whether the session is now ended
// (ended): true after its own delete succeeded; false when the stamp is
// not due, a newer version was found (and stamped), or the Lease was
// found gone or of another incarnation by no delete of this observer's
// (then the session counts as ended D after this read).
func (o *observer) expire(ctx context.Context, identity string) (bool, error) {
	st, ok := o.stampOf(identity)
	if !ok || time.Now().Before(st.due()) {
		return o.ended(identity), nil
	}
	cur, err := o.g.leases.Get(ctx, st.name, metav1.GetOptions{}) // no resourceVersion: a quorum read
	if err != nil && !apierrors.IsNotFound(err) {
		return false, fmt.Errorf("kube: reading %s: %w", st.name, err)
	}
	if err != nil {
		cur = nil // absent
	} else if cur.UID == st.uid && cur.ResourceVersion == st.rv {
		return o.deleteIfUnchanged(ctx, identity)
	}
	o.reread(identity, cur, time.Now())
	return o.ended(identity), nil
}

// reread takes in what a quorum read of identity's member Lease, sent
// after the version stamped, answered at at: nil (absent) or a Lease of
// another incarnation ends the session from at; a newer version of its
// own is stamped.
func (o *observer) reread(identity string, cur *coordinationv1.Lease, at time.Time) {
	if cur != nil {
		o.see(cur, at)
	}
	if cur == nil || holder(cur) != identity {
		o.absent(identity, at)
	}
}

// deleteIfUnchanged deletes identity's member Lease on condition of the
// UID and resourceVersion the observer stamped, if that stamp is due. It
// answers true when its delete succeeded: the session is proven ended. A
// Lease already gone (404) was deleted by someone else, which proves
// nothing: the session counts as ended D after this answer (ended says
// when). When the precondition fails (the holder renewed after the
// stamped version; a wasted write), it reads the Lease again, stamps what
// it finds, and answers false.
func (o *observer) deleteIfUnchanged(ctx context.Context, identity string) (bool, error) {
	st, ok := o.stampOf(identity)
	if !ok || time.Now().Before(st.due()) {
		return o.ended(identity), nil
	}
	err := o.g.leases.Delete(ctx, st.name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &st.uid, ResourceVersion: &st.rv}})
	switch {
	case err == nil:
		o.proven(identity)
		return true, nil
	case apierrors.IsNotFound(err):
		o.reread(identity, nil, time.Now())
		return o.ended(identity), nil
	case !apierrors.IsConflict(err):
		return false, fmt.Errorf("kube: deleting %s on condition of version %s: %w", st.name, st.rv, err)
	}
	cur, err := o.g.leases.Get(ctx, st.name, metav1.GetOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return false, fmt.Errorf("kube: reading %s: %w", st.name, err)
	}
	if err != nil {
		cur = nil // absent
	}
	o.reread(identity, cur, time.Now())
	return o.ended(identity), nil
}
