// A store's hand-over (TakeOver) that gives a crashed member's names to
// a member whose own view does not make it their owner: that member
// never runs them, releases them, and their owners run them.

package ha

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/bgctl/controller/ha/internal/place"
)

// misgivingStore is a memStore whose backends implement TakeOver as a
// store whose view of the members differs from the replicas' would: every
// free name of names that ownerOf gives an owner goes to the live
// session of member to, whoever ownerOf names.
type misgivingStore struct {
	*memStore
	to    string   // immutable: the member every name is given to
	names []string // immutable: the names it gives, when free
	given *int     // the names given so far; guarded by the memStore's mu
}

// Backend returns a memBackend that gives the names away (misgiving).
func (s misgivingStore) Backend(c BackendConfig) (Backend, error) {
	return misgiving{memBackend: &memBackend{st: s.memStore, id: c.ID, timeout: c.RequestTimeout}, s: s}, nil
}

// misgiving is a memBackend with misgivingStore's TakeOver.
type misgiving struct {
	*memBackend
	s misgivingStore // immutable
}

// TakeOver gives every free name of names with an owner to member to's
// session, in one revision, if the caller's session and to's are live.
func (b misgiving) TakeOver(ctx context.Context, id SessionID, ownerOf func(name string) string, wg *sync.WaitGroup) {
	wg.Go(func() { _ = b.giveAway(ctx, id, ownerOf) })
}

// giveAway is TakeOver's work, on its goroutine.
func (b misgiving) giveAway(ctx context.Context, id SessionID, ownerOf func(name string) string) error {
	return b.st.call(ctx, b.id, "takeover", func(time.Time) error {
		if err := b.st.liveLocked(id); err != nil {
			return err
		}
		m, ok := b.st.members[b.s.to]
		if !ok || b.st.liveLocked(m.session) != nil {
			return nil
		}
		b.st.rev++
		var puts []Change
		for _, name := range b.s.names {
			if _, held := b.st.claims[name]; held || ownerOf(name) == "" {
				continue
			}
			b.st.claims[name] = memClaim{session: m.session, holder: b.s.to, rev: b.st.rev}
			puts = append(puts, Change{Kind: ClaimPut, Member: b.s.to, Name: name, Session: m.session, Created: b.st.rev})
			*b.s.given++
		}
		b.st.emitLocked(puts...)
		return nil
	})
}

// A crashed replica's names handed over to a survivor that does not own
// them in its own view: it never runs them (a claim of its session it
// did not make is released at once), and their owner runs them within a
// renewal period of the session's end, as without the hand-over.
func TestMemReplicaHandedNamesNotItsOwnAreReleased(t *testing.T) {
	runMemGroup(t, 30, func(t *testing.T, g *memGroup) {
		var given int
		g.store = misgivingStore{memStore: g.st, to: "r2", names: g.names, given: &given}
		three, _ := g.joinThree()
		crashed := g.rec.Now()
		if err := g.rs["r1"].Close(); err != nil {
			t.Fatalf("Close(r1): %v", err)
		}
		delete(g.rs, "r1")
		expires := g.expiry("r1")
		two := g.want("r0", "r2")
		g.waitPlacement(two, 10*time.Second)
		moved := place.On(three, "r1")
		g.handedOver("r1", moved, crashed, crashed+prompt, expires, expires+g.opts.keepAliveEvery()+prompt)
		for name, runs := range g.rec.Runs() {
			for _, r := range runs {
				if r.Replica == "r2" && two[name] != "r2" && r.Start > crashed {
					t.Errorf("%s ran on r2 from %v, which does not own it", name, r.Start)
				}
			}
		}
		g.st.mu.Lock()
		defer g.st.mu.Unlock()
		if given == 0 {
			t.Error("no name was handed over")
		}
		for _, name := range moved {
			if c := g.st.claims[name]; c.holder != two[name] {
				t.Errorf("%s is held by %q, want its owner %s", name, c.holder, two[name])
			}
		}
	})
}
