// Review of ha.Rounding: a store whose readings are exact (Rounding 0),
// as sim's are, read with no time passing between a reading's send and
// its answer (a bubble; a clock coarser than the request).

package sim_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/bgctl/controller/ha"
	"github.com/bgctl/controller/ha/sim"
)

// exactStore is st, its backends declaring what is true of them: their
// TimeLeft and PeerLeft are never short (ha.Rounding 0).
type exactStore struct{ st *sim.Store }

type exactBackend struct{ *sim.Backend }

func (exactBackend) Rounding() time.Duration { return 0 }

func (s exactStore) Backend(c ha.BackendConfig) (ha.Backend, error) {
	b, err := s.st.Backend(c)
	if err != nil {
		return nil, err
	}
	return exactBackend{b.(*sim.Backend)}, nil
}

// A replica restarted under the ID of one that crashed, on a store whose
// readings are exact, waits for the crashed run's session to run out and
// joins: readings of one unrenewed session, each answered the instant it
// was sent, all put its end at the same instant, and are no renewal.
func TestReviewExactReadingsOfACrashedRunAreNoRenewal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var st sim.Store
		var rec sim.Recorder
		store := exactStore{&st}
		r0 := join(t, store, &rec, "r0")
		time.Sleep(time.Second)
		expires, _ := st.Expires("r0")
		if err := st.Crash(r0); err != nil {
			t.Fatal(err)
		}
		r, err := ha.New(store, options("r0"))
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		if err := registerControllers(rec.Controllers(r)); err != nil {
			t.Fatal(err)
		}
		err = r.Join(context.Background())
		if errors.Is(err, ha.ErrDuplicateID) {
			t.Fatalf("join after a crash, %v before the crashed run's session ran out: %v", time.Until(expires), err)
		}
		if err != nil {
			t.Fatal(err)
		}
		if time.Now().Before(expires) {
			t.Errorf("joined %v before the crashed run's session ran out", expires.Sub(time.Now()))
		}
	})
}

// A replica made under the ID of one that lives, on a store whose
// readings are exact and answered the instant they are sent, is refused
// as a duplicate: the live one's renewals move its end past every
// earlier reading's.
func TestReviewExactReadingsOfALiveDuplicateAreRenewals(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var st sim.Store
		var rec sim.Recorder
		store := exactStore{&st}
		join(t, store, &rec, "r0")
		time.Sleep(time.Second)
		r, err := ha.New(store, options("r0"))
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		began := time.Now()
		if err := r.Join(context.Background()); !errors.Is(err, ha.ErrDuplicateID) {
			t.Fatalf("join beside a live replica of the same ID: %v, want ErrDuplicateID", err)
		}
		if d := time.Since(began); d > 2*ttl {
			t.Errorf("the duplicate was told after %v", d)
		}
	})
}

// A paused replica, read silent by the others (its lease not renewed for
// half its TTL), whose session the store then ends early: on a store of
// exact readings (Rounding 0) its names wait, past its fence, until the
// readings put its session's end, and not a second more; none runs on two
// replicas at once.
func TestReviewExactReadingsHoldAnEarlyEndedSilentMembersNames(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var st sim.Store
		var rec sim.Recorder
		store := exactStore{&st}
		replicas := map[string]*ha.Replica{}
		for _, id := range []string{"r0", "r1", "r2"} {
			replicas[id] = join(t, store, &rec, id)
		}
		time.Sleep(5 * time.Second)
		var moved []string
		for _, name := range controllerNames {
			if replicas["r1"].Running(name) {
				moved = append(moved, name)
			}
		}
		if len(moved) == 0 {
			t.Fatal("r1 runs nothing")
		}
		st.Pause("r1")
		expires, _ := st.Expires("r1")
		time.Sleep(ttl * 3 / 4)
		ended := time.Now()
		if err := st.EndSession("r1"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * ttl)
		for _, name := range moved {
			runs := rec.Runs(name)
			if len(runs) < 2 {
				t.Errorf("%s: runs %+v; want a run elsewhere", name, runs)
				continue
			}
			if start := runs[len(runs)-1].Start; start.Before(expires) {
				t.Errorf("%s started elsewhere %v before r1's session would have run out (ended early %v before)", name, expires.Sub(start), expires.Sub(ended))
			} else if start.After(expires.Add(time.Second / 2)) {
				t.Errorf("%s started elsewhere %v after r1's session would have run out; want the readings' end", name, start.Sub(expires))
			}
		}
		st.Resume("r1")
		time.Sleep(2 * ttl)
		if o := rec.Overlaps(); len(o) > 0 {
			t.Errorf("ran twice at once: %v", o)
		}
	})
}
