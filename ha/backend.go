// The seam between what every store needs (placement, the fence, slots,
// reconcile, events, health, metrics, the page) and the store that keeps
// the replicas' sessions: the contract a backend fulfils.

package ha

import (
	"context"
	"errors"
	"sync"
	"time"
)

// backend is the store a replica's group lives in, seen from the shared
// part of the package. Its methods are safe for concurrent use; none
// starts a goroutine that outlives the call, but watch, whose goroutines
// end once its feed is stopped.
//
// A replica's membership is a session: begun with its member record,
// renewed while the replica runs, and ended by end, by the store when no
// renewal came in time, or by anyone else. Every holding the replica
// makes lives under its session and goes with it. The shared part keeps
// the fence: it counts each validity from a time taken before the request
// that obtained it (begin's session.sent; renew's caller takes its own),
// so that the fence passes before the store can end the session (the
// package documentation, "Why no name runs on two replicas at once").
//
// Errors: errSessionEnded (wrapped) where a method says the store no
// longer knows the session; ErrDuplicateID (wrapped) from begin; any
// other error is the store's, transient: the caller may try again.
//
// Positions: every change of the group's records has a position, one
// int64 that only grows across the whole group, whichever record it
// changes: on etcd the revision; on Kubernetes the resourceVersion of the
// group's Lease objects, which Kubernetes 1.35 made comparable as
// integers across the objects of one resource type; in SQL a sequence.
// The view is at one (viewRev, listedRev), and they date a holding
// (claimView.rev, Claim.Revision, claimed.hdr) and a member record
// (session.joinedAt, seniority in Leader mode): a backend answers
// positions of that one sequence, never a token per record.
//
// The replica reaches its store only through this interface (etcd's is
// etcdBackend). Still etcd-typed in the shared part: the batch limits
// (maxClaimBatch, maxClaimBytes: etcd's defaults); Claim.Held, an etcd
// comparison; and the lease IDs the view, the epochs and the public
// types carry (clientv3.LeaseID, which a sessionID converts to and from
// one for one).
type backend interface {
	// checkServers asks the servers the backend reaches which release
	// they run and logs at Warn, once, the oldest that is too old for the
	// fence to hold. It returns within Options.RequestTimeout and does
	// not fail: a server it cannot ask is logged at Debug.
	checkServers(ctx context.Context)

	// request returns the context of one request that the store's
	// authority must answer (a write, a linearizable read), or one the
	// replica's listings send (a serializable page at a revision already
	// read), bounded by Options.RequestTimeout and by parent. On etcd it also requires a
	// leader, so that a member cut off from its peers fails it at once
	// and the client tries another.
	request(parent context.Context) (context.Context, context.CancelFunc)

	// begin starts a session of at least ttl and writes this replica's
	// member record under it, carrying digest (digestString): the record
	// is created if absent; if it is under prev, this replica's previous
	// session (0: none), it is moved to the new session, only while it is
	// still under prev. Any other session's record fails begin with an
	// error wrapping ErrDuplicateID. The new session is valid until at
	// least session.sent + ttl: sent is taken before the request that
	// started it. On an error no session is left: begin ends the one it
	// started, best effort. Each of its requests is bounded as request's
	// are, and by ctx.
	begin(ctx context.Context, prev sessionID, ttl time.Duration, digest string) (session, error)

	// renew renews session id once and answers valid: the session lives
	// until at least valid past the moment renew was called. The caller
	// takes that moment before the call and extends the fence from it by
	// the shorter of valid and its TTL. errSessionEnded: the session
	// ended, for good. Bounded by ctx alone; it must reach the store's
	// authority, as request's requests do.
	renew(ctx context.Context, id sessionID) (valid time.Duration, err error)

	// end ends session id now: its member record and every holding under
	// it go at once, in one change the others see. errSessionEnded: it
	// had ended already. Bounded by ctx alone (Leave's end waits as long
	// as Leave's context).
	end(ctx context.Context, id sessionID) error

	// putMember rewrites this replica's member record, carrying digest
	// and marked leaving or not (memberValue), only while it is under
	// session id: written is false when it is under another session, or
	// there is none, or id has ended (etcd answers so: its comparison
	// fails before the write names the lease); a store may answer
	// errSessionEnded instead. Bounded by ctx alone.
	putMember(ctx context.Context, id sessionID, digest string, leaving bool) (written bool, err error)

	// ensureMember writes this replica's member record under session id,
	// carrying digest, if there is none, and returns the session the
	// record is under: id when it wrote it or found it under id (left as
	// it is), or another's, which may be 0 on a store that keeps records
	// outside any session (etcd: a key put without a lease); found is
	// false when it saw no record. errSessionEnded: id has ended and
	// there is no record; when there is one, etcd answers its session
	// without looking at id, and a store may say errSessionEnded instead.
	// Bounded by ctx alone.
	ensureMember(ctx context.Context, id sessionID, digest string) (under sessionID, found bool, err error)

	// claim makes session id the holder of every one of names, all in
	// one request, if no session holds any of them; when some are held,
	// it reads them all instead. It returns the outcome of every name
	// held once it answers, by id (created now, or found so: an earlier
	// answer lost to a timeout) or by another session, and the names that
	// were free while others were not, to claim again. No holding is ever
	// made, or found id's, under a session that has ended: a store that
	// keeps an ended session's holdings until someone takes them over
	// answers errSessionEnded, or treats them as free. A request the
	// store refuses as too many names fails with errTooManyOps, one too
	// large with errTooLarge (wrapped): the caller halves the batch. ctx bounds it; the caller makes it with
	// request.
	claim(ctx context.Context, id sessionID, names []string) (got []claimed, absent []string, err error)

	// claimCost is what one name adds to claim's request, in bytes,
	// roughly: the caller keeps a batch below maxClaimBytes.
	claimCost(name string) int

	// release ends holding c of this replica, only while it is that
	// holding: a name held anew since, by anyone, is left alone. ctx
	// bounds it; the caller makes it with request.
	release(ctx context.Context, c Claim) error

	// memberSession reads this replica's member record, and returns the
	// session it is under; found is false when there is none. Bounded by
	// ctx alone.
	memberSession(ctx context.Context) (id sessionID, found bool, err error)

	// timeLeft reads how long session id of this replica (its own, or
	// one of an earlier run: restart) lives unless renewed (left), and
	// the validity of its grant or last renewal (granted). left may be up
	// to a second short (etcd truncates it to whole seconds; see
	// leaseAnswer.next). errSessionEnded: the session has ended. Bounded
	// by ctx alone.
	timeLeft(ctx context.Context, id sessionID) (left, granted time.Duration, err error)

	// peerLeft reads, as timeLeft does, how long another member's
	// session id lives unless renewed, and its validity: pollLeases reads
	// it to tell a session that runs out by itself, its holder silent
	// for half its validity or more, from one that may end early
	// (holdUntilLocked), and GroupStatus shows it for every member. The readings need
	// not come from a server-side TTL: a store without one (Kubernetes'
	// Leases) answers from what its observers saw, granted the validity
	// the member last wrote and left that validity less the time since
	// an observer saw the write, on the observer's monotonic clock, and
	// errSessionEnded once an observer proved the session ended. left
	// may be up to a second short, never long. Bounded by ctx alone.
	peerLeft(ctx context.Context, id sessionID) (left, granted time.Duration, err error)

	// publish makes chunks (encodeNames) this replica's published set of
	// names with digest, under session id, and then withdraws its set of
	// digest old; a digest of "" publishes nothing and withdraws every
	// set of this replica. The others read a set only once every chunk
	// of it has come (putChunkLocked), so the chunks may be written one
	// request each; a call that fails part way is made again whole, and
	// a chunk written twice changes nothing. errSessionEnded: id has
	// ended. Each of its requests is bounded by Options.RequestTimeout
	// and by ctx.
	publish(ctx context.Context, id sessionID, digest, old string, chunks [][]byte) error

	// fetch reads the chunks member published of its set with digest,
	// directly (not waiting for the feed, which brings them too), and
	// the position it read them at: the feed brings every later change
	// of them. No chunk: nothing is published. ctx bounds it; the
	// caller makes it with request.
	fetch(ctx context.Context, member, digest string) (chunks []setChunk, at int64, err error)

	// list reads the group as it stands at one position: every member
	// record, holding and published chunk, as puts (change), and the
	// position. A store may read it in pages, each at that position. Any
	// error fails it, the position forgotten by the store between pages
	// included: the caller lists again. ctx bounds it whole, and each of
	// its requests is bounded by Options.RequestTimeout as well.
	list(ctx context.Context) (records []change, at int64, err error)

	// heldAt returns the names held at position at, one the store
	// answered earlier (session.joinedAt). An error when the store
	// cannot say any more (etcd: the revision compacted). Bounded as
	// list is.
	heldAt(ctx context.Context, at int64) (names map[string]bool, err error)

	// watch starts the feed of the group's changes after position from
	// (a listing's; changes at from itself may come again, and change
	// nothing). Its goroutines are counted in wg, and end once the
	// feed's stop has returned.
	watch(from int64, wg *sync.WaitGroup) feed
}

// feed delivers the changes of the group's records, in the order of
// their positions, in batches (feedBatch). Its contract, which the early
// end rules rely on (endsLocked):
//
//   - Every deletion that a session's end causes (its member record, its
//     holdings, its chunks) comes in one batch, at one position, never
//     split between batches: a backend that learns of the end otherwise
//     than by the store's own deletion (an observer's proof, on
//     Kubernetes) delivers the deletions it makes of it so.
//   - A release deletes one holding at a position of its own: two or
//     more of a replica's own records deleted at one position are its
//     session's end (endsLocked). A store that releases several
//     holdings in one write must give each deletion a position of its
//     own, or the change must come to say which deletions are releases.
//   - A batch says the feed has delivered every change up to its
//     position, at: a batch without changes is progress alone.
//
// A feed that fails delivers one batch with err set and nothing after
// it: the caller stops it and lists again. The feed keeps its own health
// (etcd: progress requests, and a watch silent for too long given up,
// errFeedSilent).
type feed interface {
	// batches is where the feed delivers; the caller receives from it
	// until it stops the feed.
	batches() <-chan feedBatch
	// stop ends the feed; it is called once, by the caller.
	stop()
}

// feedBatch is one delivery of a feed.
type feedBatch struct {
	changes []change // in the order of their positions
	at      int64    // every change up to this position has been delivered
	err     error    // the feed failed: nothing comes after this batch
}

// changeKind is what a change did.
type changeKind uint8

const (
	memberPut  changeKind = iota // a member record written
	memberGone                   // a member record deleted
	claimPut                     // a name held
	claimGone                    // a holding ended
	chunkPut                     // a chunk of a published set written
	chunkGone                    // a chunk of a published set deleted
)

// change is one change of the group's records, or, in a listing, one
// record as it stands (a put).
type change struct {
	kind changeKind
	at   int64 // the change's position; in a listing, the record's last write's
	// member is the member's ID (member changes) or the holder's (claim
	// puts); name is the name (claim changes).
	member, name string
	// Puts of member records and claims: the session the record is
	// under, and the position that created it (seniority in Leader mode,
	// Claim.Revision).
	session sessionID
	created int64
	digest  string   // member puts: the digest of its names ("": an earlier version's record)
	leaving bool     // member puts: marked leaving
	chunk   setChunk // chunk changes; data nil on deletion
}

// setChunk is one chunk of a set of names a member published: chunk i of
// n of its set with digest.
type setChunk struct {
	member, digest string
	i, n           int
	data           []byte
}

// sessionID names one session of a backend; 0 names none. On etcd it is
// the lease's ID.
type sessionID int64

// session is one that backend.begin started.
type session struct {
	id   sessionID
	sent time.Time // taken before the request that started the session: its validity counts from here
	// joinedAt is the etcd revision at which the member record was
	// written, or found when it was moved (epoch.joinedAt). etcd's alone:
	// it goes when the feed is behind the seam.
	joinedAt int64
}

// errTooManyOps and errTooLarge are wrapped by backend.claim's error when
// the store refuses a request for holding too many names, or too many
// bytes: the same names in smaller batches would pass.
var (
	errTooManyOps = errors.New("ha: too many names in one request for the store")
	errTooLarge   = errors.New("ha: request too large for the store")
)

// errSessionEnded is wrapped by a backend's error when the store no
// longer knows a session: it expired, or was ended (by this replica or by
// anyone else). A session that ended never lives again.
var errSessionEnded = errors.New("ha: session ended: the store no longer knows it")
