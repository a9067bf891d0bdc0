// The contract of a backend (backend.go), stated once as tests and run
// against every backend: etcd's, on the real etcd the tests start and in
// real time, and the in-memory one, inside a testing/synctest bubble,
// exact and instant. So far the sessions: the part of the seam that is
// cut.

package ha

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"testing/synctest"
	"time"
)

// conformanceTTL is the sessions' TTL in the suite: etcd's shortest that
// its default election timeout allows, and whole seconds, as etcd counts.
const conformanceTTL = 2 * time.Second

// conformanceStore is one fresh group on one backend: backendFor returns
// the backend of a replica with that ID.
type conformanceStore struct {
	backendFor func(id string) backend
	// slack is how much later than the TTL a session may end: a second
	// on etcd, which truncates remaining TTLs to whole seconds and
	// checks expiry every 500ms; none in memory.
	slack time.Duration
}

// conformanceCases are the contract, one case each.
var conformanceCases = []struct {
	name string
	test func(t *testing.T, st conformanceStore)
}{
	{"BeginRenewEnd", conformBeginRenewEnd},
	{"DuplicateIDRefusedWhileLive", conformDuplicateID},
	{"BeginMovesTheRecordFromPrevOnly", conformMoveFromPrev},
	{"UnrenewedSessionEnds", conformExpiry},
	{"RenewalKeepsTheSession", conformRenewalKeeps},
}

// Each case against etcd, every case in a group of its own.
func TestBackendConformanceEtcd(t *testing.T) {
	needEtcd(t)
	cli := newClient(t, testEtcd)
	t.Cleanup(func() { cli.Close() }) // after the parallel subtests, unlike a defer
	for _, tc := range conformanceCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel() // each in a group of its own; the waits overlap
			prefix := fmt.Sprintf("/test/conformance/%s/%d", tc.name, time.Now().UnixNano())
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			tc.test(t, conformanceStore{
				backendFor: func(id string) backend {
					opts := Options{ID: id, RequestTimeout: 2 * time.Second}
					return newEtcdBackend(cli, opts, keysOf(prefix), slog.New(slog.DiscardHandler), ctx)
				},
				slack: time.Second,
			})
		})
	}
}

// Each case against the in-memory backend, in a bubble of its own.
func TestBackendConformanceMemory(t *testing.T) {
	for _, tc := range conformanceCases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				st := newMemStore()
				tc.test(t, conformanceStore{backendFor: func(id string) backend { return st.replica(id, 2*time.Second) }})
			})
		})
	}
}

// beginR0 begins a session of replica r0, or fails the test.
func beginR0(t *testing.T, st conformanceStore) (backend, session) {
	t.Helper()
	b := st.backendFor("r0")
	s, err := b.begin(context.Background(), 0, conformanceTTL, "digest")
	if err != nil {
		t.Fatalf("begin: %v", err)
	}
	return b, s
}

// A session begins valid from a moment taken before its request, is
// renewed for its TTL, is the member record's, and once ended is known
// to be: renew, end and timeLeft say errSessionEnded, and the record is
// gone.
func conformBeginRenewEnd(t *testing.T, st conformanceStore) {
	ctx := context.Background()
	b := st.backendFor("r0")
	before := time.Now()
	s, err := b.begin(ctx, 0, conformanceTTL, "digest")
	if err != nil {
		t.Fatalf("begin: %v", err)
	}
	if s.id == 0 || s.sent.Before(before) || s.sent.After(time.Now()) {
		t.Errorf("begin = %+v: want a session ID, sent between the call and its return", s)
	}
	if id, found, err := b.memberSession(ctx); err != nil || !found || id != s.id {
		t.Errorf("memberSession = %d, %v, %v; want %d, true", id, found, err, s.id)
	}
	valid, err := b.renew(ctx, s.id)
	if err != nil || valid > conformanceTTL || valid < conformanceTTL-st.slack {
		t.Errorf("renew = %v, %v; want the TTL %v (less at most %v)", valid, err, conformanceTTL, st.slack)
	}
	left, granted, err := b.timeLeft(ctx, s.id)
	if err != nil || granted != conformanceTTL || left > granted || left < conformanceTTL-st.slack {
		t.Errorf("timeLeft = %v of %v, %v; want about %v of %v", left, granted, err, conformanceTTL, conformanceTTL)
	}
	if err := b.end(ctx, s.id); err != nil {
		t.Fatalf("end: %v", err)
	}
	if _, err := b.renew(ctx, s.id); !errors.Is(err, errSessionEnded) {
		t.Errorf("renew after end: %v, want errSessionEnded", err)
	}
	if err := b.end(ctx, s.id); !errors.Is(err, errSessionEnded) {
		t.Errorf("end after end: %v, want errSessionEnded", err)
	}
	if _, _, err := b.timeLeft(ctx, s.id); !errors.Is(err, errSessionEnded) {
		t.Errorf("timeLeft after end: %v, want errSessionEnded", err)
	}
	if id, found, err := b.memberSession(ctx); err != nil || found {
		t.Errorf("memberSession after end = %d, %v, %v; want none", id, found, err)
	}
}

// A second replica with the same ID cannot begin while the first's
// session lives (ErrDuplicateID, and the first keeps its record); it can
// once that session ended.
func conformDuplicateID(t *testing.T, st conformanceStore) {
	ctx := context.Background()
	first, second := st.backendFor("r0"), st.backendFor("r0")
	s, err := first.begin(ctx, 0, conformanceTTL, "digest")
	if err != nil {
		t.Fatalf("begin: %v", err)
	}
	if _, err := second.begin(ctx, 0, conformanceTTL, "digest"); !errors.Is(err, ErrDuplicateID) {
		t.Fatalf("a second begin of r0: %v, want ErrDuplicateID", err)
	}
	if id, found, _ := first.memberSession(ctx); !found || id != s.id {
		t.Errorf("after the refused begin the record is under %d (found %v), want %d", id, found, s.id)
	}
	if _, err := first.renew(ctx, s.id); err != nil {
		t.Errorf("the first session after the refused begin: %v", err)
	}
	if err := first.end(ctx, s.id); err != nil {
		t.Fatal(err)
	}
	s2, err := second.begin(ctx, 0, conformanceTTL, "digest")
	if err != nil {
		t.Fatalf("begin after the first session ended: %v", err)
	}
	_ = second.end(ctx, s2.id)
}

// begin with prev moves the member record from prev to the new session,
// but only while it is under prev: a record under another session
// refuses it.
func conformMoveFromPrev(t *testing.T, st conformanceStore) {
	ctx := context.Background()
	b, s1 := beginR0(t, st)
	s2, err := b.begin(ctx, s1.id, conformanceTTL, "digest")
	if err != nil {
		t.Fatalf("begin from the previous session: %v", err)
	}
	if s2.id == s1.id {
		t.Fatalf("begin from %d returned the same session", s1.id)
	}
	if id, found, _ := b.memberSession(ctx); !found || id != s2.id {
		t.Errorf("the record is under %d (found %v), want the new session %d", id, found, s2.id)
	}
	if _, err := b.begin(ctx, s1.id, conformanceTTL, "digest"); !errors.Is(err, ErrDuplicateID) {
		t.Errorf("begin from %d while the record is under %d: %v, want ErrDuplicateID", s1.id, s2.id, err)
	}
	_ = b.end(ctx, s1.id)
	_ = b.end(ctx, s2.id)
}

// A session nobody renews ends within its TTL (and the store's slack),
// and its member record goes with it: another replica with its ID may
// begin.
func conformExpiry(t *testing.T, st conformanceStore) {
	ctx := context.Background()
	b, s := beginR0(t, st)
	time.Sleep(conformanceTTL + st.slack)
	if _, err := b.renew(ctx, s.id); !errors.Is(err, errSessionEnded) {
		t.Errorf("renew %v after begin, unrenewed: %v, want errSessionEnded", conformanceTTL+st.slack, err)
	}
	if _, found, err := b.memberSession(ctx); err != nil || found {
		t.Errorf("the member record of an expired session: found %v, %v", found, err)
	}
	s2, err := st.backendFor("r0").begin(ctx, 0, conformanceTTL, "digest")
	if err != nil {
		t.Fatalf("begin after the session expired: %v", err)
	}
	_ = b.end(ctx, s2.id)
}

// A session renewed more often than its TTL outlives it several times
// over.
func conformRenewalKeeps(t *testing.T, st conformanceStore) {
	ctx := context.Background()
	b, s := beginR0(t, st)
	for range 6 {
		time.Sleep(conformanceTTL / 2)
		if _, err := b.renew(ctx, s.id); err != nil {
			t.Fatalf("renew every half TTL: %v", err)
		}
	}
	if id, found, _ := b.memberSession(ctx); !found || id != s.id {
		t.Errorf("after 3 TTLs of renewals the record is under %d (found %v), want %d", id, found, s.id)
	}
	_ = b.end(ctx, s.id)
}

// What only the in-memory backend can show, being able to lose an
// answer: a renewal whose answer was lost still renewed, so the caller
// may go on with the session; a begin whose answer was lost leaves a
// session the caller does not know, whose record refuses the next begin
// until it expires (which is why the etcd backend ends what it began
// when its write fails).
func TestMemoryBackendFaults(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		st := newMemStore()
		b := st.replica("r0", time.Second)
		s, err := b.begin(ctx, 0, conformanceTTL, "d")
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(conformanceTTL * 3 / 4)
		st.inject("renew", memFault{lost: true})
		if _, err := b.renew(ctx, s.id); err == nil {
			t.Fatal("a renewal whose answer was lost returned no error")
		}
		st.inject("renew", memFault{})
		time.Sleep(conformanceTTL / 2) // past the first grant's end
		if _, err := b.renew(ctx, s.id); err != nil {
			t.Errorf("the session after a renewal whose answer was lost: %v", err)
		}
		_ = b.end(ctx, s.id)

		st.inject("begin", memFault{lost: true})
		if _, err := b.begin(ctx, 0, conformanceTTL, "d"); err == nil {
			t.Fatal("a begin whose answer was lost returned no error")
		}
		st.inject("begin", memFault{})
		if _, err := b.begin(ctx, 0, conformanceTTL, "d"); !errors.Is(err, ErrDuplicateID) {
			t.Errorf("begin after a lost one: %v, want ErrDuplicateID while the unknown session lives", err)
		}
		time.Sleep(conformanceTTL)
		if _, err := b.begin(ctx, 0, conformanceTTL, "d"); err != nil {
			t.Errorf("begin once the unknown session expired: %v", err)
		}
		if want := []string{"r0 1 ended", "r0 2 expired"}; fmt.Sprint(st.ended) != fmt.Sprint(want) {
			t.Errorf("sessions ended: %q, want %q", st.ended, want)
		}
	})
}
