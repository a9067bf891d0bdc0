// ha's Backend on Kubernetes: kubeBackend implements ha.Backend and
// its optional capabilities with ha's types, made of this package's
// primitives: sessions are member Leases, holdings are entries in bucket
// Leases, and an ended session is one this replica's observer proved or
// saw ended (DESIGN.md, "The interface the shared part calls").

package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bgctl/controller/ha"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/version"
	"k8s.io/client-go/rest"
)

// idOf returns the ha.SessionID of a session identity ("<ID>/<incarnation>",
// the member Lease's holderIdentity): FNV-1a (64 bits), its top bit
// cleared, and 1 in place of 0, which names none. The identity is unique
// per incarnation (the incarnation is random) and, unlike the Lease's
// UID, is what every bucket entry carries: the session of a holding read
// from a bucket is known without reading the holder's member Lease,
// which may be gone.
func idOf(identity string) ha.SessionID {
	h := fnv.New64a()
	h.Write([]byte(identity))
	id := ha.SessionID(h.Sum64() &^ (1 << 63))
	if id == 0 {
		id = 1
	}
	return id
}

// memberAnnotation is the annotation of a member Lease that holds the
// member record's value (memberValue): the ID, the digest of its names,
// and whether it is leaving, in the format of ha/etcd's member key's
// value.
const memberAnnotation = "ha.bgctl.dev/member"

// memberValue is the member record's value, in ha's format: "<ID>
// names=<digest>", then " (leaving)" when it leaves.
func memberValue(id, digest string, leaving bool) string {
	v := id + " names=" + digest
	if leaving {
		v += " (leaving)"
	}
	return v
}

// claimWorkers bounds the bucket writes one call has in flight at once
// (Claim, End, takeOver): enough to keep a client's rate limit busy, few
// enough that one call does not take every connection's streams.
const claimWorkers = 8

// kubeBackend is the backend on Kubernetes Leases of one replica, of
// member ID id in group g: ha's Backend. Its methods are safe for
// concurrent use, and none leaves a goroutine running when it returns
// but Watch and TakeOver, whose goroutines are counted in the caller's
// WaitGroup; run is the one that runs until its context ends, and its
// caller owns it.
//
// Its sessions are the ones Begin started here. A session begun by
// another process under this replica's ID (its previous run, before a
// restart) is read through its member Lease by TimeLeft (earlierLeft),
// which judges it as the observers judge a silent member; every other
// call naming such a session answers ha.ErrSessionEnded.
type kubeBackend struct {
	// Immutable after newKubeBackend.
	g              *group
	o              *observer
	id             string
	log            *slog.Logger
	server         func(ctx context.Context) (*version.Info, error) // asks the API server its release (serverVersion); nil: not asked
	requestTimeout time.Duration

	warned atomic.Bool // CheckServers has logged a server too old

	mu       sync.Mutex
	sessions map[ha.SessionID]*session         // guarded by mu: the live sessions begun here; one lost or ended is removed once found so
	buckets  map[int]known                     // guarded by mu: the latest version of each bucket seen (the feed, or this replica's writes and reads)
	members  map[string]*coordinationv1.Lease  // guarded by mu: the feed's member Leases, by member ID
	wrote    map[ha.SessionID]map[int]struct{} // guarded by mu: the buckets each session wrote entries into, for End
	listed   *listing                          // guarded by mu: the last listing List answered, where Watch starts (backendview.go)
	// moved, when not nil, is closed by the next remember, for the
	// claims waiting for a bucket to move (awaitHandOvers). Guarded by
	// mu.
	moved chan struct{}
	// handOverAt is when this replica's ha last asked for a hand-over
	// (TakeOver): claims wait for the survivors' rewrites only
	// shortly after it. Guarded by mu.
	handOverAt time.Time
	// handing is the number of takeOver calls running, and of hand-overs
	// ha asked for (noteHandOver) whose takeOver has not ended; one that
	// ends closes moved too. Guarded by mu.
	handing int
	// polledAt is when rememberBuckets last began a list: the claims
	// waiting at once share one list a poll, since each list decodes
	// every bucket. Guarded by mu.
	polledAt time.Time
	// unhanded are the ended sessions, by identity, whose hand-over a
	// claim waited for in vain (awaitHandOvers): later claims wait for
	// them no more. One entry per such session, a few a crash. Guarded
	// by mu.
	unhanded map[string]bool
}

// newKubeBackend returns the backend of member id in g, its observer
// fresh; server, if not nil, answers the API server's release
// (serverVersion) (CheckServers), and requestTimeout bounds each request
// of request.
func newKubeBackend(g *group, id string, log *slog.Logger, server func(ctx context.Context) (*version.Info, error), requestTimeout time.Duration) *kubeBackend {
	return &kubeBackend{
		g: g, o: newObserver(g), id: id, log: log, server: server, requestTimeout: requestTimeout,
		sessions: map[ha.SessionID]*session{},
		buckets:  map[int]known{},
		members:  map[string]*coordinationv1.Lease{},
		wrote:    map[ha.SessionID]map[int]struct{}{},
	}
}

// kubeBackend is ha's Backend, with these of its optional capabilities:
// a request's bound, claim limits of its own, a server check, a history
// that always answers "cannot say", readings never short, and a
// hand-over in one write per bucket.
var (
	_ ha.Backend       = (*kubeBackend)(nil)
	_ ha.Requester     = (*kubeBackend)(nil)
	_ ha.ClaimLimiter  = (*kubeBackend)(nil)
	_ ha.ServerChecker = (*kubeBackend)(nil)
	_ ha.HistoryReader = (*kubeBackend)(nil)
	_ ha.Rounding      = (*kubeBackend)(nil)
	_ ha.TakeOver      = (*kubeBackend)(nil)
)

// minServerMinor is the oldest Kubernetes 1.x release the backend relies
// on: resourceVersions compare as integers from 1.35 on (claim positions).
const minServerMinor = 35

// CheckServers asks the API server its release, within the request
// timeout and ctx, and logs at Warn, once, if it is older than 1.35. A
// server it cannot ask is logged at Debug.
func (b *kubeBackend) CheckServers(ctx context.Context) {
	if b.server == nil {
		return
	}
	ctx, cancel := b.request(ctx)
	defer cancel()
	info, err := b.server(ctx)
	if err != nil {
		b.log.Debug("kube: asking the API server its release: " + err.Error())
		return
	}
	minor, _ := strconv.Atoi(strings.TrimRight(info.Minor, "+"))
	if info.Major == "1" && minor < minServerMinor && !b.warned.Swap(true) {
		b.log.Warn(fmt.Sprintf("kube: the API server runs %s; the backend needs 1.%d or later, whose resourceVersions compare as integers", info.GitVersion, minServerMinor))
	}
}

// serverVersion returns the server of newKubeBackend for the API server
// rc reaches: a GET of /version, which every authenticated user may make
// (Kubernetes' default system:public-info-viewer role), bounded by ctx.
func serverVersion(rc rest.Interface) func(ctx context.Context) (*version.Info, error) {
	return func(ctx context.Context) (*version.Info, error) {
		raw, err := rc.Get().AbsPath("/version").Do(ctx).Raw()
		if err != nil {
			return nil, err
		}
		var info version.Info
		if err := json.Unmarshal(raw, &info); err != nil {
			return nil, fmt.Errorf("kube: the API server's /version: %w", err)
		}
		return &info, nil
	}
}

// request returns a context bounded by the request timeout and parent.
// Every write and every read without a resourceVersion goes to etcd's
// quorum through the API server: nothing more is needed for one to reach
// the store's authority.
func (b *kubeBackend) request(parent context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(parent, b.requestTimeout)
}

// Request bounds a request by the request timeout (request), as ha's
// Requester says: ha reads and rewrites the member record, reads a
// peer's session and ends an old one through it, and a call whose answer
// never comes (a stream lost while the connection lives) must fail for
// ha to try again. A Claim alone takes parent back (claimParent): on
// Kubernetes a Claim of many names is a write for each of up to 256
// buckets, paced by the client's rate limiter, longer than one request's
// timeout, and it bounds each of those writes by the request timeout
// instead.
func (b *kubeBackend) Request(parent context.Context) (context.Context, context.CancelFunc) {
	return b.request(context.WithValue(parent, claimParent{}, parent))
}

// claimParent is the key under which Request keeps the context it was
// given, for Claim.
type claimParent struct{}

// Begin creates this replica's member Lease, carrying digest, for a new
// session (group.beginWith). If prev is a session of this backend not
// yet deleted, it is ended first as end ends one: its end mark written
// (session.markEnded), its entries removed (removeEntries), its Lease
// deleted (each guarded by its own last write, so only while it is
// still prev's): the record moves to the new session, and prev's
// holdings go with prev at once, in one batch of every feed (the caller
// begins from prev only once every controller of prev terminated, and
// its end of prev that follows answers ha.ErrSessionEnded); a mark or
// delete that fails otherwise (a timeout) fails Begin and keeps prev,
// for the next Begin from it. A
// member Lease of another session, or of prev no longer known here,
// refuses Begin with ha.ErrDuplicateID, unless this replica's observer
// proves it ended: a Lease it finds is stamped, and one found unchanged
// D after a stamp is deleted on condition of that version (observer.expire),
// and Begin creates its own. So a replica restarted after a crash, with
// no other replica running to prove its old session ended, begins once
// D has passed. ttl must not exceed the group's D, which the session
// has.
func (b *kubeBackend) Begin(ctx context.Context, prev ha.SessionID, ttl time.Duration, digest string) (ha.Session, error) {
	if ttl > b.g.duration {
		return ha.Session{}, fmt.Errorf("kube: a session of %v asked for, longer than the group's lease duration %v", ttl, b.g.duration)
	}
	if p := b.unfinished(prev); p != nil {
		rctx, cancel := b.request(ctx)
		err := p.markEnded(rctx)
		cancel()
		if err == nil {
			b.removeEntries(ctx, prev, p)
			rctx, cancel := b.request(ctx)
			err = p.end(rctx)
			cancel()
		}
		if err != nil && !errors.Is(err, errSessionLost) {
			// prev is kept: the next begin from it deletes its Lease
			// at once, rather than wait D to prove it ended.
			return ha.Session{}, fmt.Errorf("kube: ending the previous session to move the member record: %w", err)
		}
		b.forget(prev)
	}
	annotations := map[string]string{memberAnnotation: memberValue(b.id, digest, false)}
	for try := 0; ; try++ {
		rctx, cancel := b.request(ctx)
		s, valid, err := b.g.beginWith(rctx, b.id, annotations)
		cancel()
		if errors.Is(err, ha.ErrDuplicateID) && try == 0 {
			if ended, perr := b.proveMemberEnded(ctx); perr != nil {
				return ha.Session{}, fmt.Errorf("%w (proving it ended: %v)", err, perr)
			} else if ended {
				continue
			}
		}
		if err != nil {
			var failed *createFailed
			if errors.As(err, &failed) {
				b.dropUnanswered(ctx, failed.identity)
			}
			return ha.Session{}, err
		}
		id := idOf(s.identity)
		b.mu.Lock()
		b.sessions[id] = s
		b.mu.Unlock()
		joinedAt, _ := strconv.ParseInt(s.lease.ResourceVersion, 10, 64)
		return ha.Session{ID: id, Sent: valid.Add(-b.g.duration), JoinedAt: joinedAt}, nil
	}
}

// dropUnanswered deletes this replica's member Lease if a quorum read
// finds it under identity, the session of a begin whose create failed:
// the server may have carried the create out and its answer been lost.
// Nothing runs under that session, which begin never answered; left, it
// would refuse every begin of the ID until an observer proved it ended,
// D later, where ha's Backend leaves no session after a Begin that
// failed. The delete is guarded by the UID and resourceVersion read.
// Best effort, bounded as request's are and by ctx: what fails is logged
// at Debug, and the Lease is then left to the observers, as a crashed
// replica's is.
func (b *kubeBackend) dropUnanswered(ctx context.Context, identity string) {
	rctx, cancel := b.request(ctx)
	defer cancel()
	name := b.g.memberName(b.id)
	l, err := b.g.renewals.Get(rctx, name, metav1.GetOptions{})
	if err == nil && holder(l) != identity {
		return
	}
	if err == nil {
		uid, rv := l.UID, l.ResourceVersion
		err = b.g.renewals.Delete(rctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}})
	}
	if err != nil && !apierrors.IsNotFound(err) {
		b.log.Debug(fmt.Sprintf("kube: deleting %s, created by a begin whose answer was lost: %v", name, err))
	}
}

// proveMemberEnded reads this replica's member Lease, has the observer
// stamp it, and has it prove the session ended if that stamp is due
// (observer.expire). It answers whether the Lease's session is now
// ended, or the Lease gone. A Lease that carries its own session's end
// mark (an end whose delete failed) is deleted on condition of that
// version.
func (b *kubeBackend) proveMemberEnded(ctx context.Context) (bool, error) {
	rctx, cancel := b.request(ctx)
	defer cancel()
	l, err := b.g.leases.Get(rctx, b.g.memberName(b.id), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	identity := holder(l)
	b.o.see(l, time.Now())
	if endMarked(l) {
		// Its session ended, and said so; its Lease was left (end's
		// delete failed): deleted on condition of that version.
		uid, rv := l.UID, l.ResourceVersion
		err := b.g.leases.Delete(rctx, l.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}})
		if err != nil && !apierrors.IsNotFound(err) {
			return false, fmt.Errorf("kube: deleting %s, which its session marked ended: %w", l.Name, err)
		}
		return true, nil
	}
	return b.o.expire(rctx, identity)
}

// live returns session id if it is one of this backend's and neither
// lost nor ended as far as its own writes know, else nil.
func (b *kubeBackend) live(id ha.SessionID) *session {
	b.mu.Lock()
	s := b.sessions[id]
	b.mu.Unlock()
	if s == nil || s.stateErr() != nil {
		return nil
	}
	return s
}

// unfinished returns session id if it is one of this backend's that is
// live, or marked ended with its Lease not yet deleted (sessionEnding),
// else nil.
func (b *kubeBackend) unfinished(id ha.SessionID) *session {
	b.mu.Lock()
	s := b.sessions[id]
	b.mu.Unlock()
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != sessionLive && s.state != sessionEnding {
		return nil
	}
	return s
}

// forget removes session id from the backend's sessions.
func (b *kubeBackend) forget(id ha.SessionID) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.sessions, id)
	delete(b.wrote, id)
}

// ended returns the error of a call naming session id that is not live
// here: ha.ErrSessionEnded, with the session's own reason when it has one.
func (b *kubeBackend) ended(id ha.SessionID) error {
	b.mu.Lock()
	s := b.sessions[id]
	b.mu.Unlock()
	if s != nil {
		if err := s.stateErr(); errors.Is(err, errSessionLost) {
			b.forget(id)
			return fmt.Errorf("kube: session %x: %w: %w", int64(id), ha.ErrSessionEnded, err)
		}
	}
	b.forget(id)
	return fmt.Errorf("kube: session %x is not live here: %w", int64(id), ha.ErrSessionEnded)
}

// Renew writes the member Lease again (session.renew), and answers D: the
// session is valid until D past the request's send time, itself after
// the moment the caller took.
func (b *kubeBackend) Renew(ctx context.Context, id ha.SessionID) (time.Duration, error) {
	s := b.live(id)
	if s == nil {
		return 0, b.ended(id)
	}
	if _, err := s.renew(ctx); err != nil {
		if errors.Is(err, errSessionLost) {
			return 0, b.ended(id)
		}
		return 0, err
	}
	return b.g.duration, nil
}

// End ends session id in one change every other replica sees: it
// writes the session's end into its member Lease (session.markEnded),
// and every observer takes that version as the session's end at once
// and its feed delivers the member record, every holding and every
// chunk of the session gone in one batch at that version's position.
// Then, best effort, it removes the session's entries from every bucket
// it wrote them into or the feed showed it in (removeEntries),
// withdraws its published sets and deletes its member Lease
// (session.end): for the others none of it changes anything, the
// session being out of their view already; what fails is left (an
// entry of an ended session is free to all, and the member's next
// begin deletes a Lease left marked). So End answers nil once the mark
// is written; an error before it leaves the session as it was, and a
// mark lost to a timeout that landed makes the next End ha.ErrSessionEnded.
// The caller ends a session only once nothing runs under it.
func (b *kubeBackend) End(ctx context.Context, id ha.SessionID) error {
	s := b.unfinished(id)
	if s == nil {
		return b.ended(id)
	}
	if err := s.markEnded(ctx); err != nil {
		if errors.Is(err, errSessionLost) {
			return b.ended(id)
		}
		return err
	}
	b.removeEntries(ctx, id, s)
	if err := b.withdraw(ctx, publisherLabel+"="+memberHash(b.id)); err != nil {
		b.log.Debug(fmt.Sprintf("kube: withdrawing the sets of %s: %v", s.identity, err))
	}
	if err := s.end(ctx); err != nil {
		b.log.Debug(fmt.Sprintf("kube: deleting the member Lease of %s, which ended: %v", s.identity, err))
	}
	b.forget(id)
	return nil
}

// removeEntries removes session s's entries (id its session ID) from
// every bucket it wrote them into, and from every bucket the feed showed
// it in, each write bounded as request's are and by ctx; best effort: a
// bucket that fails is logged at Debug and left. s is marked ended
// (session.markEnded): its writes remove its own entries alone, and
// need no live session.
func (b *kubeBackend) removeEntries(ctx context.Context, id ha.SessionID, s *session) {
	b.mu.Lock()
	var buckets []int
	for i := range b.wrote[id] {
		buckets = append(buckets, i)
	}
	for i, k := range b.buckets {
		if _, ok := b.wrote[id][i]; ok || k.lease == nil {
			continue
		}
		if c, err := claimsOf(k.lease); err == nil && len(heldIn(c, s.identity)) > 0 {
			buckets = append(buckets, i)
		}
	}
	b.mu.Unlock()
	b.each(buckets, func(i int) {
		from := b.known(i)
		var names []string
		if from != nil && from.lease != nil {
			if c, err := claimsOf(from.lease); err == nil {
				names = heldIn(c, s.identity)
			}
		}
		if len(names) == 0 {
			return
		}
		rctx, cancel := b.request(ctx)
		res, err := b.g.change(rctx, b.o, i, claimChange{release: names}, writer{identity: s.identity}, from)
		cancel()
		if err != nil {
			b.log.Debug(fmt.Sprintf("kube: removing the entries of %s from bucket %d: %v", s.identity, i, err))
			return
		}
		b.remember(i, res.lease)
	})
}

// heldIn returns the names c gives to session identity, sorted.
func heldIn(c bucketClaims, identity string) []string {
	var names []string
	for n, e := range c {
		if e.session == identity {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	return names
}

// each calls f for every bucket of buckets, claimWorkers at a time, and
// returns when every call has.
func (b *kubeBackend) each(buckets []int, f func(i int)) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, claimWorkers)
	for _, i := range buckets {
		sem <- struct{}{}
		wg.Go(func() { // joined below
			defer func() { <-sem }()
			f(i)
		})
	}
	wg.Wait()
}

// PutMember writes the member record's value into the member Lease's
// annotation, by a write of the session (session.update), which renews
// it too. A session not live here answers not written, with
// ha.ErrSessionEnded.
func (b *kubeBackend) PutMember(ctx context.Context, id ha.SessionID, digest string, leaving bool) (bool, error) {
	s := b.live(id)
	if s == nil {
		return false, b.ended(id)
	}
	_, err := s.update(ctx, func(l *coordinationv1.Lease) {
		if l.Annotations == nil {
			l.Annotations = map[string]string{}
		}
		l.Annotations[memberAnnotation] = memberValue(b.id, digest, leaving)
	})
	if errors.Is(err, errSessionLost) {
		return false, b.ended(id)
	}
	return err == nil, err
}

// EnsureMember reads the member Lease and answers its session. Here the
// member record is the session: a session whose Lease is absent has been
// ended, and EnsureMember answers ha.ErrSessionEnded for id then, never
// writes.
func (b *kubeBackend) EnsureMember(ctx context.Context, id ha.SessionID, digest string) (ha.SessionID, bool, error) {
	under, found, err := b.MemberSession(ctx)
	if err != nil {
		return 0, false, err
	}
	if !found {
		return 0, false, b.ended(id)
	}
	return under, true, nil
}

// MemberSession reads this replica's member Lease with a quorum read and
// answers its session.
func (b *kubeBackend) MemberSession(ctx context.Context) (ha.SessionID, bool, error) {
	name := b.g.memberName(b.id)
	l, err := b.g.leases.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("kube: reading %s: %w", name, err)
	}
	return idOf(holder(l)), true, nil
}

// TimeLeft reads the member Lease with a quorum read: if it is still as
// the session's last write left it, the session lives until that write's
// send time + D (left, counted on this replica's clock), and granted is
// D. A version of the Lease older than that write (same UID, a smaller
// resourceVersion) counts as the same: the read was answered before a
// renewal of the session that was answered before the comparison, and
// every version between the create and the session's last write is one
// of its own, each guarded by the one before. A Lease gone or written by
// another since is ha.ErrSessionEnded.
//
// A session this backend never began (this replica's previous run, which
// a restart under the same ID finds holding its member Lease) is read by
// earlierLeft instead.
func (b *kubeBackend) TimeLeft(ctx context.Context, id ha.SessionID) (left, granted time.Duration, err error) {
	s := b.live(id)
	if s == nil {
		if b.began(id) {
			return 0, 0, b.ended(id)
		}
		return b.earlierLeft(ctx, id)
	}
	l, err := b.g.leases.Get(ctx, s.name, metav1.GetOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return 0, 0, fmt.Errorf("kube: reading %s: %w", s.name, err)
	}
	s.mu.Lock()
	same := err == nil && l.UID == s.lease.UID && (l.ResourceVersion == s.lease.ResourceVersion || (rvOf(l) > 0 && rvOf(l) < rvOf(s.lease)))
	valid := s.valid
	s.mu.Unlock()
	if !same {
		return 0, 0, fmt.Errorf("kube: %s was deleted or written by another: %w", s.name, ha.ErrSessionEnded)
	}
	return max(time.Until(valid), 0), b.g.duration, nil
}

// began reports whether session id is one this backend began and still
// keeps (live, lost or ending).
func (b *kubeBackend) began(id ha.SessionID) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.sessions[id] != nil
}

// earlierLeft reads how long session id of an earlier run of this
// replica (a process that had the same ID, crashed or was frozen, and
// whose member Lease a restart finds) lives unless renewed, as this
// backend's observer judges any silent member (observer): a quorum read
// of the member Lease stamps its version at receipt, the session lives
// until that stamp + D (left, of granted D), and once the version is due
// the observer deletes the Lease on condition of it (expire), which
// proves the session ended: ha.ErrSessionEnded, and begin may create the
// Lease anew; its read or delete finding the Lease gone meanwhile
// (another replica's observer proved the end first) is ha.ErrSessionEnded
// too, as the first read finding it gone is, never a later end. A version written since (the earlier run renews: it is a
// live duplicate, not a crashed run) is stamped anew, so left moves
// later by the time between the writes, which ha's restart wait counts
// as a renewal. The Lease found gone, of another session, or marked
// ended by its session is ha.ErrSessionEnded at once: begin then creates
// it, finds it under another session (a duplicate), or deletes a marked
// one (proveMemberEnded). A Lease deleted by someone else proves nothing
// of the earlier run's fence, but its holdings are judged by every
// observer's rule all the same (a bucket's entry of a session is free
// only once the observer counts it ended), so no name of it starts
// early. Sample, D = 5 s, the earlier run SIGKILLed at 10.0 just after
// a renewal, restarted at 11.0:
//
//	t = 11.2  read: rv 41 unchanged, stamped 11.2 → left 5.0 s
//	t = 11.7 … 15.7  reads every 0.5 s: rv 41 → left 4.5 … 0.5 s
//	t = 16.2  due: the quorum read shows rv 41, the delete on condition
//	          of it succeeds → ha.ErrSessionEnded; Join begins its session
//
// Had the earlier run been frozen rather than killed, its fence passed
// by 15.0 − Margin: its last renewal was sent before 10.0, and the
// stamp, 11.2, comes after that renewal's commit.
func (b *kubeBackend) earlierLeft(ctx context.Context, id ha.SessionID) (left, granted time.Duration, err error) {
	name := b.g.memberName(b.id)
	l, err := b.g.leases.Get(ctx, name, metav1.GetOptions{}) // no resourceVersion: a quorum read
	switch {
	case apierrors.IsNotFound(err):
		return 0, 0, fmt.Errorf("kube: session %x: %s is gone: %w", int64(id), name, ha.ErrSessionEnded)
	case err != nil:
		return 0, 0, fmt.Errorf("kube: reading %s: %w", name, err)
	}
	identity := holder(l)
	if idOf(identity) != id || endMarked(l) {
		return 0, 0, fmt.Errorf("kube: session %x: %s is under another session, or marked ended by its own: %w", int64(id), name, ha.ErrSessionEnded)
	}
	b.o.see(l, time.Now())
	if ended, err := b.o.expire(ctx, identity); err != nil {
		return 0, 0, err
	} else if ended {
		return 0, 0, fmt.Errorf("kube: session %x: proven ended by this replica's observer: %w", int64(id), ha.ErrSessionEnded)
	}
	if _, stamped := b.o.stampOf(identity); !stamped {
		// expire's read, or its delete, found the Lease gone or of
		// another session (another replica's observer proved the end
		// first): ha.ErrSessionEnded, as the read above finding it so. The
		// observer counts the session ending from that read, which is
		// no later end of a live session: answered as left, D past the
		// one answered before, ha would count it a renewal.
		return 0, 0, fmt.Errorf("kube: session %x: %s was found gone as this replica's observer proved its end: %w", int64(id), name, ha.ErrSessionEnded)
	}
	left, granted, known, ended := b.o.leftOf(id, time.Now())
	if ended || !known {
		// Not known: the Lease's holder is no session identity this
		// group's observer judges (sessionOf), which no begin writes.
		return 0, 0, fmt.Errorf("kube: session %x: %s is no session of this group's: %w", int64(id), name, ha.ErrSessionEnded)
	}
	return left, granted, nil
}

// ClaimCost is what a name adds to a bucket's claims, roughly: its bytes
// and a few for its session's index and token.
func (b *kubeBackend) ClaimCost(name string) int { return len(name) + 8 }

// The batches kubeBackend declares to ha's shared part (ClaimLimits),
// which hands Claim at most claimBatchNames names of at most
// claimBatchBytes bytes (ClaimCost) per call: a call costs one guarded write per bucket its
// names fall in, at most the group's B (256 unless set), plus a retry
// per conflict and a read per bucket whose version the backend has not
// seen, however many names it carries
// (TestBackendClaimCostsOneWritePerBucket). So a batch is as large as
// the buckets' room allows: etcd's 128 names a call would touch a
// hundred buckets each, a write for nearly every name. The room is a
// bucket's claims as a whole (maxClaimsBytes: 224 KiB, deflated and in
// base64, of the 256 KiB an object's annotations may hold), and a
// call's names spread over the buckets by their hash: 1 MiB puts about
// 4 KiB in each of 256 buckets, a fiftieth of its room; in a group of
// fewer buckets, 4 KiB a bucket. The count bounds one call's work (its
// decoding, its answer). A bucket that would overflow all the same
// fails the call with ha.ErrTooLarge, and the caller halves the batch.
const (
	claimBatchNames        = 20000
	claimBatchBytes        = 1 << 20
	claimBatchBytesABucket = 4 << 10
)

// claimBatch returns the most names and bytes (ClaimCost) one claim of
// the group takes: claimBatchNames, and claimBatchBytes or
// claimBatchBytesABucket per bucket if less.
func (g *group) claimBatch() (names, bytes int) {
	return claimBatchNames, min(claimBatchBytes, g.buckets*claimBatchBytesABucket)
}

// ClaimLimits lets one Claim carry many names (group.claimBatch): it
// costs one write per bucket its names fall in, not one per name.
func (b *kubeBackend) ClaimLimits() (names, bytes int) { return b.g.claimBatch() }

// Claim makes session id the holder of names: one change per bucket the
// names fall in (claimWorkers at a time), each starting from the version
// of the bucket the backend last saw (the feed's, or its own last
// write's) and reading it only after a conflict. It first waits for the
// buckets the survivors of a crash are handing over (awaitHandOvers), so
// that names handed to this session cost no write of its own; a bucket
// that gives it its names already is read with one list for the whole
// call (bucketsAgain). Each name is ours
// (written now, or found so), or another's, with its holder; a name held
// by a session this replica's observer judges ended is taken
// (bucketClaims.apply). There are no names to claim again here: every
// free name of a bucket is taken by that bucket's write. An error of any
// bucket fails the whole claim: the names written are found ours by the
// next.
//
// No entry is written under a session lost or ended as far as its own
// writes know, or past its validity (session.claimWriter). One sent
// before and committed while an observer deleted the session's Lease
// may land; so the answer is checked against the session's validity (the
// last renewal's send time + D) when it comes, and a claim answered past
// it fails: the caller's fence passed before, and the others take those
// names once their observers count the session ended.
//
// Each bucket's write is bounded by the request timeout, not the whole
// call: it runs under the context Request was given, when ctx is one of
// Request's. A name ours carries its bucket Lease's name as its Key and
// the bucket's leaseTransitions at the write that created the holding as
// its Token; another's carries its holder, and At, the bucket's
// resourceVersion read.
func (b *kubeBackend) Claim(ctx context.Context, id ha.SessionID, names []string) (got []ha.Claimed, absent []string, err error) {
	if parent, ok := ctx.Value(claimParent{}).(context.Context); ok {
		ctx = parent
	}
	s := b.live(id)
	if s == nil {
		return nil, nil, b.ended(id)
	}
	byBucket := map[int][]string{}
	for _, n := range names {
		i := bucketOf(n, b.g.buckets)
		byBucket[i] = append(byBucket[i], n)
	}
	b.awaitHandOvers(ctx, byBucket)
	again := b.bucketsAgain()
	var mu sync.Mutex
	var errs []error
	b.each(slices.Sorted(func(yield func(int) bool) {
		for i := range byBucket {
			if !yield(i) {
				return
			}
		}
	}), func(i int) {
		rctx, cancel := b.request(ctx) // each bucket's write on its own: the call is as long as its buckets take
		from := b.known(i)
		if from != nil {
			from.again = again
		}
		res, err := b.g.change(rctx, b.o, i, claimChange{claim: byBucket[i]}, s.claimWriter(), from)
		cancel()
		if err == nil {
			b.remember(i, res.lease)
			b.noteWrote(id, i)
		}
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			errs = append(errs, err)
			return
		}
		hdr := int64(0)
		if res.lease != nil {
			hdr = rvOf(res.lease)
		}
		for _, n := range byBucket[i] {
			if _, ok := res.got[n]; ok {
				got = append(got, ha.Claimed{Name: n, Mine: true, Revision: position(res.lease, res.got[n]), Key: b.g.bucketName(i), Token: res.got[n]})
				continue
			}
			e := res.claims[n]
			holderID, _ := identityID(e.session)
			got = append(got, ha.Claimed{Name: n, Revision: position(res.lease, e.token), Holder: holderID, Session: idOf(e.session), At: hdr})
		}
	})
	if err := errors.Join(errs...); err != nil {
		switch {
		case errors.Is(err, errSessionLost) || errors.Is(err, ha.ErrSessionEnded):
			return nil, nil, fmt.Errorf("kube: claiming under session %x: %w: %w", int64(id), ha.ErrSessionEnded, err)
		case errors.Is(err, errClaimsTooLarge):
			return nil, nil, fmt.Errorf("kube: a bucket Lease cannot take that many names at once: %w: %w", ha.ErrTooLarge, err)
		}
		return nil, nil, err
	}
	s.mu.Lock()
	valid := s.valid
	s.mu.Unlock()
	if !time.Now().Before(valid) {
		return nil, nil, fmt.Errorf("kube: the claim of %d names was answered after session %s's validity ended", len(names), s.identity)
	}
	return got, nil, nil
}

// bucketsAgain returns the known.again of one call's buckets: the first
// bucket that needs it lists every bucket Lease of the group, with one
// quorum list under that bucket's request context, and each bucket of
// the call finds its version there (nil: absent); a list that fails is
// tried again by the next. So a claim of names the buckets hold already
// (handed over by a survivor's takeOver, or claimed by an earlier call
// whose answer was lost) costs one request, not a read per bucket,
// which at the client's rate limit would take seconds. The list is sent
// after the call began, as each bucket's own read would be.
func (b *kubeBackend) bucketsAgain() func(ctx context.Context, name string) (*coordinationv1.Lease, error) {
	var mu sync.Mutex
	var listed map[string]*coordinationv1.Lease // guarded by mu: the listing, by Lease name, once made
	return func(ctx context.Context, name string) (*coordinationv1.Lease, error) {
		mu.Lock()
		defer mu.Unlock()
		if listed == nil {
			ls, err := b.g.listBuckets(ctx)
			if err != nil {
				return nil, err
			}
			listed = make(map[string]*coordinationv1.Lease, len(ls.Items))
			for i := range ls.Items {
				listed[ls.Items[i].Name] = &ls.Items[i]
			}
		}
		return listed[name], nil
	}
}

// noteWrote records that session id wrote entries into bucket i.
func (b *kubeBackend) noteWrote(id ha.SessionID, i int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.sessions[id] == nil {
		return
	}
	if b.wrote[id] == nil {
		b.wrote[id] = map[int]struct{}{}
	}
	b.wrote[id][i] = struct{}{}
}

// Release frees holding c of this replica: one change of the name's
// bucket that removes its entry only if it is still at c's position
// (claimChange.dropAt), whichever session holds it, so that a name held
// anew since, by anyone, is left alone (each holding of a name is at the
// resourceVersion of the write that created it). It needs no live
// session: the position names the holding. It is bounded by the request
// timeout and ctx.
func (b *kubeBackend) Release(ctx context.Context, c ha.Claim) error {
	ctx, cancel := b.request(ctx)
	defer cancel()
	i := bucketOf(c.Name, b.g.buckets)
	res, err := b.g.change(ctx, b.o, i, claimChange{dropAt: map[string]int64{c.Name: c.Revision}}, writer{identity: b.id}, b.known(i))
	if err != nil {
		return err
	}
	b.remember(i, res.lease)
	return nil
}

// known returns the latest version of bucket i the backend has seen, or
// nil when it has seen none.
func (b *kubeBackend) known(i int) *known {
	b.mu.Lock()
	defer b.mu.Unlock()
	k, ok := b.buckets[i]
	if !ok {
		return nil
	}
	return &k
}

// remember records l as bucket i's latest version seen, unless the
// backend has seen a later one (resourceVersions of one resource compare
// as integers). nil (nothing written to an absent bucket) is not
// recorded.
func (b *kubeBackend) remember(i int, l *coordinationv1.Lease) {
	if l == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if k, ok := b.buckets[i]; ok && k.lease != nil && rvOf(k.lease) > rvOf(l) {
		return
	}
	b.buckets[i] = known{lease: l}
	b.wakeLocked()
}

// wakeLocked closes moved, if a claim waits on it (bucketsMoved). b.mu
// is held.
func (b *kubeBackend) wakeLocked() {
	if b.moved != nil {
		close(b.moved)
		b.moved = nil
	}
}

// bucketsMoved returns a channel that the next remember closes.
func (b *kubeBackend) bucketsMoved() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.moved == nil {
		b.moved = make(chan struct{})
	}
	return b.moved
}

// rvOf returns l's resourceVersion as an integer, 0 if it is not one.
func rvOf(l *coordinationv1.Lease) int64 {
	rv, _ := strconv.ParseInt(l.ResourceVersion, 10, 64)
	return rv
}
