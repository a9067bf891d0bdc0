// The faults a test injects, and the gate every request of a backend
// passes through on its way to the store and back, where they act.

package sim

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/bgctl/controller/ha"
)

// Op names a kind of request a backend sends the store: one of
// [ha.Backend]'s methods that reach it. The faults that meet one request
// ([Store.LoseAnswer], [Store.DelayAnswer]) name its Op, or "" for any.
type Op string

// The requests a backend sends, named after its methods.
const (
	OpBegin         Op = "Begin"
	OpRenew         Op = "Renew"
	OpEnd           Op = "End"
	OpPutMember     Op = "PutMember"
	OpEnsureMember  Op = "EnsureMember"
	OpClaim         Op = "Claim"
	OpRelease       Op = "Release"
	OpMemberSession Op = "MemberSession"
	OpTimeLeft      Op = "TimeLeft"
	OpPeerLeft      Op = "PeerLeft"
	OpPublish       Op = "Publish"
	OpFetch         Op = "Fetch"
	OpList          Op = "List"
	OpHeldAt        Op = "HeldAt"
)

// fault is what the store does to the next request it meets.
type fault struct {
	replica string        // whose request it meets; "" any replica's
	op      Op            // which request it meets; "" any
	lose    bool          // the store carries the request out; its answer is lost
	delay   time.Duration // the answer is held back this long
}

// ErrAnswerLost is wrapped by the error of a request whose answer
// [Store.LoseAnswer] lost: the store carried it out.
var ErrAnswerLost = errors.New("sim: the answer was lost")

// ErrUnknownReplica is wrapped by the error of [Store.Crash] given no
// replica, or one the store made no backend for.
var ErrUnknownReplica = errors.New("sim: no replica of this store")

// Crash has replica r crash: from now on nothing any backend of r's ID
// made so far sends reaches the store, its feed delivers nothing, and r
// is closed ([ha.Replica.Close]), which stops its controllers at once.
// The store ends r's session when its TTL runs out, unrenewed; its
// holdings go with it, and the other replicas take its names over. A
// replica made later under r's ID is not crashed: it is r restarted.
// Crash returns Close's error; an error wrapping [ErrUnknownReplica],
// and r left alone, when r is nil or the store made no backend of r's
// ID (a replica of another store: crashing it here would cut nothing off).
//
// Close runs the StopFuncs of r's names while r's fence is open, which a
// real crash would not.
func (s *Store) Crash(r *ha.Replica) error {
	if r == nil {
		return fmt.Errorf("%w: Crash(nil)", ErrUnknownReplica)
	}
	known := false
	s.changeLinks(func() {
		for _, b := range s.backends[r.ID()] {
			b.crashed, known = true, true
		}
	})
	if !known {
		return fmt.Errorf("%w: Crash(%q): no replica of that ID was made on this store", ErrUnknownReplica, r.ID())
	}
	return r.Close()
}

// Partition cuts replica id off from the store until [Store.Heal]: each
// request it sends meanwhile (its renewals included) is dropped, waits
// until its context ends and fails, never reaching the store; answers on
// their way to it are dropped as well, and its feed delivers nothing.
// The other replicas go on. Its session, no longer renewed, ends when its
// TTL runs out; the replica's fence passes before that, and it stops its
// controllers on its own. It applies to every replica made under id,
// until healed.
func (s *Store) Partition(id string) {
	s.changeLinks(func() { s.cut[id] = true })
}

// Heal ends replica id's partition: its next requests reach the store,
// and its feed delivers what it missed. A request dropped before stays
// dropped.
func (s *Store) Heal(id string) {
	s.changeLinks(func() { delete(s.cut, id) })
}

// Pause freezes replica id's traffic with the store until
// [Store.Resume], as a process that is stopped (SIGSTOP, a long
// collection) would: its requests are held before they reach the store,
// the answers on their way to it and its feed's batches are held before
// they reach it, and its renewals stop reaching the store, so its
// session ends if the pause outlasts it. At Resume everything held goes on:
// a request whose context ended meanwhile fails without reaching the
// store. The replica's goroutines are not frozen: its fence passes on
// time and its controllers see their contexts end (see the package
// documentation). It applies to every replica made under id.
func (s *Store) Pause(id string) {
	s.changeLinks(func() { s.paused[id] = true })
}

// Resume ends replica id's pause: what was held goes on.
func (s *Store) Resume(id string) {
	s.changeLinks(func() { delete(s.paused, id) })
}

// changeLinks runs change, which sets how some replica's link to the
// store stands, under mu, and wakes whatever waits on a link.
func (s *Store) changeLinks(change func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.initLocked()
	change()
	s.wakeLocked()
}

// LoseAnswer has the store carry out the next request of op (any
// request: "") that replica id (any replica: "") sends, and lose its
// answer: the caller gets an error wrapping [ErrAnswerLost] at once,
// though the write, if it was one, was made. Faults are met in the order
// injected, each once. It fails, injecting nothing, when op is none of
// the Op constants: such a fault would meet no request, and the test
// would pass without the fault it meant.
func (s *Store) LoseAnswer(id string, op Op) error {
	return s.inject(fault{replica: id, op: op, lose: true})
}

// DelayAnswer holds back by d the answer to the next request of op (any
// request: "") that replica id (any replica: "") sends: the store
// carries it out at once, and the caller gets the answer d later, or
// its context's error if that ends first. It fails, injecting nothing,
// when op is none of the Op constants or d is not positive.
func (s *Store) DelayAnswer(id string, op Op, d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("sim: DelayAnswer(%q, %q, %v): the delay must be positive", id, op, d)
	}
	return s.inject(fault{replica: id, op: op, delay: d})
}

// ops is every Op a request is sent as.
var ops = []Op{OpBegin, OpRenew, OpEnd, OpPutMember, OpEnsureMember, OpClaim, OpRelease, OpMemberSession, OpTimeLeft, OpPeerLeft, OpPublish, OpFetch, OpList, OpHeldAt}

// inject queues f for the next request it meets; it fails when f's op
// is no request's.
func (s *Store) inject(f fault) error {
	if f.op != "" && !slices.Contains(ops, f.op) {
		return fmt.Errorf("sim: no request is sent as Op %q: want one of %v, or \"\" for any", f.op, ops)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.initLocked()
	s.faults = append(s.faults, f)
	return nil
}

// takeFaultLocked removes and returns the first fault queued that meets
// a request of op from replica id; a zero fault if none does.
func (s *Store) takeFaultLocked(id string, op Op) fault {
	for i, f := range s.faults {
		if (f.replica == "" || f.replica == id) && (f.op == "" || f.op == op) {
			s.faults = append(s.faults[:i], s.faults[i+1:]...)
			return f
		}
	}
	return fault{}
}

// EndSession ends replica id's session now, before its validity runs
// out, as a server that revokes a lease early does (another client's
// revoke, a stale leader that wakes): its member record, holdings and
// published chunks go at once, in one change the others see. The
// replica's fence passes when its feed shows it, or its next renewal is
// refused; it joins again under a new session. It fails when id has no
// member record under a live session.
func (s *Store) EndSession(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.initLocked()
	now := time.Now()
	s.expireLocked(now)
	m, ok := s.members[id]
	if !ok || s.liveLocked(m.session) != nil {
		return fmt.Errorf("sim: EndSession(%q): no live session", id)
	}
	s.endLocked(m.session, now, EndedEarly)
	return nil
}

// linkLocked tells how b's link to the store stands: dropped, its
// traffic is lost (crash, partition); blocked, it waits (dropped, or a
// pause).
func (b *Backend) linkLocked() (blocked, dropped bool) {
	s := b.st
	dropped = b.crashed || s.cut[b.cfg.ID]
	return dropped || s.paused[b.cfg.ID], dropped
}

// call carries out one request of b's, op, whose store side is act: it
// passes the link on its way to the store, meets the faults injected,
// has the store act under its lock at the moment the request arrives
// (sessions whose validity ran out by then ended first), and passes the
// link again on its way back.
func (b *Backend) call(ctx context.Context, op Op, act func(now time.Time) error) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("sim: %s's %s never reached the store: %w", b.cfg.ID, op, err)
	}
	s := b.st
	s.mu.Lock()
	s.initLocked()
	if err := b.waitLinkLocked(ctx, op, "never reached the store"); err != nil {
		s.mu.Unlock()
		return err
	}
	f := s.takeFaultLocked(b.cfg.ID, op)
	s.requests[op]++
	now := time.Now()
	s.expireLocked(now)
	err := act(now)
	s.mu.Unlock()

	if f.delay > 0 {
		t := time.NewTimer(f.delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("sim: %s's %s: its answer, held back, never came: %w", b.cfg.ID, op, ctx.Err())
		}
	}
	s.mu.Lock()
	lost := b.waitLinkLocked(ctx, op, "its answer never came")
	s.mu.Unlock()
	switch {
	case lost != nil:
		return lost
	case f.lose:
		return fmt.Errorf("sim: %s's %s: %w (LoseAnswer)", b.cfg.ID, op, ErrAnswerLost)
	}
	return err
}

// waitLinkLocked waits, with mu held on entry and on return, while b's
// link to the store blocks: until it opens (nil), or until ctx ends (an
// error saying what, and wrapping ctx's). A dropped link waits for ctx
// alone: what it drops is gone, even if it heals meanwhile.
func (b *Backend) waitLinkLocked(ctx context.Context, op Op, what string) error {
	s := b.st
	for {
		blocked, dropped := b.linkLocked()
		if !blocked {
			return nil
		}
		wake := s.wake
		s.mu.Unlock()
		if dropped {
			<-ctx.Done()
		} else {
			select {
			case <-wake:
			case <-ctx.Done():
			}
		}
		s.mu.Lock()
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("sim: %s's %s %s: %w", b.cfg.ID, op, what, err)
		}
	}
}

// ErrCompacted is wrapped by the error of HeldAt, and of a feed, asked
// about a position whose history [Store.Compact] forgot.
var ErrCompacted = errors.New("sim: the position's history was compacted")

// Compact forgets the group's history before the current position, as
// etcd's compaction or a change log's pruning does: HeldAt of an earlier
// position fails, wrapping [ErrCompacted], and so does every feed that
// has not delivered up to the current position yet (one batch with the
// error, then nothing): its replica lists the group again and starts a
// new feed from there, as on a real store. A feed caught up goes on.
func (s *Store) Compact() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.initLocked()
	s.compact = s.rev
	s.log = slices.DeleteFunc(s.log, func(b ha.FeedBatch) bool { return b.At <= s.compact })
	s.past = slices.DeleteFunc(s.past, func(h pastHolding) bool { return h.to <= s.compact })
	s.wakeLocked()
}
