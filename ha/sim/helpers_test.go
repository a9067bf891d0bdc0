// Helpers of the package's tests and examples: backends, feeds and
// replicas on a Store, and checks of what they did.

package sim_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/bgctl/controller"
	"github.com/bgctl/controller/ha"
	"github.com/bgctl/controller/ha/sim"
)

// ttl is the sessions' TTL in these tests.
const ttl = 2 * time.Second

// backend returns the backend of replica id on st, with requests bounded
// by a second.
func backend(t *testing.T, st *sim.Store, id string) ha.Backend {
	t.Helper()
	b, err := st.Backend(ha.BackendConfig{ID: id, TTL: ttl, RequestTimeout: time.Second, RenewEvery: ttl / 4})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// begin begins a session of b's replica, or fails the test.
func begin(t *testing.T, b ha.Backend) ha.Session {
	t.Helper()
	s, err := b.Begin(context.Background(), 0, ttl, "d")
	if err != nil {
		t.Fatalf("Begin: %v", err)
	}
	return s
}

// watch starts b's feed after position from; the test's cleanup stops
// it and joins its goroutine.
func watch(t *testing.T, b ha.Backend, from int64) ha.Feed {
	var wg sync.WaitGroup
	f := b.Watch(from, &wg)
	t.Cleanup(func() {
		f.Stop()
		wg.Wait()
	})
	return f
}

// changes returns the next batch of f that has changes, past the
// batches of progress alone.
func changes(f ha.Feed) ha.FeedBatch {
	for {
		if b := <-f.Batches(); len(b.Changes) > 0 {
			return b
		}
	}
}

// ended checks the sessions st has ended against want ("<replica>
// <session> <reason>"), and that each ended when want says, after base.
func ended(t *testing.T, st *sim.Store, base time.Time, want ...string) {
	t.Helper()
	var got []string
	for _, e := range st.Ended() {
		got = append(got, fmt.Sprintf("%v at %v", e, e.At.Sub(base)))
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("sessions ended: %q, want %q", got, want)
	}
}

// options returns the Options of replica id in these tests: a TTL of 2s
// and no log lines.
func options(id string) ha.Options {
	return ha.Options{
		Prefix:         "/svc",
		ID:             id,
		TTL:            ttl,
		ManagerOptions: []controller.Option{controller.WithSlog(slog.New(slog.DiscardHandler))},
	}
}

// join makes replica id on store, registers the guide's controllers
// through rec, and joins; the test's cleanup closes it.
func join(t *testing.T, store ha.Store, rec *sim.Recorder, id string) *ha.Replica {
	t.Helper()
	r, err := ha.New(store, options(id))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	if err := registerControllers(rec.Controllers(r)); err != nil {
		t.Fatal(err)
	}
	if err := r.Join(context.Background()); err != nil {
		t.Fatal(err)
	}
	return r
}

// runningOn returns how many of the service's controllers run on r.
func runningOn(r *ha.Replica) int {
	n := 0
	for _, name := range controllerNames {
		if r.Running(name) {
			n++
		}
	}
	return n
}
