// The Backend: one replica's access to the Store, each method the
// contract of ha.Backend kept in memory.

package sim

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/bgctl/controller/ha"
)

// Backend is one replica's access to a [Store], made by
// [Store.Backend]: the reference implementation of [ha.Backend]. Each
// request is carried out whole, under the store's lock, at one moment;
// every write takes the next position of the store's one counter. Its
// methods are safe for concurrent use; each passes the store's faults on
// its way to the store and back (see [Store.Partition] and the others),
// and is bounded by its context, and by the replica's RequestTimeout
// where its documentation says so.
type Backend struct {
	st  *Store           // immutable
	cfg ha.BackendConfig // immutable: the replica's, RequestTimeout and RenewEvery set

	crashed bool // guarded by st.mu: Crash cut this backend off for good
}

var _ ha.Backend = (*Backend)(nil)

// CheckServers does nothing: the store has no servers to ask.
func (b *Backend) CheckServers(context.Context) {}

// Request returns parent bounded by the replica's RequestTimeout.
func (b *Backend) Request(parent context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(parent, b.cfg.RequestTimeout)
}

// Begin starts a session of ttl, valid from the moment it reaches the
// store, and so from Session.Sent, taken before; it writes this
// replica's member record under it, with digest, at the position of
// Session.JoinedAt: created if absent, moved if it is under prev, refused
// with an error wrapping [ha.ErrDuplicateID] if under another session.
// A moved record keeps its creation's position (its seniority), and
// JoinedAt is then the position before the move's. When the store
// started the session but the caller gets an error (an answer lost or
// held back past ctx), Begin ends the session, best effort, by a request
// of its own. Each of its requests is bounded by the replica's
// RequestTimeout, and by ctx.
func (b *Backend) Begin(ctx context.Context, prev ha.SessionID, ttl time.Duration, digest string) (ha.Session, error) {
	sent := time.Now()
	var started ha.Session
	rctx, cancel := b.Request(ctx)
	defer cancel()
	err := b.call(rctx, OpBegin, func(now time.Time) error {
		s := b.st
		held, moved := s.members[b.cfg.ID]
		if moved && held.session != prev {
			return fmt.Errorf("sim: member %q is under session %d: %w", b.cfg.ID, held.session, ha.ErrDuplicateID)
		}
		s.next++
		s.rev++
		started = ha.Session{ID: s.next, Sent: sent, JoinedAt: s.rev}
		s.sessions[started.ID] = &session{member: b.cfg.ID, ttl: ttl, granted: now}
		m := member{session: started.ID, digest: digest, created: s.rev, modified: s.rev}
		if moved {
			m.created = held.created
			started.JoinedAt = s.rev - 1
		}
		s.members[b.cfg.ID] = m
		s.emitLocked(m.put(b.cfg.ID))
		return nil
	})
	if err != nil && started.ID != 0 {
		ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.cfg.RequestTimeout)
		defer cancel()
		_ = b.End(ectx, started.ID)
		return ha.Session{}, err
	}
	return started, err
}

// Renew renews session id for its TTL from the moment the renewal
// reaches the store, and answers that TTL; an error wrapping
// [ha.ErrSessionEnded] once the session has ended.
func (b *Backend) Renew(ctx context.Context, id ha.SessionID) (valid time.Duration, err error) {
	err = b.call(ctx, OpRenew, func(now time.Time) error {
		l, ok := b.st.sessions[id]
		if !ok {
			return fmt.Errorf("sim: session %d: %w", id, ha.ErrSessionEnded)
		}
		l.granted, valid = now, l.ttl
		return nil
	})
	return valid, err
}

// End ends session id now: its member record (if under it), its
// holdings and its chunks go at one position, in one batch of the
// feeds. An error wrapping [ha.ErrSessionEnded] when it had ended.
func (b *Backend) End(ctx context.Context, id ha.SessionID) error {
	return b.call(ctx, OpEnd, func(now time.Time) error {
		if err := b.st.liveLocked(id); err != nil {
			return err
		}
		b.st.endLocked(id, now, Ended)
		return nil
	})
}

// PutMember rewrites this replica's member record with digest and
// leaving, keeping its creation's position, only while it is under
// session id; written is false when it is not. An error wrapping
// [ha.ErrSessionEnded] when id has ended.
func (b *Backend) PutMember(ctx context.Context, id ha.SessionID, digest string, leaving bool) (written bool, err error) {
	err = b.call(ctx, OpPutMember, func(time.Time) error {
		s := b.st
		if err := s.liveLocked(id); err != nil {
			return err
		}
		m, ok := s.members[b.cfg.ID]
		if !ok || m.session != id {
			return nil
		}
		s.rev++
		m.digest, m.leaving, m.modified = digest, leaving, s.rev
		s.members[b.cfg.ID] = m
		s.emitLocked(m.put(b.cfg.ID))
		written = true
		return nil
	})
	return written, err
}

// EnsureMember writes this replica's member record under session id,
// with digest, if it has none, and answers the session the record is
// under, found true either way. An error wrapping [ha.ErrSessionEnded]
// when id has ended; the store keeps no record outside a session.
func (b *Backend) EnsureMember(ctx context.Context, id ha.SessionID, digest string) (under ha.SessionID, found bool, err error) {
	err = b.call(ctx, OpEnsureMember, func(time.Time) error {
		s := b.st
		if err := s.liveLocked(id); err != nil {
			return err
		}
		m, ok := s.members[b.cfg.ID]
		if !ok {
			s.rev++
			m = member{session: id, digest: digest, created: s.rev, modified: s.rev}
			s.members[b.cfg.ID] = m
			s.emitLocked(m.put(b.cfg.ID))
		}
		under, found = m.session, true
		return nil
	})
	return under, found, err
}

// Claim makes session id the holder of every one of names at one new
// position, all or none: when every name is free it creates them all
// (Claimed.Mine, Revision and Token that position, At 0); when any is
// held it writes nothing, and answers each held name's holding as it
// reads it (At the current position; Mine for a holding of id's, an
// earlier answer lost) and the free names in absent. An error wrapping
// [ha.ErrSessionEnded] when id has ended; one wrapping
// [ha.ErrTooManyOps] for more names than [Store.RefuseAbove].
func (b *Backend) Claim(ctx context.Context, id ha.SessionID, names []string) (got []ha.Claimed, absent []string, err error) {
	err = b.call(ctx, OpClaim, func(time.Time) error {
		s := b.st
		got, absent = nil, nil
		if s.RefuseAbove != 0 && len(names) > s.RefuseAbove {
			return fmt.Errorf("sim: %d names in one Claim, at most %d: %w", len(names), s.RefuseAbove, ha.ErrTooManyOps)
		}
		if err := s.liveLocked(id); err != nil {
			return err
		}
		free := true
		for _, name := range names {
			if _, held := s.claims[name]; held {
				free = false
				break
			}
		}
		if free {
			s.rev++
			puts := make([]ha.Change, 0, len(names))
			for _, name := range names {
				s.claims[name] = holding{session: id, holder: b.cfg.ID, created: s.rev}
				got = append(got, ha.Claimed{Name: name, Mine: true, Revision: s.rev, Key: claimKeyPrefix + name, Token: s.rev})
				puts = append(puts, ha.Change{Kind: ha.ClaimPut, Member: b.cfg.ID, Name: name, Session: id, Created: s.rev})
			}
			s.emitLocked(puts...)
			return nil
		}
		for _, name := range names {
			h, held := s.claims[name]
			switch {
			case !held:
				absent = append(absent, name)
			case h.session == id:
				got = append(got, ha.Claimed{Name: name, Mine: true, Revision: h.created, Key: claimKeyPrefix + name, Token: h.created, At: s.rev})
			default:
				got = append(got, ha.Claimed{Name: name, Holder: h.holder, Session: h.session, Revision: h.created, At: s.rev})
			}
		}
		return nil
	})
	return got, absent, err
}

// ClaimCost is the bytes a name adds to a Claim: its key, and room for
// its position.
func (b *Backend) ClaimCost(name string) int { return len(claimKeyPrefix) + len(name) + 16 }

// ClaimLimits answers [Store.ClaimLimit] names (128 if zero) and 1 MiB.
func (b *Backend) ClaimLimits() (names, bytes int) {
	return cmp.Or(b.st.ClaimLimit, defaultClaimLimit), 1 << 20
}

// Release ends holding c at a position of its own, only while the name
// is held by that holding (the same creation's position): a name held
// anew since is left alone.
func (b *Backend) Release(ctx context.Context, c ha.Claim) error {
	return b.call(ctx, OpRelease, func(time.Time) error {
		s := b.st
		if h, held := s.claims[c.Name]; held && h.created == c.Revision {
			s.rev++
			s.dropHoldingLocked(c.Name, h)
			s.emitLocked(ha.Change{Kind: ha.ClaimGone, Name: c.Name})
		}
		return nil
	})
}

// MemberSession answers the session this replica's member record is
// under, and whether there is one.
func (b *Backend) MemberSession(ctx context.Context) (id ha.SessionID, found bool, err error) {
	err = b.call(ctx, OpMemberSession, func(time.Time) error {
		var m member
		m, found = b.st.members[b.cfg.ID]
		id = m.session
		return nil
	})
	return id, found, err
}

// TimeLeft answers, exactly, how long session id lives unless renewed,
// and its TTL; an error wrapping [ha.ErrSessionEnded] once it has ended.
func (b *Backend) TimeLeft(ctx context.Context, id ha.SessionID) (left, granted time.Duration, err error) {
	return b.timeLeft(ctx, OpTimeLeft, id)
}

// PeerLeft answers as TimeLeft does, for any member's session: the store
// keeps every session's time itself.
func (b *Backend) PeerLeft(ctx context.Context, id ha.SessionID) (left, granted time.Duration, err error) {
	return b.timeLeft(ctx, OpPeerLeft, id)
}

// timeLeft is TimeLeft and PeerLeft, as a request of op.
func (b *Backend) timeLeft(ctx context.Context, op Op, id ha.SessionID) (left, granted time.Duration, err error) {
	err = b.call(ctx, op, func(now time.Time) error {
		l, ok := b.st.sessions[id]
		if !ok {
			return fmt.Errorf("sim: session %d: %w", id, ha.ErrSessionEnded)
		}
		left, granted = l.expires().Sub(now), l.ttl
		return nil
	})
	return left, granted, err
}

// Publish writes chunks as this replica's set with digest, under session
// id, and withdraws its set of digest old, all at one position; a digest
// of "" publishes nothing and withdraws every set of this replica's. A chunk
// written again with the same content changes only its position. An
// error wrapping [ha.ErrSessionEnded] when id has ended. Its request is
// bounded by the replica's RequestTimeout, and by ctx.
func (b *Backend) Publish(ctx context.Context, id ha.SessionID, digest, old string, chunks [][]byte) error {
	ctx, cancel := b.Request(ctx)
	defer cancel()
	return b.call(ctx, OpPublish, func(time.Time) error {
		s := b.st
		if err := s.liveLocked(id); err != nil {
			return err
		}
		s.rev++
		var changed []ha.Change
		if digest == "" {
			chunks = nil // publishes nothing, as documented: were they written, they would only go again, in the same batch
		}
		for i, data := range chunks {
			k := chunkKey{b.cfg.ID, digest, i, len(chunks)}
			s.chunks[k] = chunk{session: id, data: data, modified: s.rev}
			changed = append(changed, ha.Change{Kind: ha.ChunkPut, Chunk: k.chunk(data)})
		}
		for _, k := range s.chunkKeysLocked() {
			if k.member == b.cfg.ID && (digest == "" || (old != digest && k.digest == old)) {
				delete(s.chunks, k)
				changed = append(changed, ha.Change{Kind: ha.ChunkGone, Chunk: k.chunk(nil)})
			}
		}
		s.emitLocked(changed...)
		return nil
	})
}

// Fetch reads the chunks member published of its set with digest, at
// the current position, which it answers.
func (b *Backend) Fetch(ctx context.Context, member, digest string) (chunks []ha.Chunk, at int64, err error) {
	err = b.call(ctx, OpFetch, func(time.Time) error {
		chunks, at = nil, b.st.rev
		for _, k := range b.st.chunkKeysLocked() {
			if k.member == member && k.digest == digest {
				chunks = append(chunks, k.chunk(b.st.chunks[k].data))
			}
		}
		return nil
	})
	return chunks, at, err
}

// List reads every member record, holding and chunk at the current
// position, in one read, each as a put at its last write's position.
// Its request is bounded by the replica's RequestTimeout, and by ctx.
func (b *Backend) List(ctx context.Context) (records []ha.Change, at int64, err error) {
	ctx, cancel := b.Request(ctx)
	defer cancel()
	err = b.call(ctx, OpList, func(time.Time) error {
		s := b.st
		records, at = nil, s.rev
		// In one order, not the maps': the same on every run.
		for _, id := range slices.Sorted(maps.Keys(s.members)) {
			records = append(records, s.members[id].put(id))
		}
		for _, name := range slices.Sorted(maps.Keys(s.claims)) {
			h := s.claims[name]
			records = append(records, ha.Change{Kind: ha.ClaimPut, At: h.created, Member: h.holder, Name: name, Session: h.session, Created: h.created})
		}
		for _, k := range s.chunkKeysLocked() {
			c := s.chunks[k]
			records = append(records, ha.Change{Kind: ha.ChunkPut, At: c.modified, Chunk: k.chunk(c.data)})
		}
		return nil
	})
	return records, at, err
}

// HeldAt answers the names held at position at, from the live holdings
// and every ended one: the store forgets no history but what
// [Store.Compact] had it forget, and a position before the last Compact
// fails with an error wrapping [ErrCompacted]. Its request is bounded by
// the replica's RequestTimeout, and by ctx.
func (b *Backend) HeldAt(ctx context.Context, at int64) (names map[string]bool, err error) {
	ctx, cancel := b.Request(ctx)
	defer cancel()
	err = b.call(ctx, OpHeldAt, func(time.Time) error {
		if at < b.st.compact {
			return fmt.Errorf("%w: position %d, before %d", ErrCompacted, at, b.st.compact)
		}
		names = map[string]bool{}
		for name, h := range b.st.claims {
			if h.created <= at {
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

// Watch starts the feed of the store's changes after position from, in
// the order of their positions, a batch per position, each session's end
// in one batch; between changes it delivers a batch of progress alone at
// least every RenewEvery of the replica's config. A feed that has not
// delivered up to the position of a [Store.Compact] fails, its one
// batch's error wrapping [ErrCompacted]. Its goroutine is counted in wg,
// and ends when the feed's Stop returns.
func (b *Backend) Watch(from int64, wg *sync.WaitGroup) ha.Feed {
	f := &feed{out: make(chan ha.FeedBatch), quit: make(chan struct{}), done: make(chan struct{})}
	wg.Add(1)
	go func() { // owned by the feed; joined by Stop, and through wg
		defer wg.Done()
		defer close(f.done)
		b.deliver(f, from)
	}()
	return f
}
