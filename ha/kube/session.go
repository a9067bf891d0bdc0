// A replica's membership session: one member Lease, created by begin,
// renewed under a resourceVersion precondition, ended by a guarded
// delete. The server gives a Lease no TTL; how long a session is valid is
// the holder's own reckoning from its send times, and how long it looks
// alive is each observer's (observe.go).

package kube

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/bgctl/controller/ha"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
)

// The labels every Lease of a group carries: the group's name, and
// whether the Lease is a member's or a bucket.
const (
	groupLabel  = "ha.bgctl.dev/group"
	kindLabel   = "ha.bgctl.dev/kind"
	kindMember  = "member"
	kindBucket  = "bucket"
	memberInfix = "-m-"
	bucketInfix = "-b-"
)

// defaultBuckets is the number of buckets a group has unless it says
// otherwise: enough that they spread evenly over tens of replicas, few
// enough that moving a crashed replica's share takes a few hundred
// writes at most.
const defaultBuckets = 256

// errSessionLost is the answer of a write to the member Lease that the
// server refused because the Lease is gone (404) or was written by
// someone else since the session's own last write (409): an observer
// judged the session expired and deleted it, or the session's own write
// timed out on the client and committed later. Either way the session can
// no longer extend its validity; a new one must begin. The backend
// answers ha.ErrSessionEnded for it (kubeBackend.ended).
var errSessionLost = errors.New("kube: member session lost: its Lease was deleted or written since the session's last write")

// errDurationMismatch is begin's answer when another member Lease of the
// group has a leaseDurationSeconds other than the group's D: replicas of
// one group must agree on D, as on the bucket count, so that none judges
// another's session ended by a D shorter than the one its holder counts
// its validity with (observe.go, "Which D").
var errDurationMismatch = errors.New("kube: a member of the group has a lease duration other than this replica's")

// errBucketCount is begin's answer when another member Lease of the
// group records a bucket count other than this replica's: a name's
// bucket is its hash modulo the count, so two counts would put one name
// in two buckets, where two replicas could claim it at once.
var errBucketCount = errors.New("kube: a member of the group has a bucket count other than this replica's")

// bucketsAnnotation is the annotation of a member Lease that records its
// replica's bucket count, for begin's check (errBucketCount).
const bucketsAnnotation = "ha.bgctl.dev/buckets"

// errReservedInfix is the answer of newGroup for a group name that
// contains "-m-" or "-b-" or ends with "-m" or "-b", and of begin for a
// member ID that contains "-m-" or "-b-". With such group names, one
// group's Lease names could be another's: group "a-m"'s bucket 0 and
// group "a"'s member "b-0" are both "a-m-b-0", and group "a-m-x"'s
// members are group "a"'s members "x-m-…". The group rule alone rules
// that out (a collision needs one group name to continue past the other
// with an infix, whole or cut at its last dash); the ID rule keeps the
// infix the only one in a member Lease's name, for people and tools that
// read it.
var errReservedInfix = errors.New(`kube: "-m-" and "-b-" are reserved as the infixes of Lease names`)

// group is one group's Leases in one namespace: the member Leases
// <name>-m-<ID>, one per live session, and the bucket Leases
// <name>-b-<i>, i < buckets, never deleted. Every field is immutable
// after newGroup.
//
// A replica reaches the Leases through two clients (leaseClients): one
// for a session's writes to its own member Lease (begin, renew, end),
// one for everything else (claims, the observers' reads and deletes, the
// feed), each with a client-side rate limiter of its own, so that a
// renewal never waits behind a burst of claim writes (a takeover of a
// crashed replica's buckets is hundreds of them), whose delay would eat
// into the fence (DESIGN.md, "Assumptions").
type group struct {
	leases   coordinationv1client.LeaseInterface // the namespace's Leases, with the replica's credentials: claims, reads, the feed
	renewals coordinationv1client.LeaseInterface // the same, through a client and rate limiter of their own: member Lease writes
	name     string                              // prefix of every Lease name, value of groupLabel
	buckets  int                                 // N, fixed for the group's life
	duration time.Duration                       // D: whole seconds, written into every member Lease
}

// newGroup returns the group name in the namespace leases and renewals
// are bound to (the two clients of leaseClients), with the given number
// of buckets (defaultBuckets if 0) and member lease duration D (rounded
// up to a whole second, as leaseDurationSeconds holds). It checks that
// its Lease names and label are valid.
func newGroup(leases, renewals coordinationv1client.LeaseInterface, name string, buckets int, duration time.Duration) (*group, error) {
	if buckets == 0 {
		buckets = defaultBuckets
	}
	if buckets < 0 {
		return nil, fmt.Errorf("kube: %d buckets", buckets)
	}
	if duration < time.Second {
		return nil, fmt.Errorf("kube: lease duration %v is under a second", duration)
	}
	g := &group{leases: leases, renewals: renewals, name: name, buckets: buckets, duration: duration.Round(time.Second)}
	if g.duration < duration {
		g.duration += time.Second
	}
	if err := checkInfixes("group name", name, true); err != nil {
		return nil, err
	}
	if errs := validation.IsValidLabelValue(name); len(errs) > 0 {
		return nil, fmt.Errorf("kube: group name %q: %s", name, strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Subdomain(g.bucketName(buckets - 1)); len(errs) > 0 {
		return nil, fmt.Errorf("kube: group name %q: %s", name, strings.Join(errs, "; "))
	}
	return g, nil
}

// checkInfixes refuses (errReservedInfix) a group name (group true)
// or member ID s that contains an infix of the Lease names, or, for a
// group name, ends with one cut at its last dash ("-m", "-b"). what
// names s in the error.
func checkInfixes(what, s string, group bool) error {
	padded := s
	if group {
		padded += "-"
	}
	if strings.Contains(padded, memberInfix) || strings.Contains(padded, bucketInfix) {
		return fmt.Errorf("%w: %s %q", errReservedInfix, what, s)
	}
	return nil
}

// memberName is the name of the member Lease of ID id.
func (g *group) memberName(id string) string { return g.name + memberInfix + id }

// bucketName is the name of bucket i's Lease.
func (g *group) bucketName(i int) string { return fmt.Sprintf("%s%s%d", g.name, bucketInfix, i) }

// labels returns the labels of a Lease of the group of the given kind.
func (g *group) labels(kind string) map[string]string {
	return map[string]string{groupLabel: g.name, kindLabel: kind}
}

// newIdentity returns the identity of a new session of member id: the ID
// and an incarnation drawn at random, "<ID>/<incarnation>". A replica
// restarted with the same ID is a different session, and a name held by
// its previous incarnation is known as such. IDs are DNS subdomain
// characters (they are part of a Lease name), so the last "/" splits it.
func newIdentity(id string) string {
	return id + "/" + strings.ToLower(rand.Text())
}

// identityID returns the member ID of a session identity, and false if
// identity is not one.
func identityID(identity string) (string, bool) {
	i := strings.LastIndexByte(identity, '/')
	if i <= 0 || i == len(identity)-1 {
		return "", false
	}
	return identity[:i], true
}

// sessionState is where a session is in its life.
//
//	sessionLive ──renew or end answered 404 or 409─────────────────▶ sessionLost
//	     │                                                              ▲
//	     ├──markEnded succeeded──▶ sessionEnding ──end answered either──┘
//	     │                              │
//	     │                              └──end succeeded──▶ sessionEnded
//	     └──end succeeded─────────────────────────────────▶ sessionEnded
//
// Lost and ended are final: a session never comes back. Ending is the
// session's end written (endedAnnotation), its Lease not yet deleted:
// it writes nothing more to its Lease but end's delete, so that a
// renewal can never lift the mark. A replica that lost
// its session begins a new one, with a new identity, which the server
// accepts once the old member Lease is gone. A renewal that fails otherwise (a
// timeout, the server unavailable) leaves the session live: its validity
// is simply not extended, and the caller's fence runs out by itself.
type sessionState int

const (
	sessionLive sessionState = iota
	sessionLost
	sessionEnding
	sessionEnded
)

// endedAnnotation is the annotation of a member Lease by which its own
// session says it ended (session.markEnded); its value is the session's
// identity. Every observer takes a Lease that carries it, with its
// holder's identity, as its session's end at once (observer.seeLocked):
// only the session's own end writes it, once nothing runs under the
// session any more (ha ends a session only after its controllers
// stopped), and the session writes its Lease no more after it but to
// delete it (sessionEnding).
const endedAnnotation = "ha.bgctl.dev/ended"

// endMarked reports whether member Lease l carries its own session's
// end (endedAnnotation naming its holder).
func endMarked(l *coordinationv1.Lease) bool {
	v, ok := l.Annotations[endedAnnotation]
	return ok && v != "" && v == holder(l)
}

// session is one membership session: the member Lease <group>-m-<ID>,
// holderIdentity the session's identity, leaseDurationSeconds D.
//
// # Validity, counted from send times
//
// The server keeps no TTL. A write to the Lease that the server answered
// with success makes the session valid until
//
//	validUntil = sent + D
//
// where sent is the holder's monotonic clock read before the request was
// sent. Observers (observe.go) stamp each new resourceVersion with their
// own receipt time t, and delete the Lease only if it is unchanged at
// t + D. Since sent < commit < t, the holder's validity ends before any
// observer may delete; the caller's fence passes Margin earlier still,
// at validUntil − Margin, and Margin covers the rate difference of the two
// monotonic clocks (500 ppm of D is 1 ms per 2 s) and the time user code
// takes to return once cancelled. Sample, D = 10 s, Margin = 2 s:
//
//	holder sends renewal at s = 100.000 (its clock), answered at 100.040
//	validUntil = 110.000, fence passes at 108.000
//	server commits rv 7 at 100.020; observer receives it at t = 100.030 (its clock)
//	observer may delete rv 7 from 110.030: the holder's fence passed 2.030 s earlier
//	if the holder's next renewal (sent 103.000) commits rv 8 first, that delete fails
//
// # Writes under precondition
//
// Every write to the Lease names the resourceVersion of the session's own
// last write (update) or its UID and resourceVersion (delete), so a write
// by anyone else in between, and above all an observer's delete, makes
// the session's next write fail: 404 or 409, errSessionLost. renewTime is
// set for people reading the Lease; nobody's safety reads it, as it comes
// from another machine's clock.
type session struct {
	g        *group // immutable
	id       string // immutable: the member ID
	identity string // immutable: "<ID>/<incarnation>", holder of the member Lease and of the session's names in the buckets
	name     string // immutable: the member Lease's name

	// mu is held across each write to the member Lease (renew, end):
	// each names the resourceVersion the previous one produced, so two
	// at once would refuse each other and lose the session.
	mu    sync.Mutex
	lease *coordinationv1.Lease // guarded by mu: the member Lease as the session's last successful write left it
	state sessionState          // guarded by mu
	valid time.Time             // guarded by mu: validUntil of the session's last successful write (sent + D)
	// unsure is true when the session's last write got no answer (a
	// timeout, a cancelled context, a broken connection): the server may
	// have applied it, and lease is then behind the stored version.
	// Guarded by mu.
	unsure bool
}

// begin starts a session of member id: it creates the member Lease, and
// answers the session and how long it is valid (sent + D, sent the time
// the create was sent). If a member Lease of that ID exists, it answers
// an error wrapping ha.ErrDuplicateID: the ID's previous session is
// alive, or not yet proven ended (an observer deletes its Lease once it
// has seen it unchanged for its duration; begin succeeds after that).
//
// After the create, it lists the group's member Leases (a quorum list),
// and if one has a leaseDurationSeconds other than the group's D, or a
// bucket count other than the group's (errBucketCount), it deletes its
// own Lease (guarded by its UID and resourceVersion) and answers
// errDurationMismatch naming that member: the group's D changes
// only once every member of the old D has ended (its Lease gone). Listing
// after the create, not before, is what refuses two begins with
// different D racing: the later list of the two is sent after both
// creates committed, and sees the other. A list that fails refuses the
// session too (its Lease deleted as above). Should that delete fail as
// well, the Lease stays until an observer proves it ended, and the ID's
// next begin is ha.ErrDuplicateID until then.
func (g *group) begin(ctx context.Context, id string) (*session, time.Time, error) {
	return g.beginWith(ctx, id, nil)
}

// beginWith is begin, the member Lease carrying annotations besides the
// group's bucket count (bucketsAnnotation), which every member Lease
// records and begin checks as it checks D.
func (g *group) beginWith(ctx context.Context, id string, annotations map[string]string) (*session, time.Time, error) {
	if err := checkInfixes("member ID", id, false); err != nil {
		return nil, time.Time{}, err
	}
	name := g.memberName(id)
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return nil, time.Time{}, fmt.Errorf("kube: member ID %q: %s", id, strings.Join(errs, "; "))
	}
	identity := newIdentity(id)
	sent := time.Now()
	l := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: g.labels(kindMember), Annotations: map[string]string{}},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       &identity,
			LeaseDurationSeconds: new(int32(g.duration / time.Second)),
			AcquireTime:          &metav1.MicroTime{Time: sent},
			RenewTime:            &metav1.MicroTime{Time: sent},
		},
	}
	maps.Copy(l.Annotations, annotations)
	l.Annotations[bucketsAnnotation] = strconv.Itoa(g.buckets)
	created, err := g.renewals.Create(ctx, l, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil, time.Time{}, fmt.Errorf("kube: %s: a session of this member ID exists and is not proven ended: %w", name, ha.ErrDuplicateID)
	}
	if err != nil {
		return nil, time.Time{}, &createFailed{identity: identity, err: fmt.Errorf("kube: beginning the session of %s: %w", id, err)}
	}
	if err := g.sameShape(ctx, name); err != nil {
		uid, rv := created.UID, created.ResourceVersion
		if derr := g.renewals.Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}}); derr != nil {
			return nil, time.Time{}, fmt.Errorf("kube: beginning the session of %s: %w (deleting its Lease: %v)", id, err, derr)
		}
		return nil, time.Time{}, fmt.Errorf("kube: beginning the session of %s: %w", id, err)
	}
	s := &session{g: g, id: id, identity: identity, name: name, lease: created, valid: sent.Add(g.duration)}
	return s, s.valid, nil
}

// createFailed is beginWith's error when the create of the member Lease
// failed otherwise than because one exists: the server may have carried
// it out and its answer been lost (a timeout, a broken connection), the
// Lease left under identity, which only that begin knew.
type createFailed struct {
	identity string
	err      error
}

func (e *createFailed) Error() string { return e.err.Error() }
func (e *createFailed) Unwrap() error { return e.err }

// sameShape lists the group's member Leases with a quorum list, and
// answers errDurationMismatch, naming the first whose
// leaseDurationSeconds is not g's D, or errBucketCount, naming the first
// whose bucket count is not g's, if one is not (mine, the caller's own
// Lease, aside). A Lease that carries neither is not counted.
func (g *group) sameShape(ctx context.Context, mine string) error {
	list, err := g.renewals.List(ctx, metav1.ListOptions{LabelSelector: groupLabel + "=" + g.name + "," + kindLabel + "=" + kindMember})
	if err != nil {
		return fmt.Errorf("listing the members of %s: %w", g.name, err)
	}
	for _, l := range list.Items {
		d := l.Spec.LeaseDurationSeconds
		if l.Name != mine && d != nil && time.Duration(*d)*time.Second != g.duration {
			return fmt.Errorf("%w: %s has %ds, this replica %v", errDurationMismatch, l.Name, *d, g.duration)
		}
		if n, ok := l.Annotations[bucketsAnnotation]; l.Name != mine && ok && n != strconv.Itoa(g.buckets) {
			return fmt.Errorf("%w: %s has %s buckets, this replica %d", errBucketCount, l.Name, n, g.buckets)
		}
	}
	return nil
}

// renew writes the member Lease again on the resourceVersion of the
// session's last write, and answers validUntil = sent + D, sent read just
// before the request went out (see session). A 404 or 409 answer is
// errSessionLost, and the session is lost for good. Renewals of one
// session run one at a time.
func (s *session) renew(ctx context.Context) (validUntil time.Time, err error) {
	return s.update(ctx, nil)
}

// update is renew, the Lease written with edit applied to it first when
// edit is not nil (the member record's annotations): every write of the
// member Lease renews the session.
func (s *session) update(ctx context.Context, edit func(*coordinationv1.Lease)) (validUntil time.Time, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.updateLocked(ctx, edit)
}

// updateLocked is update, s.mu held.
func (s *session) updateLocked(ctx context.Context, edit func(*coordinationv1.Lease)) (validUntil time.Time, err error) {
	if err := s.stateErrLocked(); err != nil {
		return time.Time{}, err
	}
	// renew's safety depends on the UID this body carries, from the
	// session's own create (s.lease keeps it; never clear it), as well as
	// its resourceVersion: the server refuses an update whose UID is not
	// the stored object's, so a Lease deleted and created again under the
	// same name (by an administrator, or a restore) answers 409, and the
	// session is lost rather than renewed on a Lease that is not its own.
	next := s.lease.DeepCopy()
	if edit != nil {
		edit(next)
	}
	recordCreated(next)
	sent := time.Now()
	next.Spec.RenewTime = &metav1.MicroTime{Time: sent} // for people; nobody's safety reads it
	got, err := s.g.renewals.Update(ctx, next, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) && s.unsure {
		// The write before may have landed after its client gave up:
		// if the stored version is that write's, go on from it, once.
		var ok bool
		if ok, err = s.catchUpLocked(ctx); err != nil {
			return time.Time{}, fmt.Errorf("kube: renewing %s: %w", s.name, err)
		}
		if ok {
			next = s.lease.DeepCopy()
			if edit != nil {
				edit(next)
			}
			recordCreated(next)
			sent = time.Now()
			next.Spec.RenewTime = &metav1.MicroTime{Time: sent}
			got, err = s.g.renewals.Update(ctx, next, metav1.UpdateOptions{})
		} else {
			err = apierrors.NewConflict(coordinationv1.Resource("leases"), s.name, errors.New("written by someone else since the session's last write"))
		}
	}
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		s.state, s.unsure = sessionLost, false
		return time.Time{}, fmt.Errorf("%w: %s: %v", errSessionLost, s.name, err)
	}
	if err != nil {
		s.unsure = true
		return time.Time{}, fmt.Errorf("kube: renewing %s: %w", s.name, err)
	}
	s.lease, s.unsure = got, false
	s.valid = sent.Add(s.g.duration)
	return s.valid, nil
}

// catchUpLocked reads the member Lease after a write refused for a
// version the session does not know, when its previous write got no
// answer (unsure), and takes the stored version as the session's own
// (ok) only if that unanswered write can be what made it: the same
// object (UID), still the session's (holderIdentity), and no end written
// into it (endedAnnotation: a mark, once stored, ends the session for
// every observer, so a session must never write on past it). Anyone
// else's write, a deletion, or a mark leaves ok false: the session is
// lost. The session's validity is left as its last answered write set
// it: the unanswered one's send time is not known, and an observer counts
// from when it saw that version, later. s.mu held.
func (s *session) catchUpLocked(ctx context.Context) (ok bool, err error) {
	cur, err := s.g.renewals.Get(ctx, s.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	_, marked := cur.Annotations[endedAnnotation]
	if cur.UID != s.lease.UID || cur.Spec.HolderIdentity == nil || *cur.Spec.HolderIdentity != s.identity || marked {
		return false, nil
	}
	s.lease = cur
	return true, nil
}

// markEnded writes the session's end into its member Lease
// (endedAnnotation), by an update guarded by the session's last write,
// as a renewal is: a 404 or 409 is errSessionLost. Once it succeeded
// the session is ending: every observer takes it as ended as soon as it
// sees that version, and the session writes nothing more to its Lease
// but end's delete. A mark whose answer was lost (a timeout) may have
// landed: the session's next write is then refused (409), and the
// session is lost. The caller marks a session only once nothing runs
// under it any more. A session ending already answers nil.
func (s *session) markEnded(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state == sessionEnding {
		return nil
	}
	if _, err := s.updateLocked(ctx, func(l *coordinationv1.Lease) {
		if l.Annotations == nil {
			l.Annotations = map[string]string{}
		}
		l.Annotations[endedAnnotation] = s.identity
	}); err != nil {
		return err
	}
	s.state = sessionEnding
	return nil
}

// end deletes the member Lease on condition of its UID and the
// resourceVersion of the session's last write. The caller has stopped
// everything the session's names run first. Marked ended before
// (markEnded), the session was ended for every observer by the mark;
// otherwise names it still held are taken by others only D after their
// observers last saw the Lease, as a deletion they did not make proves
// nothing to them (observe.go). A refused delete means the session was
// lost already (errSessionLost).
func (s *session) end(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != sessionEnding {
		if err := s.stateErrLocked(); err != nil {
			if errors.Is(err, ha.ErrSessionEnded) {
				return nil
			}
			return err
		}
	}
	uid, rv := s.lease.UID, s.lease.ResourceVersion
	err := s.g.renewals.Delete(ctx, s.name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		s.state = sessionLost
		return fmt.Errorf("%w: %s: %v", errSessionLost, s.name, err)
	}
	if err != nil {
		return fmt.Errorf("kube: ending %s: %w", s.name, err)
	}
	s.state = sessionEnded
	return nil
}

// stateErr returns nil while the session has neither been lost nor
// ended nor marked ended, as far as its own writes know, else
// errSessionLost or ha.ErrSessionEnded (wrapped).
func (s *session) stateErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stateErrLocked()
}

// stateErrLocked returns the error of a session that is no longer live.
func (s *session) stateErrLocked() error {
	switch s.state {
	case sessionLost:
		return fmt.Errorf("%w: %s", errSessionLost, s.name)
	case sessionEnding:
		return fmt.Errorf("kube: member session %s ended (its end is written): %w", s.name, ha.ErrSessionEnded)
	case sessionEnded:
		return fmt.Errorf("kube: member session %s ended: %w", s.name, ha.ErrSessionEnded)
	}
	return nil
}

// claimWriter is writer, for claims: they stop also once the session is
// past its validity (its last successful write's send time + D). By
// then the caller's fence has passed, and an observer may have proven
// the session ended: an entry written after a conflict's new read would
// name a session whose Lease may be gone, keeping the name from a
// replica that never saw the session for D. (A write sent before and
// committed after is not stopped: its answer comes past the validity,
// and claim refuses it.)
func (s *session) claimWriter() writer {
	return writer{identity: s.identity, check: func() error {
		s.mu.Lock()
		defer s.mu.Unlock()
		if err := s.stateErrLocked(); err != nil {
			return err
		}
		if !time.Now().Before(s.valid) {
			return fmt.Errorf("kube: session %s is past its validity", s.identity)
		}
		return nil
	}}
}
