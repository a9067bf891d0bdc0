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

// Backend is one replica's access to its Store: what the package needs
// from a store to keep "each name on exactly one live replica", while
// placement, the fence, the claim slots, events, health, metrics and the
// placement page stay the package's own. A store is written against this
// interface and the contract below; the optional capabilities a backend
// may add, each an interface of this package with a default when absent,
// are [Requester], [ClaimLimiter], [ServerChecker], [HistoryReader],
// [Rounding] and [TakeOver]. The package documentation tells the model
// on etcd: there a lease is a session, a key a record (the member key a
// member record, a claim key a holding), and a revision a position.
// Examples
// of stores: github.com/bgctl/controller/ha/etcd (a lease per session,
// a key per record), github.com/bgctl/controller/ha/kube (a Lease object
// per session, names in bucket Leases), and
// github.com/bgctl/controller/ha/sim, the in-memory reference store,
// whose source is the contract in code. A Replica makes its backend
// once, in [New] (Store.Backend), and is its only caller. Its methods are
// safe for concurrent use; none starts a goroutine that outlives the
// call, but Watch, whose goroutines end once its Feed is stopped.
// github.com/bgctl/controller/ha/hatest holds the conformance suite every
// store must pass, and the test that runs it on a store of your own.
//
// # Records
//
// A group keeps three kinds of record: one member record per live
// replica (its ID, the digest of its names, whether it is leaving), one
// holding per name held (the name, its holder's ID and session), and the
// chunks of the name sets replicas publish (Publish). Every record but a
// chunk lives under one session, and goes when that session ends.
//
// # Sessions
//
// A replica's membership is a session, begun with its member record,
// renewed while the replica runs, and ended by End, by the store when no
// renewal came in time, or by anyone else. Every holding the replica
// makes lives under its session and goes with it. The replica keeps the
// fence: it counts each validity from a time taken before the request
// that obtained it (Session.Sent; Renew's caller takes its own), so the
// fence passes before the store can end the session, provided the
// backend never answers a validity longer than the store will keep the
// session (the package documentation, "Why no name runs on two replicas
// at once").
//
// A store without a server-side TTL carries expiry out itself, and
// answers for it: a session counts as ended only once its validity has
// run out on a clock that starts after the session's last renewal was
// committed, and its end must be an act (a write, a delete) that a
// renewal of the same session cannot also succeed past: both are
// conditional on the session's last version, so one of the two fails.
// Where: whichever comes first of the feed's own polling (a feed must
// deliver an end by the time it delivers a later position) and the
// readings (PeerLeft, TimeLeft) that find a session due. Kubernetes'
// observers (a guarded delete of a member Lease seen unchanged for its
// duration) are one example; a SQL store's is a conditional update or
// delete on the session row, deciding with the database's clock. A store
// that keeps each session's deadline itself, set by every renewal from
// that one clock, answers TimeLeft and PeerLeft as a server-side TTL
// does: the deadline less the time now on the same clock, and, when that
// reading is exact, a [Rounding] of 0.
//
// # Positions
//
// Every change of the group's records has a position, one int64 that
// only grows across the whole group, whichever record it changes, in the
// order the changes commit. The replica's view of the group stands at
// one position, and positions date its holdings (Claim.Revision,
// Claimed.At) and member records (Session.JoinedAt, the seniority Leader
// mode elects by): a backend answers positions of that one sequence,
// never a token per record. Examples: etcd's revision; on Kubernetes the
// resourceVersion of the group's Lease objects (comparable as integers
// across the objects of one resource type since 1.35); in SQL a
// per-group counter row updated inside each write transaction (a
// SEQUENCE does not do: its numbers are taken before commit, so two
// transactions may commit in the other order).
//
// # Errors
//
// [ErrSessionEnded] (wrapped) where a method says the store no longer
// knows the session; [ErrDuplicateID] (wrapped) from Begin;
// [ErrTooManyOps] and [ErrTooLarge] (wrapped) from Claim; any other
// error is the store's, transient: the caller tries again. Every
// request is bounded by its context; the caller makes the contexts of
// Claim, Release, Fetch and PeerLeft with Request (Requester, or
// RequestTimeout alone); List's context bounds the whole listing, and
// the store bounds each of its requests by RequestTimeout itself.
type Backend interface {
	// Begin starts a session of at least ttl and writes this replica's
	// member record under it, carrying digest (an opaque string): the
	// record is created if absent; if it is under prev, this replica's
	// previous session (0: none), it is moved to the new session, only
	// while it is still under prev. A record under any other session
	// (under any session at all when prev is 0) fails Begin with an error
	// wrapping ErrDuplicateID. The new session's JoinedAt is the position
	// that created the record; for a moved record, the position Begin
	// found it at under prev, or the move's (the replica reads JoinedAt
	// only after a first join, prev 0: see [HistoryReader]). A record
	// moved in place keeps its creation's position, its seniority, as
	// its Created (see ChangeKind). Begin need not end prev: prev may live
	// on, its holdings with it, until the replica ends it (End), or end
	// as its record moves (its holdings going with it at once, End then
	// answering ErrSessionEnded). The new session is valid until at
	// least Session.Sent + ttl: Sent is taken before the first request
	// that started it. On an error no session is left with the member
	// record (MemberSession finds none of a Begin that created it, and
	// the replica's next Begin is not refused): Begin ends the session it
	// started, best effort, even when that request's answer was lost. So
	// a backend whose request that starts a session may lose its answer
	// must know the session without that answer: an ID it chose before
	// sending, or one an earlier request of the same Begin answered.
	// Each of its requests is bounded by BackendConfig.RequestTimeout
	// and by ctx.
	Begin(ctx context.Context, prev SessionID, ttl time.Duration, digest string) (Session, error)

	// Renew renews session id once and answers valid: the session lives
	// until at least valid past the moment Renew was called. The caller
	// takes that moment before the call and extends the fence from it by
	// the shorter of valid and its TTL. ErrSessionEnded: the session
	// ended, for good. Bounded by ctx alone; it must reach the store's
	// authority (a write, or a read no replica's cache answers).
	Renew(ctx context.Context, id SessionID) (valid time.Duration, err error)

	// End ends session id now: its member record and every holding under
	// it go at once, in one change the others see. ErrSessionEnded: it
	// had ended already. Bounded by ctx alone (Leave's end waits as long
	// as Leave's context).
	End(ctx context.Context, id SessionID) error

	// PutMember rewrites this replica's member record, carrying digest
	// and marked leaving or not, only while it is under session id:
	// written is false when it is under another session, or there is
	// none; a store may answer ErrSessionEnded instead once id has
	// ended. Bounded by ctx alone.
	PutMember(ctx context.Context, id SessionID, digest string, leaving bool) (written bool, err error)

	// EnsureMember writes this replica's member record under session id,
	// carrying digest, if there is none, and returns the session the
	// record is under: id when it wrote it or found it under id (left as
	// it is), or another's, which may be 0 on a store that keeps records
	// outside any session (an etcd key put without a lease); found is
	// true when the record is there, written now or found, and false
	// only when the call leaves none (the replica takes the record as
	// its own only when found and under is id). ErrSessionEnded: id has
	// ended and
	// there is no record; when there is one, a store may answer its
	// session without looking at id, or ErrSessionEnded. Bounded by ctx
	// alone.
	EnsureMember(ctx context.Context, id SessionID, digest string) (under SessionID, found bool, err error)

	// MemberSession reads this replica's member record, and returns the
	// session it is under; found is false when there is none. Bounded by
	// ctx alone.
	MemberSession(ctx context.Context) (id SessionID, found bool, err error)

	// TimeLeft reads how long session id of this replica (its own, or
	// one of an earlier run: restart) lives unless renewed (left), and
	// the validity of its grant or last renewal (granted). left may be
	// short by the backend's Rounding (a second by default), never more,
	// of a session the store has seen every renewal of (see Rounding).
	// ErrSessionEnded: the session has ended. An earlier run's session
	// is one this backend never began (another process, with the same
	// ID, crashed or frozen): a store must read it, never answer
	// ErrSessionEnded for it while it may live, for the replica waits
	// in Join until it does and then begins. A store without a server
	// TTL answers it as PeerLeft does, from its own readings (its first
	// reading of the session's record starts its count), and carries
	// out the end before it says ErrSessionEnded, or finds the record
	// gone (another replica's proof, or a delete by hand, after which
	// the store holds the session's names until it counts the session
	// ended, as it would for any member); a renewal the earlier run
	// makes meanwhile moves the end it answers later, which tells the
	// replica a live duplicate. Bounded by ctx alone.
	TimeLeft(ctx context.Context, id SessionID) (left, granted time.Duration, err error)

	// PeerLeft reads, as TimeLeft does, how long another member's
	// session id lives unless renewed, and its validity: the replica
	// reads it to tell a session that runs out by itself, its holder
	// silent for half its validity or more, from one that may end early,
	// and GroupStatus shows it for every member. A store without a
	// server-side TTL answers from what it saw: granted the validity the
	// member last wrote, and left that validity less the time since it
	// saw that write, on its own monotonic clock; ErrSessionEnded once
	// the end was carried out. left may be short by the backend's
	// Rounding, never more, once the store has seen the session's last
	// renewal (one it reads from a lagging feed may be short of a renewal
	// it has not seen: see Rounding): the replica holds names until that
	// much past it (a longer answer only holds them longer). Bounded by
	// ctx alone.
	PeerLeft(ctx context.Context, id SessionID) (left, granted time.Duration, err error)

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
	// caller halves the batch. Any other error leaves the caller to
	// claim the same names again: a holding made by a request whose
	// answer was lost is found id's then. ctx bounds it; the caller
	// makes it with Request, and a backend whose Claim is a write per
	// record may bound each write by BackendConfig.RequestTimeout
	// instead of the whole call, within ctx's cancellation.
	Claim(ctx context.Context, id SessionID, names []string) (got []Claimed, absent []string, err error)

	// Release ends holding c of this replica, only while it is that
	// holding (its Revision): a name held anew since, by anyone, is left
	// alone. Its deletion comes in the feed at a position of its own
	// (Feed). ctx bounds it; the caller makes it with Request.
	Release(ctx context.Context, c Claim) error

	// Publish makes chunks (opaque bytes) this replica's published set of
	// names with digest, under session id, and then withdraws its set of
	// digest old: once Publish returns, the set of old is gone unless old
	// is digest. A digest of "" publishes nothing and withdraws every set
	// of this replica. The others read a set only once every chunk of it
	// has come, so the chunks may be written one request each; a call
	// that fails part way is made again whole, and a chunk written twice
	// changes nothing. The chunks live under session id and go with it.
	// ErrSessionEnded: id has ended. Each of its requests is bounded by
	// BackendConfig.RequestTimeout and by ctx.
	Publish(ctx context.Context, id SessionID, digest, old string, chunks [][]byte) error

	// Fetch reads the chunks member published of its set with digest,
	// directly (not waiting for the feed, which brings them too), and
	// the position it read them at: the feed brings every later change
	// of them. No chunk: nothing is published. ctx bounds it; the
	// caller makes it with Request.
	Fetch(ctx context.Context, member, digest string) (chunks []Chunk, at int64, err error)

	// List reads the group as it stands at one position: every member
	// record, holding and published chunk, as puts (Change), and the
	// position. A store may read it in pages, each at that position. Any
	// error fails it, the position forgotten by the store between pages
	// included: the caller lists again. ctx bounds it whole, and each of
	// its requests is bounded by BackendConfig.RequestTimeout as well.
	List(ctx context.Context) (records []Change, at int64, err error)

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
//     split between batches: a backend that carries out the end itself
//     (a store without server TTL) delivers the deletions it makes of it
//     so.
//   - A release deletes one holding at a position of its own: two or
//     more of a replica's own records deleted at one position are its
//     session's end. A store that releases several
//     holdings in one write must give each deletion a position of its
//     own, or the change must come to say which deletions are releases.
//   - A batch says the feed has delivered every change up to its
//     position, at: a batch without changes is progress alone. An idle
//     feed owes progress more often than BackendConfig.Window
//     (BackendConfig.RenewEvery is a good period): a Replica whose feed
//     delivered nothing for Window reports ErrWatchStalled from Health.
//
// A feed that fails delivers one batch with err set and nothing after
// it: the caller stops it and lists again, after a delay unless err
// wraps [ErrFeedSilent]. A feed whose store forgot the positions it
// must resume from (etcd's compaction, an API server's 410 Gone) fails
// so, and the caller's new listing starts it again. The feed keeps its
// own health: a stream silent for longer than BackendConfig.Window is
// given up with ErrFeedSilent.
type Feed interface {
	// Batches is where the feed delivers; the caller receives from it
	// until it stops the feed. The channel is never closed: a feed that
	// failed, or has nothing to say, holds it open until Stop.
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

// ChangeKind is what a change did, and says which of Change's fields it
// carries:
//
//	MemberPut   Member (the ID), Session, Created (the position that created the record: seniority), Digest, Leaving
//	MemberGone  Member; Session (the session the record was under) may be 0
//	ClaimPut    Name, Member (the holder's ID), Session, Created (the holding's Revision)
//	ClaimGone   Name; Member and Session (the holding that went) may be zero
//	ChunkPut    Chunk, its Data set
//	ChunkGone   Chunk, its Data nil
//
// A deletion needs only its position and the record's identity (the
// member's ID, the name, the chunk's member, digest, index and count):
// the replica knows the rest from its view. Every change
// carries At, its position (in a listing, the record's last write's). A
// member record moved from one session to the next (Begin from prev) is
// a MemberPut under the new session whose Created is the position that
// created the record: a store that moves the record in place keeps its
// first creation's, so the member keeps its seniority (etcd, sim); one
// that makes a new record for the new session answers the new record's.
// It is not the new session's JoinedAt.
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
// record as it stands (a put). Which fields a change carries depends on
// its Kind (ChangeKind).
type Change struct {
	Kind ChangeKind
	At   int64 // the change's position; in a listing, the record's last write's
	// Member is the member's ID (member changes) or the holder's (claim
	// changes); Name is the name (claim changes).
	Member, Name string
	// Session is the session the record is, or was, under; Created the
	// position that created it (puts of member records and holdings:
	// seniority in Leader mode, Claim.Revision).
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

// SessionID names one session of a backend; 0 names none. It never names
// two sessions of one group, an ended one included: a session that
// ended never lives again ([ErrSessionEnded]). The backend chooses it,
// the store's (an etcd lease's ID) or its own (a random positive number
// chosen before the request that starts the session, which lets Begin
// end a session whose answer was lost); on Kubernetes a hash of the
// session's identity.
type SessionID int64

// Session is one that Backend.Begin started.
type Session struct {
	ID   SessionID
	Sent time.Time // taken before the request that started the session: its validity counts from here
	// JoinedAt is the position at which Begin created the member
	// record, or, when it moved the record from prev, the position it
	// found it at (or the move's): see Backend.Begin.
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
