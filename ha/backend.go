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

// Backend is one replica's access to its Store: everything the package
// needs from a store to keep "each name on exactly one live replica",
// while placement, the fence, the claim slots, events, health, metrics
// and the placement page stay the package's own. Store in
// github.com/bgctl/controller/ha/etcd returns a Store of etcd backends,
// Store in github.com/bgctl/controller/ha/kube one on the Kubernetes API
// server. A Replica makes its backend once, in
// [New] (Store.Backend), and is its only caller. Its methods are safe for
// concurrent use; none starts a goroutine that outlives the call, but
// Watch, whose goroutines end once its Feed is stopped.
//
// Sessions: a replica's membership is a session, begun with its member
// record, renewed while the replica runs, and ended by End, by the store
// when no renewal came in time, or by anyone else. Every holding the
// replica makes lives under its session and goes with it. The replica
// keeps the fence: it counts each validity from a time taken before the
// request that obtained it (Session.Sent; Renew's caller takes its own),
// so the fence passes before the store can end the session, provided the
// backend never answers a validity longer than the store will keep the
// session (the package documentation, "Why no name runs on two replicas
// at once").
//
// Errors: [ErrSessionEnded] (wrapped) where a method says the store no
// longer knows the session; [ErrDuplicateID] (wrapped) from Begin;
// [ErrTooManyOps] and [ErrTooLarge] (wrapped) from Claim; any other error
// is the store's, transient: the caller tries again.
//
// Positions: every change of the group's records has a position, one
// int64 that only grows across the whole group, whichever record it
// changes: on etcd the revision; on Kubernetes the resourceVersion of the
// group's Lease objects, which Kubernetes 1.35 made comparable as
// integers across the objects of one resource type; in SQL a sequence.
// The replica's view of the group stands at one position, and positions
// date its holdings (Claim.Revision, Claimed.At) and member records
// (Session.JoinedAt, the seniority Leader mode elects by): a backend
// answers positions of that one sequence, never a token per record.
type Backend interface {
	// CheckServers asks the servers the backend reaches which release
	// they run and logs at Warn, once, the oldest that is too old for the
	// fence to hold. It returns within Options.RequestTimeout and does
	// not fail: a server it cannot ask is logged at Debug.
	CheckServers(ctx context.Context)

	// Request returns the context of one request that the store's
	// authority must answer (a write, a linearizable read), or one the
	// replica's listings send (a serializable page at a revision already
	// read), bounded by Options.RequestTimeout and by parent: a call
	// made with it whose answer never comes fails, for the replica to try
	// again. On etcd it also requires a leader, so that a member cut off
	// from its peers fails it at once and the client tries another.
	Request(parent context.Context) (context.Context, context.CancelFunc)

	// Begin starts a session of at least ttl and writes this replica's
	// member record under it, carrying digest (an opaque string): the record
	// is created if absent; if it is under prev, this replica's previous
	// session (0: none), it is moved to the new session, only while it is
	// still under prev. Any other session's record fails begin with an
	// error wrapping ErrDuplicateID. The new session is valid until at
	// least Session.Sent + ttl: Sent is taken before the request that
	// started it. On an error no session is left: Begin ends the one it
	// started, best effort. Each of its requests is bounded as Request's
	// are, and by ctx.
	Begin(ctx context.Context, prev SessionID, ttl time.Duration, digest string) (Session, error)

	// Renew renews session id once and answers valid: the session lives
	// until at least valid past the moment renew was called. The caller
	// takes that moment before the call and extends the fence from it by
	// the shorter of valid and its TTL. ErrSessionEnded: the session
	// ended, for good. Bounded by ctx alone; it must reach the store's
	// authority, as Request's requests do.
	Renew(ctx context.Context, id SessionID) (valid time.Duration, err error)

	// End ends session id now: its member record and every holding under
	// it go at once, in one change the others see. ErrSessionEnded: it
	// had ended already. Bounded by ctx alone (Leave's end waits as long
	// as Leave's context).
	End(ctx context.Context, id SessionID) error

	// PutMember rewrites this replica's member record, carrying digest
	// and marked leaving or not, only while it is under
	// session id: written is false when it is under another session, or
	// there is none, or id has ended (etcd answers so: its comparison
	// fails before the write names the lease); a store may answer
	// ErrSessionEnded instead. Bounded by ctx alone.
	PutMember(ctx context.Context, id SessionID, digest string, leaving bool) (written bool, err error)

	// EnsureMember writes this replica's member record under session id,
	// carrying digest, if there is none, and returns the session the
	// record is under: id when it wrote it or found it under id (left as
	// it is), or another's, which may be 0 on a store that keeps records
	// outside any session (etcd: a key put without a lease); found is
	// false when it saw no record. ErrSessionEnded: id has ended and
	// there is no record; when there is one, etcd answers its session
	// without looking at id, and a store may say ErrSessionEnded instead.
	// Bounded by ctx alone.
	EnsureMember(ctx context.Context, id SessionID, digest string) (under SessionID, found bool, err error)

	// Claim makes session id the holder of every one of names, all in
	// one request, if no session holds any of them; when some are held,
	// it reads them all instead. It returns the outcome of every name
	// held once it answers, by id (created now, or found so: an earlier
	// answer lost to a timeout) or by another session, and the names that
	// were free while others were not, to claim again. No holding is ever
	// made, or found id's, under a session that has ended: a store that
	// keeps an ended session's holdings until someone takes them over
	// answers ErrSessionEnded, or treats them as free. A holding's
	// Revision is the position the feed and List give it as Created: the
	// replica takes a running name's holding whose Created differs as
	// lost. A store that keeps names in several records (Kubernetes'
	// buckets) may claim each record's names on their own, a write per
	// record, and answer the outcome of each; such a write may take a
	// record's free names even while other names in it are held, so a
	// free name may come back held by id rather than among the free. A
	// request the store refuses as too many names fails with
	// ErrTooManyOps, one too large with ErrTooLarge (wrapped): the
	// caller halves the batch. ctx bounds it; the caller makes it with
	// Request, and a backend whose Claim is a write per record may bound
	// each write by Options.RequestTimeout instead of the whole call,
	// within ctx's cancellation.
	Claim(ctx context.Context, id SessionID, names []string) (got []Claimed, absent []string, err error)

	// ClaimCost is what one name adds to Claim's request, in bytes,
	// roughly: the caller keeps a batch within ClaimLimits' bytes.
	ClaimCost(name string) int

	// ClaimLimits returns how many names, and how many bytes of them
	// (ClaimCost), one Claim takes at most: the caller's batches stay
	// within both. A server that takes fewer answers ErrTooManyOps or
	// ErrTooLarge, and the caller halves its batches.
	ClaimLimits() (names, bytes int)

	// Release ends holding c of this replica, only while it is that
	// holding: a name held anew since, by anyone, is left alone. ctx
	// bounds it; the caller makes it with Request.
	Release(ctx context.Context, c Claim) error

	// MemberSession reads this replica's member record, and returns the
	// session it is under; found is false when there is none. Bounded by
	// ctx alone.
	MemberSession(ctx context.Context) (id SessionID, found bool, err error)

	// TimeLeft reads how long session id of this replica (its own, or
	// one of an earlier run: restart) lives unless renewed (left), and
	// the validity of its grant or last renewal (granted). left may be up
	// to a second short (etcd truncates it to whole seconds).
	// ErrSessionEnded: the session has ended. An earlier run's session
	// is one this backend never began (another process, with the same
	// ID, crashed or frozen): a store must read it, never answer
	// ErrSessionEnded for it while it may live, for the replica waits
	// in Join until it does and then begins. A store without a server
	// TTL answers it as PeerLeft does, from its own readings (its first
	// reading of the session's record starts its count), and proves the
	// end before it says ErrSessionEnded, or finds the record gone
	// (another replica's proof, or a delete by hand, after which the
	// store holds the session's names until it counts the session
	// ended, as it would for any member); a renewal the earlier run
	// makes meanwhile moves the end it answers later, which tells the
	// replica a live duplicate. Bounded by ctx alone.
	TimeLeft(ctx context.Context, id SessionID) (left, granted time.Duration, err error)

	// PeerLeft reads, as TimeLeft does, how long another member's
	// session id lives unless renewed, and its validity: the replica
	// reads it to tell a session that runs out by itself, its holder
	// silent for half its validity or more, from one that may end early,
	// and GroupStatus shows it for every member. The readings need
	// not come from a server-side TTL: a store without one (Kubernetes'
	// Leases) answers from what its observers saw, granted the validity
	// the member last wrote and left that validity less the time since
	// an observer saw the write, on the observer's monotonic clock, and
	// ErrSessionEnded once an observer proved the session ended. left
	// may be up to a second short, never more: the replica holds names
	// until a second past it (a longer answer only holds them longer).
	// Bounded by ctx alone.
	PeerLeft(ctx context.Context, id SessionID) (left, granted time.Duration, err error)

	// Publish makes chunks (opaque bytes) this replica's published set of
	// names with digest, under session id, and then withdraws its set of
	// digest old; a digest of "" publishes nothing and withdraws every
	// set of this replica. The others read a set only once every chunk
	// of it has come, so the chunks may be written one
	// request each; a call that fails part way is made again whole, and
	// a chunk written twice changes nothing. ErrSessionEnded: id has
	// ended. Each of its requests is bounded by Options.RequestTimeout
	// and by ctx.
	Publish(ctx context.Context, id SessionID, digest, old string, chunks [][]byte) error

	// Fetch reads the chunks member published of its set with digest,
	// directly (not waiting for the feed, which brings them too), and
	// the position it read them at: the feed brings every later change
	// of them. No chunk: nothing is published. ctx bounds it; the
	// caller makes it with Request.
	Fetch(ctx context.Context, member, digest string) (chunks []Chunk, at int64, err error)

	// List reads the group as it stands at one position: every member
	// record, holding and published chunk, as puts (change), and the
	// position. A store may read it in pages, each at that position. Any
	// error fails it, the position forgotten by the store between pages
	// included: the caller lists again. ctx bounds it whole, and each of
	// its requests is bounded by Options.RequestTimeout as well.
	List(ctx context.Context) (records []Change, at int64, err error)

	// HeldAt returns the names held at position at, one the store
	// answered earlier (Session.JoinedAt). An error when the store
	// cannot say any more (etcd: the revision compacted). Bounded as
	// List is.
	HeldAt(ctx context.Context, at int64) (names map[string]bool, err error)

	// Watch starts the feed of the group's changes after position from
	// (a listing's; changes at from itself may come again, and change
	// nothing). Its goroutines are counted in wg, and end once the
	// Feed's Stop has returned.
	Watch(from int64, wg *sync.WaitGroup) Feed
}

// Feed delivers the changes of the group's records, in the order of
// their positions, in batches (FeedBatch). Its contract, which the
// replica's rules for a session that ends early rely on:
//
//   - Every deletion that a session's end causes (its member record, its
//     holdings, its chunks) comes in one batch, at one position, never
//     split between batches: a backend that learns of the end otherwise
//     than by the store's own deletion (an observer's proof, on
//     Kubernetes) delivers the deletions it makes of it so.
//   - A release deletes one holding at a position of its own: two or
//     more of a replica's own records deleted at one position are its
//     session's end. A store that releases several
//     holdings in one write must give each deletion a position of its
//     own, or the change must come to say which deletions are releases.
//   - A batch says the feed has delivered every change up to its
//     position, at: a batch without changes is progress alone.
//
// A feed that fails delivers one batch with err set and nothing after
// it: the caller stops it and lists again, after a delay unless err
// wraps [ErrFeedSilent]. The feed keeps its own health (etcd: progress
// requests, and a watch silent for longer than BackendConfig.Window given
// up).
type Feed interface {
	// Batches is where the feed delivers; the caller receives from it
	// until it stops the feed.
	Batches() <-chan FeedBatch
	// Stop ends the feed; it is called once, by the caller.
	Stop()
}

// FeedBatch is one delivery of a feed.
type FeedBatch struct {
	Changes []Change // in the order of their positions
	At      int64    // every change up to this position has been delivered
	Err     error    // the feed failed: nothing comes after this batch
}

// ChangeKind is what a change did.
type ChangeKind uint8

const (
	MemberPut  ChangeKind = iota // a member record written
	MemberGone                   // a member record deleted
	ClaimPut                     // a name held
	ClaimGone                    // a holding ended
	ChunkPut                     // a chunk of a published set written
	ChunkGone                    // a chunk of a published set deleted
)

// Change is one change of the group's records, or, in a listing, one
// record as it stands (a put).
type Change struct {
	Kind ChangeKind
	At   int64 // the change's position; in a listing, the record's last write's
	// Member is the member's ID (member changes) or the holder's (claim
	// puts); Name is the name (claim changes).
	Member, Name string
	// Puts of member records and claims: the session the record is
	// under, and the position that created it (seniority in Leader mode,
	// Claim.Revision).
	Session SessionID
	Created int64
	Digest  string // member puts: the digest of its names ("": an earlier version's record)
	Leaving bool   // member puts: marked leaving
	Chunk   Chunk  // chunk changes; data nil on deletion
}

// Chunk is one chunk of a set of names a member published: chunk i of
// n of its set with digest.
type Chunk struct {
	Member, Digest string
	Index, Count   int
	Data           []byte
}

// SessionID names one session of a backend; 0 names none. On etcd it is
// the lease's ID.
type SessionID int64

// Session is one that Backend.Begin started.
type Session struct {
	ID   SessionID
	Sent time.Time // taken before the request that started the session: its validity counts from here
	// JoinedAt is the position at which the member record was written,
	// or found when it was moved.
	JoinedAt int64
}

// Claimed is the outcome of one name's claim (Backend.Claim).
type Claimed struct {
	Name string
	// Mine is true when the name is held under the session Claim was
	// called with: created now, or found so (an earlier answer lost).
	Mine bool
	// Revision is the position that created the holding: this session's
	// when Mine, else the other session's.
	Revision int64
	// Key and Token are the holding's Claim.Key and Claim.Token, when
	// Mine: what ClaimFrom gives the name's DoFunc and StopFunc.
	Key   string
	Token int64
	// Holder and Session are, when not Mine, the member that holds the
	// name and its session; "" when the backend did not read them.
	Holder  string
	Session SessionID
	// At is the position the outcome was read at (0: created now).
	At int64

	err error // set by the shared part alone: the request failed, try again later
}

// claim returns the holding c reports, when c.Mine.
func (c Claimed) claim() Claim {
	return Claim{Name: c.Name, Key: c.Key, Revision: c.Revision, Token: c.Token}
}

// ErrTooManyOps and ErrTooLarge are wrapped by Backend.Claim's error when
// the store refuses a request for holding too many names, or too many
// bytes: the same names in smaller batches would pass.
var (
	ErrTooManyOps = errors.New("ha: too many names in one request for the store")
	ErrTooLarge   = errors.New("ha: request too large for the store")
)

// ErrFeedSilent is wrapped by a feed's error when it gave up a stream
// that told it nothing, not even progress, for BackendConfig.Window: it
// waited long already, so the caller lists again at once.
var ErrFeedSilent = errors.New("ha: the feed was silent for too long")

// ErrSessionEnded is wrapped by a backend's error when the store no
// longer knows a session: it expired, or was ended (by this replica or by
// anyone else). A session that ended never lives again.
var ErrSessionEnded = errors.New("ha: session ended: the store no longer knows it")
