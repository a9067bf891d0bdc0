// The group as ha's view holds it, made of the group's Leases: member
// records, holdings and published chunks as ha's records (ha.Change),
// with the positions that created them; the listing that reads
// it at one position, and the readings of other members' sessions that
// this replica's observer answers.

package kube

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/bgctl/controller/ha"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// createdAnnotation is the annotation of a member Lease that holds the
// resourceVersion of its create: the member record's created position,
// which is its seniority in Leader mode. A Lease records no such thing
// itself (its resourceVersion is its last write's, its
// creationTimestamp a server's clock in whole seconds), so the session
// writes it with its first update, from its create's answer
// (recordCreated); a Lease without it has not been written since its
// create, and its own resourceVersion is that create's. A position rather
// than creationTimestamp: it is of the one sequence every other position
// is of (resourceVersions compare as integers across Leases since
// Kubernetes 1.35), it never ties, and it does not depend on the clocks
// of the API servers, which may differ.
const createdAnnotation = "ha.bgctl.dev/created"

// recordCreated writes into next, the member Lease a session is about to
// update from its own last write, the position of its create, if it does
// not carry it: next's resourceVersion is then its create's, as every
// update of the session carries the annotation on.
func recordCreated(next *coordinationv1.Lease) {
	if _, ok := next.Annotations[createdAnnotation]; ok {
		return
	}
	if next.Annotations == nil {
		next.Annotations = map[string]string{}
	}
	next.Annotations[createdAnnotation] = next.ResourceVersion
}

// createdOf returns the position of member Lease l's create
// (createdAnnotation).
func createdOf(l *coordinationv1.Lease) int64 {
	if v, err := strconv.ParseInt(l.Annotations[createdAnnotation], 10, 64); err == nil {
		return v
	}
	return rvOf(l)
}

// parseMember returns the digest and the leaving mark of member id's
// record value v (memberValue); "" when v carries no digest.
func parseMember(id, v string) (digest string, leaving bool) {
	rest, ok := strings.CutPrefix(v, id)
	if !ok {
		return "", false
	}
	rest, leaving = strings.CutSuffix(rest, " (leaving)")
	digest, ok = strings.CutPrefix(rest, " names=")
	if !ok {
		return "", leaving
	}
	return digest, leaving
}

// groupView is the group's Leases as ha's view holds them: the latest
// version of each that the listing or the feed brought, less the records
// of sessions whose end was delivered (over). A member Lease deleted
// stays until its session's end is delivered, as a bucket entry does:
// on Kubernetes a record goes only when this replica's observer counts
// its session ended (DESIGN.md, "An early end"), and then all of the
// session's records go at once (endOf). It is owned by one goroutine: a
// listing's, then its feed's.
type groupView struct {
	g       *group
	members map[string]*coordinationv1.Lease // by member ID; a deleted one kept until its session's end is delivered
	buckets map[int]*coordinationv1.Lease    // by index
	claims  map[int]bucketClaims             // the decoded claims of buckets[i]
	pieces  map[string]*coordinationv1.Lease // chunk Leases (piece Leases, backendsets.go) by name
	over    map[string]bool                  // session identities whose records are out of the view, for good
}

// newGroupView returns the view of leases, one listing of the group,
// with the records of the sessions of over left out for good.
func newGroupView(g *group, leases []*coordinationv1.Lease, over map[string]bool) (*groupView, error) {
	v := &groupView{g: g, members: map[string]*coordinationv1.Lease{}, buckets: map[int]*coordinationv1.Lease{},
		claims: map[int]bucketClaims{}, pieces: map[string]*coordinationv1.Lease{}, over: maps.Clone(over)}
	if v.over == nil {
		v.over = map[string]bool{}
	}
	for _, l := range leases {
		if _, err := v.put(l, 0); err != nil {
			return nil, err
		}
	}
	return v, nil
}

// memberOf returns the member ID of member Lease l, false if l is not
// one (its name is not its holder's ID's: observer.sessionOf).
func (v *groupView) memberOf(l *coordinationv1.Lease) (string, bool) {
	id, ok := identityID(holder(l))
	return id, ok && l.Name == v.g.memberName(id)
}

// bucketIndex returns i for the name of bucket i's Lease.
func (v *groupView) bucketIndex(name string) (int, bool) {
	s, ok := strings.CutPrefix(name, v.g.name+bucketInfix)
	if !ok {
		return 0, false
	}
	i, err := strconv.Atoi(s)
	if err != nil || i < 0 || i >= v.g.buckets || strconv.Itoa(i) != s {
		return 0, false
	}
	return i, true
}

// put takes in l, created or written at position at (0: from a listing),
// and returns the changes of the view it makes, at at. A bucket whose
// claims do not decode is an error: the view cannot say what it holds.
func (v *groupView) put(l *coordinationv1.Lease, at int64) ([]ha.Change, error) {
	switch l.Labels[kindLabel] {
	case kindMember:
		id, ok := v.memberOf(l)
		if !ok {
			return nil, nil
		}
		before := v.memberRecord(id)
		v.members[id] = l
		after := v.memberRecord(id)
		if after == nil || (before != nil && before.Session == after.Session && before.Created == after.Created &&
			before.Digest == after.Digest && before.Leaving == after.Leaving) {
			return nil, nil // a renewal: nothing the view holds changed
		}
		after.At = at
		return []ha.Change{*after}, nil
	case kindBucket:
		i, ok := v.bucketIndex(l.Name)
		if !ok {
			return nil, nil
		}
		c, err := claimsOf(l)
		if err != nil {
			return nil, fmt.Errorf("kube: %s: %w", l.Name, err)
		}
		before := v.claimRecords(i)
		v.buckets[i], v.claims[i] = l, c
		return diffClaims(before, v.claimRecords(i), at), nil
	case kindChunk:
		key, ok := v.pieceKey(l)
		if !ok {
			return nil, nil
		}
		before := v.chunkRecord(key)
		v.pieces[l.Name] = l
		return diffChunk(before, v.chunkRecord(key), key, at), nil
	}
	return nil, nil
}

// memberRecord returns the member record of member id as the view holds
// it, nil for none; its at is its Lease's last write's.
func (v *groupView) memberRecord(id string) *ha.Change {
	l := v.members[id]
	if l == nil || v.over[holder(l)] {
		return nil
	}
	digest, leaving := parseMember(id, l.Annotations[memberAnnotation])
	return &ha.Change{Kind: ha.MemberPut, At: rvOf(l), Member: id, Session: idOf(holder(l)),
		Created: createdOf(l), Digest: digest, Leaving: leaving}
}

// claimRecords returns the holdings of bucket i the view holds, by name,
// each at the position that created it.
func (v *groupView) claimRecords(i int) map[string]ha.Change {
	recs := map[string]ha.Change{}
	l := v.buckets[i]
	pos := positions(l)
	for name, e := range v.claims[i] {
		if v.over[e.session] {
			continue
		}
		member, _ := identityID(e.session)
		at := pos(e.token)
		recs[name] = ha.Change{Kind: ha.ClaimPut, At: at, Member: member, Name: name, Session: idOf(e.session), Created: at}
	}
	return recs
}

// diffClaims returns the changes from before to after, one bucket's
// holdings, at position at: a holding new or of another holder is put
// (a hand-over is a put alone), one that is no longer there is gone.
func diffClaims(before, after map[string]ha.Change, at int64) []ha.Change {
	var chs []ha.Change
	for _, name := range slices.Sorted(maps.Keys(before)) {
		if _, ok := after[name]; !ok {
			chs = append(chs, ha.Change{Kind: ha.ClaimGone, At: at, Name: name})
		}
	}
	for _, name := range slices.Sorted(maps.Keys(after)) {
		c := after[name]
		if b, ok := before[name]; !ok || b.Session != c.Session || b.Created != c.Created {
			c.At = max(at, c.Created)
			chs = append(chs, c)
		}
	}
	return chs
}

// sessions returns the session identities the view's records are under,
// sorted: those whose end it may have to deliver.
func (v *groupView) sessions() []string {
	ids := map[string]bool{}
	for _, l := range v.members {
		ids[holder(l)] = true
	}
	for _, c := range v.claims {
		for _, e := range c {
			ids[e.session] = true
		}
	}
	for _, l := range v.pieces {
		ids[holder(l)] = true
	}
	for id := range v.over {
		delete(ids, id)
	}
	return slices.Sorted(maps.Keys(ids))
}

// records returns every record of the view as a put: a listing.
func (v *groupView) records() []ha.Change {
	var recs []ha.Change
	for _, id := range slices.Sorted(maps.Keys(v.members)) {
		if r := v.memberRecord(id); r != nil {
			recs = append(recs, *r)
		}
	}
	for _, i := range slices.Sorted(maps.Keys(v.buckets)) {
		c := v.claimRecords(i)
		for _, name := range slices.Sorted(maps.Keys(c)) {
			recs = append(recs, c[name])
		}
	}
	for _, key := range v.chunkKeys() {
		if r := v.chunkRecord(key); r != nil {
			recs = append(recs, *r)
		}
	}
	return recs
}

// listing is a listing list answered: the group's Leases at position at,
// received at the monotonic time received, and the sessions left out as
// ended. watch starts its view from it.
type listing struct {
	at       int64
	leases   []*coordinationv1.Lease
	received time.Time
	over     map[string]bool
}

// List reads the group's Leases with one quorum list (one
// resourceVersion for the whole list), and answers its records and that
// position. A holding, member record or chunk of a session this
// replica's observer counts ended is left out: on Kubernetes the entries
// of an ended session stay in their buckets until someone rewrites them,
// and the shared part must see them free. The sessions the buckets name
// that the observer knows nothing of are learnt from the same list, as
// observer.learn learns them from a read: one whose member Lease is not
// in it ends D after the list came (the bucket showed it existed, the
// list that it is gone). The listing is kept for Watch.
func (b *kubeBackend) List(ctx context.Context) ([]ha.Change, int64, error) {
	rctx, cancel := b.request(ctx)
	ls, err := b.g.leases.List(rctx, metav1.ListOptions{LabelSelector: groupLabel + "=" + b.g.name})
	cancel()
	if err != nil {
		return nil, 0, fmt.Errorf("kube: listing group %s: %w", b.g.name, err)
	}
	received := time.Now()
	at, err := strconv.ParseInt(ls.ResourceVersion, 10, 64)
	if err != nil {
		return nil, 0, fmt.Errorf("kube: listing group %s: resourceVersion %q is not an integer (a server before 1.35?)", b.g.name, ls.ResourceVersion)
	}
	leases := make([]*coordinationv1.Lease, len(ls.Items))
	for i := range ls.Items {
		leases[i] = &ls.Items[i]
	}
	v, err := newGroupView(b.g, leases, nil)
	if err != nil {
		return nil, 0, err
	}
	b.learnListed(v, received)
	for _, identity := range v.sessions() {
		if b.o.ended(identity) {
			v.over[identity] = true
		}
	}
	b.mu.Lock()
	b.listed = &listing{at: at, leases: leases, received: received, over: maps.Clone(v.over)}
	b.mu.Unlock()
	return v.records(), at, nil
}

// learnListed has the observer learn the sessions of v, a listing
// received at the monotonic time at, that it knows nothing of: one whose
// member Lease the listing holds is stamped, as a read's (and one whose
// Lease carries its end mark is seen, known or not: it ended); one named only
// by a bucket, or whose ID's member Lease is of another incarnation,
// counts as ended D after at (observer.absent): the bucket's entry was
// written while the session's Lease existed, and the listing, a quorum
// read of the same resourceVersion, finds it gone.
func (b *kubeBackend) learnListed(v *groupView, at time.Time) {
	for _, l := range v.members {
		if !b.o.knows(holder(l)) || endMarked(l) {
			b.o.see(l, at)
		}
	}
	for _, c := range v.claims {
		for _, e := range c {
			id, ok := identityID(e.session)
			if !ok || b.o.knows(e.session) {
				continue
			}
			if l := v.members[id]; l == nil || holder(l) != e.session {
				b.o.absent(e.session, at)
			}
		}
	}
}

// errNoHistory is HeldAt's answer: the API server keeps no state of the
// group at an earlier resourceVersion that a list may ask for (a list at
// a resourceVersion is served from the watch cache's recent window, if
// at all, and not for Leases rewritten since). ha takes it as "cannot
// say", as etcd's answer for a compacted revision.
var errNoHistory = errors.New("kube: the API server keeps no history of the group's Leases at an earlier position")

// HeldAt answers errNoHistory: ha then claims the names others handed to
// this replica while it settled only after Options.Settle.
func (b *kubeBackend) HeldAt(context.Context, int64) (map[string]bool, error) {
	return nil, errNoHistory
}

// PeerLeft answers how long another member's session id lives, as this
// replica's observer counts it: granted is the D it counts for the
// session (its stamp's, the widest it had seen), left that D less the
// time since it first saw the session's last version, on its own
// monotonic clock; for a session whose Lease is gone, what is left until
// the observer counts it ended; ha.ErrSessionEnded once it does. An
// observer that knows nothing of id lists the group's member Leases
// (stamping each, as a read) and looks again.
//
// left is never short of when this observer would count the session
// ended if no version it has not seen yet came, which is later than the
// holder's validity by the time the holder's last renewal the observer
// saw took from send to receipt. A renewal it has not seen (a feed that
// lags) makes left short of the holder's validity, by up to the time
// between the writes (TestRoundingReviewPeerLeftIsShortOfAnUnseenRenewal);
// the observer finds that renewal by its quorum read before it counts
// the session ended, and nothing frees the session's names before it
// does (Rounding).
func (b *kubeBackend) PeerLeft(ctx context.Context, id ha.SessionID) (left, granted time.Duration, err error) {
	for try := 0; ; try++ {
		left, granted, known, ended := b.o.leftOf(id, time.Now())
		switch {
		case ended:
			return 0, 0, fmt.Errorf("kube: session %x ended, by this replica's observer: %w", int64(id), ha.ErrSessionEnded)
		case known:
			return left, granted, nil
		case try > 0:
			return 0, 0, fmt.Errorf("kube: session %x: no member Lease of the group is under it", int64(id))
		}
		ls, err := b.g.leases.List(ctx, metav1.ListOptions{LabelSelector: groupLabel + "=" + b.g.name + "," + kindLabel + "=" + kindMember})
		if err != nil {
			return 0, 0, fmt.Errorf("kube: listing the members of %s: %w", b.g.name, err)
		}
		at := time.Now()
		for i := range ls.Items {
			if l := &ls.Items[i]; !b.o.knows(holder(l)) {
				b.o.see(l, at)
			}
		}
	}
}

// Rounding is 0: TimeLeft and PeerLeft count D from a receipt of the
// member Lease's last version they know of, after that write's commit,
// itself after the send time its holder's fence counts from; so a
// silent member's names start elsewhere as soon as the readings put its
// end, without the second etcd's whole-second truncation needs.
//
// A renewal the observer has not seen yet (its feed stalled, or not
// there yet) is not counted: PeerLeft read then puts the end at the
// version before's stamp, short of the holder's validity by up to the
// time between the two writes, and of its fence too
// (TestRoundingReviewPeerLeftIsShortOfAnUnseenRenewal). No reading frees
// a name here: a session's records leave the view, and a Claim takes
// its names, only once this replica's observer counts it ended, on its
// own proof or D after a time past the commit of the session's last
// renewal (observer), whatever ha's hold says
// (TestRoundingReviewShortReadingStartsNoNameEarly); ha's allowance
// would only delay the names further.
func (b *kubeBackend) Rounding() time.Duration { return 0 }

// leftOf returns what the observer knows of session id at now: whether
// it knows the session, whether it counts it ended, and if neither, how
// long until it would (left) of what D (granted).
func (o *observer) leftOf(id ha.SessionID, now time.Time) (left, granted time.Duration, known, ended bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for identity, e := range o.ends {
		if idOf(identity) != id {
			continue
		}
		until := e.since.Add(e.duration)
		if e.proven || !now.Before(until) {
			return 0, 0, true, true
		}
		return until.Sub(now), e.duration, true, false
	}
	for identity, st := range o.stamps {
		if idOf(identity) == id {
			return max(st.due().Sub(now), 0), st.duration, true, false
		}
	}
	return 0, 0, false, false
}

// proveDue has the observer prove ended the sessions whose stamped
// version is due (observer.expire), each request bounded by the request
// timeout and ctx.
func (b *kubeBackend) proveDue(ctx context.Context) {
	for _, identity := range b.o.due(time.Now()) {
		rctx, cancel := b.request(ctx)
		if _, err := b.o.expire(rctx, identity); err != nil {
			b.log.Debug(fmt.Sprintf("kube: proving %s ended: %v", identity, err))
		}
		cancel()
	}
}
