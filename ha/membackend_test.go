// A backend held in memory, for the conformance suite and for whole
// replicas under testing/synctest: sessions that expire on the clock of
// the goroutine's bubble (exact and instant there), and faults injected
// per call.

package ha

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// memStore is one group's store, shared by the memBackends of its
// replicas: what a server keeps.
type memStore struct {
	mu       sync.Mutex
	next     SessionID                // the last session ID given; guarded by mu
	sessions map[SessionID]*memLease  // live sessions, and ended ones until reaped; guarded by mu
	members  map[string]memMember     // member records, by replica ID; guarded by mu
	claims   map[string]memClaim      // holdings, by name; guarded by mu
	chunks   map[memChunkKey]memChunk // published chunks; guarded by mu
	past     []memHeld                // holdings that ended, in order, for heldAt; guarded by mu
	// log is every write's changes, a batch per revision, for the
	// feeds; grew is closed, and replaced, at each batch. Guarded by mu.
	log    []FeedBatch
	grew   chan struct{}
	rev    int64               // the store's revision: one more at every write; guarded by mu
	faults map[string]memFault // by operation ("begin", "renew", …); guarded by mu
	cut    map[string]bool     // replicas cut off: their calls never arrive (partition); guarded by mu
	ended  []string            // each session ended, in order ("<member> <id> expired|ended"); guarded by mu
	// claimLimit is the names one Claim takes (ClaimLimits): etcd's
	// maxClaimBatch if 0; set before any replica is made. claimCalls
	// counts the Claims that reached the store; guarded by mu.
	claimLimit int
	claimCalls int
	// claimMax, if not 0, is the names one Claim may carry, fewer than
	// ClaimLimits declares: a Claim of more fails with ErrTooManyOps
	// before the store acts, as etcd started with a lower --max-txn-ops
	// answers. Set before any replica is made.
	claimMax int
}

// memLease is one session as the store has it.
type memLease struct {
	member  string        // the replica whose session it is
	ttl     time.Duration // its validity from each renewal
	granted time.Time     // when the store last renewed it (or began it)
}

// memMember is a member record.
type memMember struct {
	session  SessionID
	digest   string
	leaving  bool
	created  int64 // the revision that created it: kept when it is moved or written again
	modified int64 // the revision of its last write
}

// memHeld is a holding that ended: name was held from revision from
// until revision to.
type memHeld struct {
	name     string
	from, to int64
}

// memClaim is one name's holding.
type memClaim struct {
	session SessionID
	holder  string // the holder's replica ID
	rev     int64  // the revision that created it
}

// memChunkKey names a published chunk, as etcd's key does.
type memChunkKey struct {
	member, digest string
	i, n           int
}

// memChunk is a published chunk.
type memChunk struct {
	session  SessionID
	data     []byte
	modified int64 // the revision that wrote it
}

// memClaimPrefix is what Claim.Key holds before the name.
const memClaimPrefix = "claims/"

// memFault is what the store does to a call of one operation.
type memFault struct {
	// err fails the call before the store acts: a request that never
	// arrived.
	err error
	// lost makes the store act and the caller get an error: an answer
	// that never came back.
	lost bool
	// delay holds the answer back this long after the store acted.
	delay time.Duration
	// once removes the fault after the next call it meets.
	once bool
}

func newMemStore() *memStore {
	return &memStore{
		sessions: map[SessionID]*memLease{},
		members:  map[string]memMember{},
		claims:   map[string]memClaim{},
		chunks:   map[memChunkKey]memChunk{},
		grew:     make(chan struct{}),
		faults:   map[string]memFault{},
		cut:      map[string]bool{},
	}
}

// partition cuts replica id off from the store, or heals the cut: while
// it is cut, its calls fail before they reach the store, and its
// session, no longer renewed, expires. Its feed goes on delivering.
func (s *memStore) partition(id string, cut bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cut[id] = cut
}

// inject makes every later call of op meet f; a zero f removes it.
func (s *memStore) inject(op string, f memFault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if f == (memFault{}) {
		delete(s.faults, op)
		return
	}
	s.faults[op] = f
}

// replica returns the backend of replica id, its requests bounded by
// timeout.
func (s *memStore) replica(id string, timeout time.Duration) *memBackend {
	return &memBackend{st: s, id: id, timeout: timeout}
}

// Backend returns the backend of the Replica c describes: a memStore is
// a Store.
func (s *memStore) Backend(c BackendConfig) (Backend, error) {
	return &memBackend{st: s, id: c.ID, timeout: c.RequestTimeout}, nil
}

// reapLocked ends every session whose validity has passed at now, and
// deletes its member record, as a server whose TTL ran out does.
func (s *memStore) reapLocked(now time.Time) {
	for id, l := range s.sessions {
		if !now.Before(l.granted.Add(l.ttl)) {
			s.endLocked(id, "expired")
		}
	}
}

func (s *memStore) endLocked(id SessionID, why string) {
	l := s.sessions[id]
	delete(s.sessions, id)
	s.rev++ // the session's record and holdings go in one revision
	var gone []Change
	if s.members[l.member].session == id {
		delete(s.members, l.member)
		gone = append(gone, Change{Kind: MemberGone, Member: l.member})
	}
	for name, c := range s.claims {
		if c.session == id {
			s.dropClaimLocked(name, c)
			gone = append(gone, Change{Kind: ClaimGone, Name: name})
		}
	}
	for k, c := range s.chunks {
		if c.session == id {
			delete(s.chunks, k)
			gone = append(gone, Change{Kind: ChunkGone, Chunk: k.chunk(nil)})
		}
	}
	s.emitLocked(gone...)
	s.ended = append(s.ended, fmt.Sprintf("%s %d %s", l.member, id, why))
}

// call runs op's store side, act, under the store's lock, with op's
// fault: it fails before act, or loses or delays act's answer. A call of
// a replica cut off (partition) fails before act, whatever op's fault.
func (s *memStore) call(ctx context.Context, who, op string, act func(now time.Time) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	if s.cut[who] {
		s.mu.Unlock()
		return fmt.Errorf("ha: %s's %s never reached the store (partitioned)", who, op)
	}
	f := s.faults[op]
	if f.once {
		delete(s.faults, op)
	}
	if f.err != nil {
		s.mu.Unlock()
		return f.err
	}
	now := time.Now()
	s.reapLocked(now)
	err := act(now)
	s.mu.Unlock()
	if f.delay > 0 {
		t := time.NewTimer(f.delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if f.lost {
		return fmt.Errorf("ha: the answer to %s was lost (injected)", op)
	}
	return err
}

// memBackend is one replica's view of a memStore.
type memBackend struct {
	st      *memStore     // immutable
	id      string        // immutable: Options.ID
	timeout time.Duration // immutable: Options.RequestTimeout
}

var _ Backend = (*memBackend)(nil)

func (b *memBackend) CheckServers(context.Context) {}

func (b *memBackend) Request(parent context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(parent, b.timeout)
}

// Begin starts a session and writes the member record as etcd's does:
// created if absent, moved from prev while it is under prev, and any
// other session's record refused. On an error after the store started
// the session (an answer lost or held back past ctx) it ends it, best
// effort, as etcd's ends the lease whose member write failed.
func (b *memBackend) Begin(ctx context.Context, prev SessionID, ttl time.Duration, digest string) (Session, error) {
	sent := time.Now()
	var s Session
	err := b.st.call(ctx, b.id, "begin", func(now time.Time) error {
		if held, ok := b.st.members[b.id]; ok && held.session != prev {
			return fmt.Errorf("%w: member %q held by session %d", ErrDuplicateID, b.id, held.session)
		}
		b.st.next++
		b.st.rev++
		s = Session{ID: b.st.next, Sent: sent, JoinedAt: b.st.rev}
		b.st.sessions[s.ID] = &memLease{member: b.id, ttl: ttl, granted: now}
		m := memMember{session: s.ID, digest: digest, created: b.st.rev, modified: b.st.rev}
		if held, ok := b.st.members[b.id]; ok {
			m.created = held.created // moved: joinedAt is where it was found, as etcd's
			s.JoinedAt = b.st.rev - 1
		}
		b.st.members[b.id] = m
		b.st.emitLocked(m.put(b.id))
		return nil
	})
	if err != nil && s.ID != 0 {
		ectx, cancel := context.WithTimeout(context.Background(), b.timeout)
		defer cancel()
		_ = b.End(ectx, s.ID)
		return Session{}, err
	}
	return s, err
}

func (b *memBackend) Renew(ctx context.Context, id SessionID) (time.Duration, error) {
	var valid time.Duration
	err := b.st.call(ctx, b.id, "renew", func(now time.Time) error {
		l, ok := b.st.sessions[id]
		if !ok {
			return fmt.Errorf("%w: session %d", ErrSessionEnded, id)
		}
		l.granted, valid = now, l.ttl
		return nil
	})
	return valid, err
}

func (b *memBackend) End(ctx context.Context, id SessionID) error {
	return b.st.call(ctx, b.id, "end", func(time.Time) error {
		if _, ok := b.st.sessions[id]; !ok {
			return fmt.Errorf("%w: session %d", ErrSessionEnded, id)
		}
		b.st.endLocked(id, "ended")
		return nil
	})
}

func (b *memBackend) MemberSession(ctx context.Context) (SessionID, bool, error) {
	var id SessionID
	var found bool
	err := b.st.call(ctx, b.id, "memberSession", func(time.Time) error {
		var m memMember
		m, found = b.st.members[b.id]
		id = m.session
		return nil
	})
	return id, found, err
}

func (b *memBackend) TimeLeft(ctx context.Context, id SessionID) (left, granted time.Duration, err error) {
	err = b.st.call(ctx, b.id, "timeLeft", func(now time.Time) error {
		l, ok := b.st.sessions[id]
		if !ok {
			return fmt.Errorf("%w: session %d", ErrSessionEnded, id)
		}
		left, granted = l.granted.Add(l.ttl).Sub(now), l.ttl
		return nil
	})
	return left, granted, err
}

// PeerLeft reads another's session as timeLeft does: the store keeps
// every session's time.
func (b *memBackend) PeerLeft(ctx context.Context, id SessionID) (left, granted time.Duration, err error) {
	return b.TimeLeft(ctx, id)
}

// live fails with errSessionEnded unless session id lives. Under mu.
func (s *memStore) liveLocked(id SessionID) error {
	if _, ok := s.sessions[id]; !ok {
		return fmt.Errorf("%w: session %d", ErrSessionEnded, id)
	}
	return nil
}

func (b *memBackend) PutMember(ctx context.Context, id SessionID, digest string, leaving bool) (written bool, err error) {
	err = b.st.call(ctx, b.id, "putMember", func(time.Time) error {
		if err := b.st.liveLocked(id); err != nil {
			return err
		}
		if m, ok := b.st.members[b.id]; ok && m.session == id {
			b.st.rev++
			b.st.members[b.id] = memMember{session: id, digest: digest, leaving: leaving, created: m.created, modified: b.st.rev}
			b.st.emitLocked(b.st.members[b.id].put(b.id))
			written = true
		}
		return nil
	})
	return written, err
}

func (b *memBackend) EnsureMember(ctx context.Context, id SessionID, digest string) (under SessionID, found bool, err error) {
	err = b.st.call(ctx, b.id, "ensureMember", func(time.Time) error {
		if err := b.st.liveLocked(id); err != nil {
			return err
		}
		m, ok := b.st.members[b.id]
		if !ok {
			b.st.rev++
			m = memMember{session: id, digest: digest, created: b.st.rev, modified: b.st.rev}
			b.st.members[b.id] = m
			b.st.emitLocked(m.put(b.id))
		}
		under, found = m.session, true
		return nil
	})
	return under, found, err
}

// Claim creates every holding at one revision if all of names are free,
// as etcd's transaction does; otherwise it reads them.
func (b *memBackend) Claim(ctx context.Context, id SessionID, names []string) (got []Claimed, absent []string, err error) {
	err = b.st.call(ctx, b.id, "claim", func(time.Time) error {
		b.st.claimCalls++
		got, absent = nil, nil
		if b.st.claimMax != 0 && len(names) > b.st.claimMax {
			return fmt.Errorf("%w: %d names, at most %d", ErrTooManyOps, len(names), b.st.claimMax)
		}
		if err := b.st.liveLocked(id); err != nil {
			return err
		}
		free := true
		for _, name := range names {
			if _, held := b.st.claims[name]; held {
				free = false
			}
		}
		if free {
			b.st.rev++
			puts := make([]Change, 0, len(names))
			for _, name := range names {
				b.st.claims[name] = memClaim{session: id, holder: b.id, rev: b.st.rev}
				got = append(got, Claimed{Name: name, Mine: true, Revision: b.st.rev, Key: memClaimPrefix + name, Token: b.st.rev})
				puts = append(puts, Change{Kind: ClaimPut, Member: b.id, Name: name, Session: id, Created: b.st.rev})
			}
			b.st.emitLocked(puts...)
			return nil
		}
		for _, name := range names {
			c, held := b.st.claims[name]
			switch {
			case !held:
				absent = append(absent, name)
			case c.session == id:
				got = append(got, Claimed{Name: name, Mine: true, Revision: c.rev, Key: memClaimPrefix + name, Token: c.rev, At: b.st.rev})
			default:
				got = append(got, Claimed{Name: name, Holder: c.holder, Session: c.session, Revision: c.rev, At: b.st.rev})
			}
		}
		return nil
	})
	return got, absent, err
}

func (b *memBackend) ClaimCost(name string) int { return len(memClaimPrefix) + len(name) + 16 }

// ClaimLimits answers etcd's defaults (128 names, 1 MiB), which the
// shared part's batches were tuned for, or the store's claimLimit.
func (b *memBackend) ClaimLimits() (names, bytes int) {
	return cmp.Or(b.st.claimLimit, 128), 1 << 20
}

// Release deletes the holding c names while it is that holding.
func (b *memBackend) Release(ctx context.Context, c Claim) error {
	return b.st.call(ctx, b.id, "release", func(time.Time) error {
		name := c.Name
		if h, held := b.st.claims[name]; held && h.rev == c.Revision {
			b.st.rev++
			b.st.dropClaimLocked(name, h)
			b.st.emitLocked(Change{Kind: ClaimGone, Name: name})
		}
		return nil
	})
}

// Publish writes every chunk at one revision, and withdraws as etcd's
// does: the old digest's chunks, or all of this member's for "".
func (b *memBackend) Publish(ctx context.Context, id SessionID, digest, old string, chunks [][]byte) error {
	return b.st.call(ctx, b.id, "publish", func(time.Time) error {
		if err := b.st.liveLocked(id); err != nil {
			return err
		}
		b.st.rev++
		var changed []Change
		for i, c := range chunks {
			k := memChunkKey{b.id, digest, i, len(chunks)}
			b.st.chunks[k] = memChunk{session: id, data: c, modified: b.st.rev}
			changed = append(changed, Change{Kind: ChunkPut, Chunk: k.chunk(c)})
		}
		for k := range b.st.chunks {
			if k.member == b.id && (digest == "" || (old != digest && k.digest == old)) {
				delete(b.st.chunks, k)
				changed = append(changed, Change{Kind: ChunkGone, Chunk: k.chunk(nil)})
			}
		}
		b.st.emitLocked(changed...)
		return nil
	})
}

// Fetch reads member's chunks of digest at the store's revision.
func (b *memBackend) Fetch(ctx context.Context, member, digest string) (chunks []Chunk, at int64, err error) {
	err = b.st.call(ctx, b.id, "fetch", func(time.Time) error {
		chunks, at = nil, b.st.rev
		for k, c := range b.st.chunks {
			if k.member == member && k.digest == digest {
				chunks = append(chunks, Chunk{Member: member, Digest: digest, Index: k.i, Count: k.n, Data: c.data})
			}
		}
		return nil
	})
	return chunks, at, err
}

// dropClaimLocked ends the holding c of name at the current revision.
func (s *memStore) dropClaimLocked(name string, c memClaim) {
	delete(s.claims, name)
	s.past = append(s.past, memHeld{name: name, from: c.rev, to: s.rev})
}

// List returns every record at the store's revision, in one read.
func (b *memBackend) List(ctx context.Context) (records []Change, at int64, err error) {
	err = b.st.call(ctx, b.id, "list", func(time.Time) error {
		records, at = nil, b.st.rev
		for id, m := range b.st.members {
			c := m.put(id)
			c.At = m.modified
			records = append(records, c)
		}
		for name, c := range b.st.claims {
			records = append(records, Change{Kind: ClaimPut, At: c.rev, Member: c.holder, Name: name, Session: c.session, Created: c.rev})
		}
		for k, c := range b.st.chunks {
			records = append(records, Change{Kind: ChunkPut, At: c.modified, Chunk: k.chunk(c.data)})
		}
		return nil
	})
	return records, at, err
}

// HeldAt answers from the live holdings and the ended ones, all kept.
func (b *memBackend) HeldAt(ctx context.Context, at int64) (names map[string]bool, err error) {
	err = b.st.call(ctx, b.id, "heldAt", func(time.Time) error {
		names = map[string]bool{}
		for name, c := range b.st.claims {
			if c.rev <= at {
				names[name] = true
			}
		}
		for _, h := range b.st.past {
			if h.from <= at && at < h.to {
				names[h.name] = true
			}
		}
		return nil
	})
	return names, err
}

// put is the change that writes m, the record of member id.
func (m memMember) put(id string) Change {
	return Change{Kind: MemberPut, Member: id, Session: m.session, Created: m.created, Digest: m.digest, Leaving: m.leaving}
}

// chunk is the chunk k names, holding data.
func (k memChunkKey) chunk(data []byte) Chunk {
	return Chunk{Member: k.member, Digest: k.digest, Index: k.i, Count: k.n, Data: data}
}

// emitLocked logs changes as the batch of the current revision, and
// wakes the feeds. A write that changed nothing logs nothing.
func (s *memStore) emitLocked(changes ...Change) {
	if len(changes) == 0 {
		return
	}
	for i := range changes {
		changes[i].At = s.rev
	}
	s.log = append(s.log, FeedBatch{Changes: changes, At: s.rev})
	close(s.grew)
	s.grew = make(chan struct{})
}

// memFeed delivers the store's log from a position. Sessions expire in
// the store when a call comes (reapLocked): their deletions reach the
// feeds then, not at the moment the validity ran out.
type memFeed struct {
	out  chan FeedBatch
	quit chan struct{} // closed by stop
	ran  chan struct{} // closed as the feed's goroutine returns
}

// Watch delivers the log's batches after from, one at a time, from a
// goroutine that stop ends.
func (b *memBackend) Watch(from int64, wg *sync.WaitGroup) Feed {
	f := &memFeed{out: make(chan FeedBatch), quit: make(chan struct{}), ran: make(chan struct{})}
	wg.Add(1)
	go func() { // owned by the feed; joined by stop, and through wg
		defer wg.Done()
		defer close(f.ran)
		f.run(b.st, from)
	}()
	return f
}

// run sends the log's batches after from to out until stop.
func (f *memFeed) run(s *memStore, from int64) {
	next := 0 // the log's index of the next batch to deliver
	for {
		s.mu.Lock()
		for next < len(s.log) && s.log[next].At <= from {
			next++
		}
		var b FeedBatch
		has := next < len(s.log)
		if has {
			b = s.log[next]
			next++
		}
		grew := s.grew
		s.mu.Unlock()
		if !has {
			select {
			case <-grew:
				continue
			case <-f.quit:
				return
			}
		}
		select {
		case f.out <- b:
		case <-f.quit:
			return
		}
	}
}

func (f *memFeed) Batches() <-chan FeedBatch { return f.out }

func (f *memFeed) Stop() {
	close(f.quit)
	<-f.ran
}

// memFaultsTTL is the sessions' TTL in TestMemoryBackendFaults.
const memFaultsTTL = 2 * time.Second

// What only the in-memory backend can show, being able to lose an
// answer: a renewal whose answer was lost still renewed, so the caller
// may go on with the session; a begin whose answer was lost, and whose
// end of the session it started did not arrive either (begin ends it
// best effort), leaves a session the caller does not know, whose record
// refuses the next begin until it expires.
func TestMemoryBackendFaults(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		st := newMemStore()
		b := st.replica("r0", time.Second)
		s, err := b.Begin(ctx, 0, memFaultsTTL, "d")
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(memFaultsTTL * 3 / 4)
		st.inject("renew", memFault{lost: true})
		if _, err := b.Renew(ctx, s.ID); err == nil {
			t.Fatal("a renewal whose answer was lost returned no error")
		}
		st.inject("renew", memFault{})
		time.Sleep(memFaultsTTL / 2) // past the first grant's end
		if _, err := b.Renew(ctx, s.ID); err != nil {
			t.Errorf("the session after a renewal whose answer was lost: %v", err)
		}
		_ = b.End(ctx, s.ID)

		st.inject("begin", memFault{lost: true, once: true})
		st.inject("end", memFault{err: errors.New("unreachable"), once: true})
		if _, err := b.Begin(ctx, 0, memFaultsTTL, "d"); err == nil {
			t.Fatal("a begin whose answer was lost returned no error")
		}
		if _, err := b.Begin(ctx, 0, memFaultsTTL, "d"); !errors.Is(err, ErrDuplicateID) {
			t.Errorf("begin after a lost one: %v, want ErrDuplicateID while the unknown session lives", err)
		}
		time.Sleep(memFaultsTTL)
		if _, err := b.Begin(ctx, 0, memFaultsTTL, "d"); err != nil {
			t.Errorf("begin once the unknown session expired: %v", err)
		}
		// A request that never arrived changes nothing; an answer held
		// back comes that much later, the renewal made when it arrived.
		st.inject("renew", memFault{err: errors.New("unreachable")})
		s3, _, _ := b.MemberSession(ctx)
		if _, err := b.Renew(ctx, s3); err == nil || errors.Is(err, ErrSessionEnded) {
			t.Errorf("a renewal that never arrived: %v, want the injected error", err)
		}
		st.inject("renew", memFault{delay: time.Second})
		sent := time.Now()
		if _, err := b.Renew(ctx, s3); err != nil || time.Since(sent) != time.Second {
			t.Errorf("a renewal held back 1s: %v after %v", err, time.Since(sent))
		}
		st.inject("renew", memFault{})
		if want := []string{"r0 1 ended", "r0 2 expired"}; fmt.Sprint(st.ended) != fmt.Sprint(want) {
			t.Errorf("sessions ended: %q, want %q", st.ended, want)
		}
	})
}
