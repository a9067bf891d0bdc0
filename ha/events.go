// Events: what a program can wait on, as it happens on a replica: the
// lease gained and lost, the fence passed, a name acquired or released.

package ha

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// EventKind says what an [Event] reports.
type EventKind uint8

const (
	// LeaseGained: the replica was granted a lease and wrote its member key
	// under it. It is a member, and claims the names it owns. After a fence
	// pass it comes again, with a new lease, once etcd answers.
	LeaseGained EventKind = iota + 1
	// FencePassed: no keepalive was answered in time, etcd no longer knows
	// the lease, or another replica took this ID (Err says which). Every
	// controller here has been cancelled, and no StopFunc will run. The
	// names' Released events and a LeaseLost follow once the controllers
	// stopped.
	FencePassed
	// LeaseLost: the replica holds no lease any more: revoked (Reason
	// "leave"), or left to expire ("close", "fence"). The Released events
	// of the names that ran here came before it. Err is the error Leave or
	// Close returns, if any.
	LeaseLost
	// Acquired: the replica created Name's claim and installed its
	// controller: Name runs here from now on ([Replica.Running] is true).
	Acquired
	// Released: Name no longer runs here. Its controller terminated
	// (StopFunc included) and its claim was deleted; or, at the end of the
	// lease (Reason "fence", "leave" or "close"), the controller was waited
	// for as [Replica.Leave] and [Replica.Close] say, and the claim goes
	// with the lease.
	Released
)

func (k EventKind) String() string {
	switch k {
	case LeaseGained:
		return "lease gained"
	case FencePassed:
		return "fence passed"
	case LeaseLost:
		return "lease lost"
	case Acquired:
		return "acquired"
	case Released:
		return "released"
	}
	return fmt.Sprintf("EventKind(%d)", uint8(k))
}

// Reason says why a name was released, or a lease lost. Its values are
// short words, fit for a metric's label.
type Reason string

// The reasons of a Released event, and of a LeaseLost (fence, leave,
// close). The metrics' reason label takes moved, removed, lost and leave.
const (
	ReasonMoved   Reason = "moved"   // another member owns the name now
	ReasonRemoved Reason = "removed" // the name was unregistered here
	ReasonLost    Reason = "lost"    // its claim was deleted or created anew under the controller
	ReasonFence   Reason = "fence"   // the fence passed
	ReasonLeave   Reason = "leave"   // Replica.Leave
	ReasonClose   Reason = "close"   // Replica.Close
)

// Event is something that happened on one replica. Which fields are set
// depends on Kind.
type Event struct {
	Kind EventKind
	// Time is when the replica made the event.
	Time time.Time
	// Lease is the lease the event belongs to: the one gained, lost or
	// whose fence passed, or the one the name's claim lives under.
	Lease SessionID
	// Name is the controller's name (Acquired, Released).
	Name string
	// Revision is the create revision of the name's claim (Acquired,
	// Released).
	Revision int64
	// Reason says why (Released, LeaseLost).
	Reason Reason
	// Err is the fence's cause (FencePassed: it wraps ErrFencePassed, or
	// says that etcd lost the lease or that the ID is taken), or the error
	// of Leave or Close (LeaseLost).
	Err error
}

// Events returns a channel that receives what happens on this replica from
// now on, in order. Subscribe before [Replica.Join] to see the first
// LeaseGained. Nothing is dropped and the replica never waits for a
// reader: events queue for a slow one, so a subscriber that stops reading
// must cancel ctx. The channel is closed when ctx ends, or once the replica
// has stopped (Leave or Close returned) and every event was delivered.
//
// To wait for a state rather than a change, subscribe first, then read the
// state ([Replica.Running]), then wait for events: a change made between
// the two is in the channel.
//
// Each subscription has a goroutine of its own that hands the events over;
// it ends when the channel is closed. A nil ctx is context.Background:
// the channel then closes only once the replica has stopped.
func (r *Replica) Events(ctx context.Context) <-chan Event {
	ctx = orBackground(ctx)
	out := make(chan Event)
	s := &subscriber{wake: make(chan struct{}, 1)}
	if !r.events.add(s) {
		close(out) // the replica has stopped: nothing more will happen
		return out
	}
	go r.events.deliver(ctx, s, out) // owned by the subscriber; ends with ctx or after the last event, closing out
	return out
}

// emit hands ev to every subscriber. It never blocks, and costs an atomic
// load when nobody subscribed.
func (r *Replica) emit(ev Event) {
	if r.events.n.Load() == 0 {
		return
	}
	ev.Time = time.Now()
	r.events.emit(ev)
}

// eventHub is a replica's subscribers. Its zero value has none.
type eventHub struct {
	n atomic.Int32 // len(subs), for emit to skip the lock when 0

	mu    sync.Mutex
	subs  map[*subscriber]struct{} // guarded by mu
	ended bool                     // guarded by mu: the replica stopped; no event comes any more
}

// subscriber is one Events channel's queue.
type subscriber struct {
	wake chan struct{} // capacity 1: queue or last changed

	mu    sync.Mutex
	queue []Event // guarded by mu: made, not yet handed over
	last  bool    // guarded by mu: no event will come after those queued
}

// add registers s, unless the replica has stopped.
func (h *eventHub) add(s *subscriber) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ended {
		return false
	}
	if h.subs == nil {
		h.subs = make(map[*subscriber]struct{})
	}
	h.subs[s] = struct{}{}
	h.n.Store(int32(len(h.subs)))
	return true
}

func (h *eventHub) remove(s *subscriber) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.subs, s)
	h.n.Store(int32(len(h.subs)))
}

func (h *eventHub) emit(ev Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.subs {
		s.mu.Lock()
		s.queue = append(s.queue, ev)
		s.mu.Unlock()
		s.signal()
	}
}

// end tells every subscriber that no event comes after those queued.
func (h *eventHub) end() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ended = true
	for s := range h.subs {
		s.mu.Lock()
		s.last = true
		s.mu.Unlock()
		s.signal()
	}
}

func (s *subscriber) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// deliver hands s's events to out until ctx ends or the last one was
// handed over, then closes out. The goroutine of one subscription.
func (h *eventHub) deliver(ctx context.Context, s *subscriber, out chan<- Event) {
	defer close(out)
	defer h.remove(s)
	for {
		s.mu.Lock()
		batch, last := s.queue, s.last
		s.queue = nil
		s.mu.Unlock()
		for _, ev := range batch {
			select {
			case out <- ev:
			case <-ctx.Done():
				return
			}
		}
		switch {
		case len(batch) > 0:
			continue // more may have come meanwhile
		case last:
			return
		}
		select {
		case <-s.wake:
		case <-ctx.Done():
			return
		}
	}
}
