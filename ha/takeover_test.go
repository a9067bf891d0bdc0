// A store's hand-over (TakeOver) that gives a crashed member's names to
// a member whose own view does not make it their owner: that member
// never runs them, releases them, and their owners run them.

package ha_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/bgctl/controller/ha"
	"github.com/bgctl/controller/ha/internal/place"
	"github.com/bgctl/controller/ha/sim"
)

// misgivingStore is a sim.Store whose backends implement TakeOver as a
// store whose view of the members differs from the replicas' would: every
// free name of names that ownerOf gives an owner goes to the live
// session of member to, whoever ownerOf names.
type misgivingStore struct {
	*sim.Store
	to    string   // immutable: the member every name is given to
	names []string // immutable: the names it gives, when free
	mu    *sync.Mutex
	given *int // the names given so far; guarded by mu
}

// Backend returns a sim backend that gives the names away (misgiving).
func (s misgivingStore) Backend(c ha.BackendConfig) (ha.Backend, error) {
	b, err := s.Store.Backend(c)
	return misgiving{Backend: b, s: s, cfg: c}, err
}

// misgiving is a sim backend with misgivingStore's TakeOver.
type misgiving struct {
	ha.Backend
	s   misgivingStore   // immutable
	cfg ha.BackendConfig // immutable: the caller's
}

// TakeOver gives every free name of names with an owner to member to's
// session, if it has one.
func (b misgiving) TakeOver(ctx context.Context, id ha.SessionID, ownerOf func(name string) string, wg *sync.WaitGroup) {
	wg.Go(func() { b.giveAway(ctx, ownerOf) })
}

// giveAway is TakeOver's work, on its goroutine: it claims each name
// for to's session through a backend of to's, a name a Claim, so that a
// name held meanwhile leaves the others free to give.
func (b misgiving) giveAway(ctx context.Context, ownerOf func(name string) string) {
	cfg := b.cfg
	cfg.ID = b.s.to
	to, _ := b.s.Store.Backend(cfg)
	session, found, err := to.MemberSession(ctx)
	if err != nil || !found {
		return
	}
	for _, name := range b.s.names {
		if ownerOf(name) == "" {
			continue
		}
		got, _, err := to.Claim(ctx, session, []string{name})
		if err == nil && len(got) == 1 && got[0].Mine && got[0].At == 0 {
			b.s.mu.Lock()
			*b.s.given++
			b.s.mu.Unlock()
		}
	}
}

// A crashed replica's names handed over to a survivor that does not own
// them in its own view: it never runs them (a claim of its session it
// did not make is released at once), and their owner runs them within a
// renewal period of the session's end, as without the hand-over.
func TestMemReplicaHandedNamesNotItsOwnAreReleased(t *testing.T) {
	runMemGroup(t, 30, func(t *testing.T, g *memGroup) {
		var mu sync.Mutex
		var given int
		g.store = misgivingStore{Store: g.st, to: "r2", names: g.names, mu: &mu, given: &given}
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
		g.handedOver("r1", moved, crashed, crashed+prompt, expires, expires+ha.KeepAliveEvery(g.opts)+prompt)
		for name, runs := range g.rec.Runs() {
			for _, r := range runs {
				if r.Replica == "r2" && two[name] != "r2" && r.Start > crashed {
					t.Errorf("%s ran on r2 from %v, which does not own it", name, r.Start)
				}
			}
		}
		mu.Lock()
		defer mu.Unlock()
		if given == 0 {
			t.Error("no name was handed over")
		}
		for _, name := range moved {
			if holder, _ := g.st.Holder(name); holder != two[name] {
				t.Errorf("%s is held by %q, want its owner %s", name, holder, two[name])
			}
		}
	})
}
