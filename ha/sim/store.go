// The Store: one group's records, its sessions and their expiry, the log
// of its changes, and what a test reads of them.

package sim

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/bgctl/controller/ha"
)

// Store is one group's store, held in memory: what a server keeps for
// the replicas that share it. It is an [ha.Store]: pass a *Store to
// [ha.New] or [ha.Join] for every replica of the group. The zero value is
// an empty store, ready to use; a Store must not be copied once used.
//
// Its methods are safe for concurrent use. It starts no goroutine of its
// own: sessions expire on the goroutines of the replicas' feeds, at the
// moment their validity runs out, and on every request, so the store is
// exact under testing/synctest and never leaks a goroutine from a
// bubble. Its records live as long as the Store.
type Store struct {
	// ClaimLimit is how many names one Claim takes, as every backend of
	// the store declares it ([Backend.ClaimLimits]). Zero: 128. Set it
	// before the first replica is made.
	ClaimLimit int

	// RefuseAbove, if not zero, is how many names the store accepts in
	// one Claim, fewer than ClaimLimit declares: a larger Claim fails
	// with [ha.ErrTooManyOps] before the store acts, as a server set up
	// below its clients' limit answers. Zero: every Claim within
	// ClaimLimit is accepted. Set it before the first replica is made.
	RefuseAbove int

	mu sync.Mutex
	// Everything below is guarded by mu, and made by initLocked on
	// first use.
	next     ha.SessionID              // the last session ID given
	rev      int64                     // the position of the last write: one more at every write
	sessions map[ha.SessionID]*session // the live sessions
	members  map[string]member         // member records, by replica ID
	claims   map[string]holding        // holdings, by name
	chunks   map[chunkKey]chunk        // published chunks
	past     []pastHolding             // every holding that ended, in order, for HeldAt
	log      []ha.FeedBatch            // every write's changes, a batch per position, for the feeds, from the position after compacted
	compact  int64                     // the history before this position is forgotten (Compact): HeldAt and feeds from earlier fail
	ended    []SessionEnd              // every session ended, in order
	requests map[Op]int                // requests that reached the store, by operation
	backends map[string][]*Backend     // every backend made, by replica ID
	cut      map[string]bool           // replicas partitioned off
	paused   map[string]bool           // replicas paused
	faults   []fault                   // one-shot faults not met yet, in the order injected
	// wake is closed, and replaced, at every write, every expiry and
	// every change of a replica's link to the store: what a waiting
	// feed or request waits on.
	wake chan struct{}
}

var _ ha.Store = (*Store)(nil)

// session is one live session as the store has it.
type session struct {
	member  string        // the replica whose session it is
	ttl     time.Duration // its validity from each renewal
	granted time.Time     // when the store began it or last renewed it
}

// expires returns when the session ends unless renewed.
func (l *session) expires() time.Time { return l.granted.Add(l.ttl) }

// member is a member record.
type member struct {
	session  ha.SessionID
	digest   string
	leaving  bool
	created  int64 // the position that created it: kept when it is moved or written again
	modified int64 // the position of its last write
}

// holding is one name's holding.
type holding struct {
	session ha.SessionID
	holder  string // the holder's replica ID
	created int64  // the position that created it
}

// pastHolding is a holding that ended: name was held from position from
// until position to.
type pastHolding struct {
	name     string
	from, to int64
}

// chunkKey names a published chunk: chunk i of n of member's set with
// digest.
type chunkKey struct {
	member, digest string
	i, n           int
}

// chunk is a published chunk.
type chunk struct {
	session  ha.SessionID
	data     []byte
	modified int64 // the position that wrote it
}

// claimKeyPrefix is what a holding's ha.Claim.Key holds before the name.
const claimKeyPrefix = "claims/"

// defaultClaimLimit is ClaimLimit when it is 0: etcd's default
// transaction size, which package ha's batches were tuned for.
const defaultClaimLimit = 128

// defaultRequestTimeout bounds a backend's requests when its
// BackendConfig gives no RequestTimeout.
const defaultRequestTimeout = 2 * time.Second

// Backend returns the backend of the replica c describes. It sends
// nothing and starts no goroutine. A zero c.RequestTimeout is 2s; a zero
// c.RenewEvery is a quarter of c.TTL, or a second without a TTL.
func (s *Store) Backend(c ha.BackendConfig) (ha.Backend, error) {
	return s.backend(c), nil
}

// backend is Backend, typed.
func (s *Store) backend(c ha.BackendConfig) *Backend {
	c.RequestTimeout = cmp.Or(c.RequestTimeout, defaultRequestTimeout)
	c.RenewEvery = cmp.Or(c.RenewEvery, c.TTL/4, time.Second)
	b := &Backend{st: s, cfg: c}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.initLocked()
	s.backends[c.ID] = append(s.backends[c.ID], b)
	return b
}

// initLocked makes the maps of a zero Store.
func (s *Store) initLocked() {
	if s.wake != nil {
		return
	}
	s.sessions = map[ha.SessionID]*session{}
	s.members = map[string]member{}
	s.claims = map[string]holding{}
	s.chunks = map[chunkKey]chunk{}
	s.requests = map[Op]int{}
	s.backends = map[string][]*Backend{}
	s.cut = map[string]bool{}
	s.paused = map[string]bool{}
	s.wake = make(chan struct{})
}

// wakeLocked wakes every feed and request that waits on the store.
func (s *Store) wakeLocked() {
	close(s.wake)
	s.wake = make(chan struct{})
}

// SessionEnd is one session the store ended ([Store.Ended]).
type SessionEnd struct {
	Replica string       // the replica whose session it was
	Session ha.SessionID // the session
	At      time.Time    // when the store ended it
	Reason  EndReason    // why
}

// String returns "<replica> <session> <reason>", as "r1 2 expired".
func (e SessionEnd) String() string {
	return fmt.Sprintf("%s %d %v", e.Replica, e.Session, e.Reason)
}

// EndReason is why the store ended a session.
type EndReason uint8

const (
	// Expired: no renewal reached the store within the session's
	// validity (a crash, a partition, a pause).
	Expired EndReason = iota
	// Ended: its replica ended it (Leave, or a Begin that failed and
	// cleaned up after itself).
	Ended
	// EndedEarly: the test ended it before its validity ran out
	// ([Store.EndSession]).
	EndedEarly
)

// String returns "expired", "ended" or "ended early".
func (r EndReason) String() string {
	switch r {
	case Expired:
		return "expired"
	case Ended:
		return "ended"
	case EndedEarly:
		return "ended early"
	}
	return fmt.Sprintf("EndReason(%d)", uint8(r))
}

// Ended returns every session the store has ended so far, in the order
// it ended them.
func (s *Store) Ended() []SessionEnd {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.initLocked()
	s.expireLocked(time.Now())
	return append([]SessionEnd(nil), s.ended...)
}

// Expires returns when the session of replica id ends unless it is
// renewed: the session its member record is under. ok is false when the
// replica has no member record, or no live session.
func (s *Store) Expires(id string) (at time.Time, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.initLocked()
	s.expireLocked(time.Now())
	m, found := s.members[id]
	l := s.sessions[m.session]
	if !found || l == nil {
		return time.Time{}, false
	}
	return l.expires(), true
}

// Holder returns the replica that holds name now, and whether anyone
// does.
func (s *Store) Holder(name string) (replica string, held bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.initLocked()
	s.expireLocked(time.Now())
	h, held := s.claims[name]
	return h.holder, held
}

// Requests returns how many requests of op have reached the store so
// far, whatever their outcome; a request a partition dropped, or that
// ended while paused, never reached it.
func (s *Store) Requests(op Op) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.initLocked()
	return s.requests[op]
}

// expireLocked ends every session whose validity has run out at now, as
// a server whose TTL ran out does. Each ends as of the moment its
// validity ran out, which is when it ended (nothing read or wrote the
// store since, or the session would have ended then), even when no feed
// ran to end it on time; in the order they ran out, and those that ran
// out at one instant in the order of their IDs, not the map's, so that
// a test sees the same positions on every run.
func (s *Store) expireLocked(now time.Time) {
	var expired []ha.SessionID
	for id, l := range s.sessions {
		if !now.Before(l.expires()) {
			expired = append(expired, id)
		}
	}
	slices.SortFunc(expired, func(a, b ha.SessionID) int {
		return cmp.Or(s.sessions[a].expires().Compare(s.sessions[b].expires()), cmp.Compare(a, b))
	})
	for _, id := range expired {
		s.endLocked(id, s.sessions[id].expires(), Expired)
	}
}

// nextExpiryLocked returns how long after now the first live session
// expires unless renewed, and false when none lives.
func (s *Store) nextExpiryLocked(now time.Time) (time.Duration, bool) {
	var first time.Time
	for _, l := range s.sessions {
		if first.IsZero() || l.expires().Before(first) {
			first = l.expires()
		}
	}
	return first.Sub(now), !first.IsZero()
}

// endLocked ends live session id: its member record (if it is under
// it), its holdings and its chunks go at one new position, in one batch.
func (s *Store) endLocked(id ha.SessionID, now time.Time, why EndReason) {
	l := s.sessions[id]
	delete(s.sessions, id)
	s.rev++
	var gone []ha.Change
	if s.members[l.member].session == id {
		delete(s.members, l.member)
		gone = append(gone, ha.Change{Kind: ha.MemberGone, Member: l.member})
	}
	for _, name := range slices.Sorted(maps.Keys(s.claims)) {
		if h := s.claims[name]; h.session == id {
			s.dropHoldingLocked(name, h)
			gone = append(gone, ha.Change{Kind: ha.ClaimGone, Name: name})
		}
	}
	for _, k := range s.chunkKeysLocked() {
		if s.chunks[k].session == id {
			delete(s.chunks, k)
			gone = append(gone, ha.Change{Kind: ha.ChunkGone, Chunk: k.chunk(nil)})
		}
	}
	s.emitLocked(gone...)
	s.ended = append(s.ended, SessionEnd{Replica: l.member, Session: id, At: now, Reason: why})
}

// liveLocked fails with ha.ErrSessionEnded unless session id lives.
func (s *Store) liveLocked(id ha.SessionID) error {
	if _, ok := s.sessions[id]; !ok {
		return fmt.Errorf("sim: session %d: %w", id, ha.ErrSessionEnded)
	}
	return nil
}

// dropHoldingLocked ends holding h of name at the current position.
func (s *Store) dropHoldingLocked(name string, h holding) {
	delete(s.claims, name)
	s.past = append(s.past, pastHolding{name: name, from: h.created, to: s.rev})
}

// emitLocked logs changes as the batch of the current position, and
// wakes the feeds. A write that changed nothing logs nothing.
func (s *Store) emitLocked(changes ...ha.Change) {
	if len(changes) == 0 {
		return
	}
	for i := range changes {
		changes[i].At = s.rev
	}
	s.log = append(s.log, ha.FeedBatch{Changes: changes, At: s.rev})
	s.wakeLocked()
}

// put is the change that writes m, the record of member id.
func (m member) put(id string) ha.Change {
	return ha.Change{Kind: ha.MemberPut, At: m.modified, Member: id, Session: m.session, Created: m.created, Digest: m.digest, Leaving: m.leaving}
}

// chunk is the chunk k names, holding data.
func (k chunkKey) chunk(data []byte) ha.Chunk {
	return ha.Chunk{Member: k.member, Digest: k.digest, Index: k.i, Count: k.n, Data: data}
}

// chunkKeysLocked returns the keys of the published chunks in one order
// (by member, digest, count and index), not the map's: what the store
// answers and delivers comes in the same order on every run of a test.
func (s *Store) chunkKeysLocked() []chunkKey {
	return slices.SortedFunc(maps.Keys(s.chunks), func(a, b chunkKey) int {
		return cmp.Or(cmp.Compare(a.member, b.member), cmp.Compare(a.digest, b.digest), cmp.Compare(a.n, b.n), cmp.Compare(a.i, b.i))
	})
}
