// Tests of what a program can wait on: the events of a replica, New before
// Join, and a start of three replicas together that moves nothing.

package etcd

import (
	"context"
	"errors"
	"flag"
	"sync"
	"testing"
	"time"

	"github.com/bgctl/controller"
	"github.com/bgctl/controller/ha"
	"github.com/bgctl/controller/ha/internal/place"
)

// nextEvent returns the next event of ch, failing the test when none comes
// within 10 s or the channel is closed.
func nextEvent(t *testing.T, ch <-chan ha.Event) ha.Event {
	t.Helper()
	select {
	case ev, ok := <-ch:
		if !ok {
			t.Fatal("the events channel was closed")
		}
		return ev
	case <-time.After(10 * time.Second):
		t.Fatal("no event within 10s")
	}
	return ha.Event{}
}

// expectEvent reads events of ch until one of kind (for name, when not
// empty) comes, and returns it; the events before it must be of the kinds
// in skip.
func expectEvent(t *testing.T, ch <-chan ha.Event, kind ha.EventKind, name string, skip ...ha.EventKind) ha.Event {
	t.Helper()
	for {
		ev := nextEvent(t, ch)
		if ev.Kind == kind && (name == "" || ev.Name == name) {
			return ev
		}
		ok := false
		for _, k := range skip {
			ok = ok || ev.Kind == k
		}
		if !ok {
			t.Fatalf("got %v %q (%v) while waiting for %v %q", ev.Kind, ev.Name, ev.Reason, kind, name)
		}
	}
}

// collectEvents reads events of ch until each of names has had one of
// kind, and returns them by name; the events between must be of kind too.
func collectEvents(t *testing.T, ch <-chan ha.Event, kind ha.EventKind, names []string) map[string]ha.Event {
	t.Helper()
	want := map[string]bool{}
	for _, name := range names {
		want[name] = true
	}
	got := map[string]ha.Event{}
	for len(got) < len(want) {
		ev := nextEvent(t, ch)
		if ev.Kind != kind {
			t.Fatalf("got %v %q (%v) while waiting for %v of %d names", ev.Kind, ev.Name, ev.Reason, kind, len(want)-len(got))
		}
		if want[ev.Name] {
			got[ev.Name] = ev
		}
	}
	return got
}

// A name's life on one replica, told by its events in order: the lease
// gained at Join, the name acquired (running by then), released when it is
// removed, and the lease lost at Leave; then the channel closes.
func TestEventsTellANamesLifeInOrder(t *testing.T) {
	c := newCluster(t, 0, testOptions())
	n := c.newNode("solo")
	r := n.r
	events := r.Events(t.Context())
	var runs sync.WaitGroup
	runs.Add(1)
	var once sync.Once
	if err := r.UpdateController("job", controller.ControllerParams{
		DoFunc: func(context.Context) error { once.Do(runs.Done); return nil },
	}); err != nil {
		t.Fatal(err)
	}
	if r.Running("job") {
		t.Error("a name runs before Join")
	}
	if err := r.Join(t.Context()); err != nil {
		t.Fatal(err)
	}
	gained := nextEvent(t, events)
	if gained.Kind != ha.LeaseGained || gained.Lease == 0 {
		t.Fatalf("first event %+v, want LeaseGained with its lease", gained)
	}
	acq := nextEvent(t, events)
	if acq.Kind != ha.Acquired || acq.Name != "job" || acq.Lease != gained.Lease || acq.Revision == 0 {
		t.Fatalf("second event %+v, want job Acquired under the lease", acq)
	}
	if !r.Running("job") {
		t.Error("Running is false after Acquired")
	}
	runs.Wait()
	if err := r.RemoveController("job"); err != nil {
		t.Fatal(err)
	}
	rel := nextEvent(t, events)
	if rel.Kind != ha.Released || rel.Name != "job" || rel.Reason != ha.ReasonRemoved || rel.Revision != acq.Revision {
		t.Fatalf("third event %+v, want job Released, removed", rel)
	}
	if r.Running("job") {
		t.Error("Running is true after Released")
	}
	if err := r.Leave(t.Context()); err != nil {
		t.Fatal(err)
	}
	lost := nextEvent(t, events)
	if lost.Kind != ha.LeaseLost || lost.Reason != ha.ReasonLeave || lost.Lease != gained.Lease || lost.Err != nil {
		t.Fatalf("fourth event %+v, want LeaseLost, leave", lost)
	}
	if ev, ok := <-events; ok {
		t.Errorf("an event after the replica stopped: %+v", ev)
	}
	if ev, ok := <-r.Events(t.Context()); ok {
		t.Errorf("a subscription after the replica stopped got %+v", ev)
	}
	c.forget(n)
}

// A partition shows as the fence passing (with its cause), every name
// released for it, the lease lost; after the heal, a new lease and the
// names acquired again.
func TestEventsTellAFencePassAndTheRejoin(t *testing.T) {
	c := newCluster(t, 3, testOptions())
	n := c.join("solo")
	events := n.r.Events(t.Context())
	c.waitPlacement(c.expected([]string{"solo"}), 10*time.Second)
	n.proxy.cut()
	fp := expectEvent(t, events, ha.FencePassed, "", ha.Acquired)
	if !errors.Is(fp.Err, ha.ErrFencePassed) {
		t.Errorf("FencePassed's cause %v, want ErrFencePassed", fp.Err)
	}
	for name, ev := range collectEvents(t, events, ha.Released, c.names) {
		if ev.Reason != ha.ReasonFence || ev.Lease != fp.Lease {
			t.Errorf("%s: %+v, want it Released for the fence", name, ev)
		}
	}
	if ev := nextEvent(t, events); ev.Kind != ha.LeaseLost || ev.Reason != ha.ReasonFence {
		t.Fatalf("got %+v, want LeaseLost for the fence", ev)
	}
	for _, name := range c.names {
		if n.r.Running(name) {
			t.Errorf("%s runs after the lease was lost", name)
		}
	}
	n.proxy.heal()
	gained := expectEvent(t, events, ha.LeaseGained, "")
	if gained.Lease == fp.Lease {
		t.Error("the lease after the heal is the one lost")
	}
	for name, ev := range collectEvents(t, events, ha.Acquired, c.names) {
		if ev.Lease != gained.Lease || !n.r.Running(name) {
			t.Errorf("%s acquired under lease %x, want %x, and running", name, ev.Lease, gained.Lease)
		}
	}
	c.rec.AssertNoOverlap(t)
}

// A join moves names: the old holder tells each released as moved, the
// new one each acquired.
func TestEventsTellAMove(t *testing.T) {
	c := newCluster(t, 30, testOptions())
	r0 := c.join("r0")
	c.waitPlacement(c.expected([]string{"r0"}), 10*time.Second)
	ev0 := r0.r.Events(t.Context())
	r1 := c.newNode("r1")
	ev1 := r1.r.Events(t.Context())
	c.register(r1)
	if err := r1.r.Join(t.Context()); err != nil {
		t.Fatal(err)
	}
	moving := place.On(c.expected([]string{"r0", "r1"}), "r1")
	for name, ev := range collectEvents(t, ev0, ha.Released, moving) {
		if ev.Reason != ha.ReasonMoved {
			t.Errorf("r0 released %s: %v, want moved", name, ev.Reason)
		}
	}
	expectEvent(t, ev1, ha.LeaseGained, "")
	collectEvents(t, ev1, ha.Acquired, moving)
	c.rec.AssertNoOverlap(t)
}

// New makes a replica that holds nothing: Leave before Join returns at
// once, and Join after it is refused; a replica joins once.
func TestNewHoldsNothingUntilJoin(t *testing.T) {
	c := newCluster(t, 0, testOptions())
	n := c.newNode("early")
	if err := n.r.Leave(t.Context()); err != nil {
		t.Errorf("Leave before Join: %v", err)
	}
	if err := n.r.Join(t.Context()); !errors.Is(err, ha.ErrClosed) {
		t.Errorf("Join after Leave: %v, want ErrClosed", err)
	}
	c.forget(n)

	m := c.newNode("twice")
	if err := m.r.Join(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := m.r.Join(t.Context()); !errors.Is(err, ha.ErrJoined) {
		t.Errorf("a second Join: %v, want ErrJoined", err)
	}
}

// concurrentStartMoves starts three replicas together, the i-th after i ×
// apart, waits until the names are spread, and returns how many ran on
// more than one replica. Each replica registers every name and then joins
// (New, UpdateController, Join), or, with joinFirst, joins and then
// registers (Join, UpdateController: all there was before New).
func concurrentStartMoves(t *testing.T, names int, settle time.Duration, joinFirst bool, apart time.Duration) int {
	opts := testOptions()
	opts.Settle = settle
	c := newCluster(t, names, opts)
	ids := []string{"r0", "r1", "r2"}
	var nodes []*node
	for _, id := range ids {
		n := c.newNode(id)
		if !joinFirst {
			c.register(n)
		}
		nodes = append(nodes, n)
	}
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Add(1)
		go func() { // joined below
			defer wg.Done()
			time.Sleep(time.Duration(i) * apart)
			if err := n.r.Join(context.Background()); err != nil {
				t.Errorf("Join(%s): %v", n.id, err)
				return
			}
			if !joinFirst {
				return
			}
			for _, name := range c.names {
				if err := n.r.UpdateController(name, c.rec.Params(n.id, name)); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	c.waitPlacement(c.expected(ids), 20*time.Second)
	c.rec.AssertNoOverlap(t)
	return c.rec.RanOnSeveral()
}

// Replicas that register their names, then join together, 100 ms apart,
// claim only their share: no name starts on one to move to another at
// once. Before New and Options.Settle, the first claimed every name it
// owned among the members it saw, and a replica that joined a moment later
// took hundreds of them over.
func TestConcurrentStartMovesNothing(t *testing.T) {
	if moved := concurrentStartMoves(t, 1000, 0, false, 100*time.Millisecond); moved != 0 {
		t.Errorf("%d of 1000 names ran on two replicas after a start together", moved)
	}
}

var startNames = flag.Int("ha.start", 0, "run TestConcurrentStartMeasurement with this many names (docs/replicas.md's figures: 1000)")

// TestConcurrentStartMeasurement reports how many names move after a
// start together, for docs/replicas.md: joining before or after registering,
// without settling and with the default.
func TestConcurrentStartMeasurement(t *testing.T) {
	if *startNames == 0 {
		t.Log("a measurement, not a test: run it with -ha.start=1000")
		return
	}
	const rounds = 8
	for _, apart := range []time.Duration{0, 100 * time.Millisecond} {
		for _, joinFirst := range []bool{true, false} {
			for _, settle := range []time.Duration{-1, 0} {
				var moved []int
				for range rounds {
					moved = append(moved, concurrentStartMoves(t, *startNames, settle, joinFirst, apart))
				}
				order := "New, UpdateController, Join"
				if joinFirst {
					order = "Join, UpdateController"
				}
				settled := "none"
				if settle == 0 {
					settled = "the default"
				}
				t.Logf("joins %v apart; %s; Settle %s: names moved after a start together, of %d, in %d rounds: %v", apart, order, settled, *startNames, rounds, moved)
			}
		}
	}
}
