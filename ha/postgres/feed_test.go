// The feed: woken by a notification long before its poll, ending an
// unrenewed session on time by itself, and failing honestly, as HeldAt
// does, for positions its log pruned.

package postgres

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/bgctl/controller/ha"
)

// feedBackend returns a backend of replica id in group on st, renewing
// (and so owing progress) every renewEvery.
func feedBackend(st *store, group, id string, renewEvery time.Duration) *backend {
	return st.backend(ha.BackendConfig{Group: group, ID: id, TTL: time.Second, RequestTimeout: 2 * time.Second, RenewEvery: renewEvery})
}

// watchGroup lists group on st as replica "reader", renewing (and so
// owing progress) every renewEvery, and starts its feed from the
// listing's position; the feed is stopped, and its goroutine waited for,
// when t ends.
func watchGroup(t *testing.T, st *store, group string, renewEvery time.Duration) (*backend, ha.Feed) {
	t.Helper()
	reader := feedBackend(st, group, "reader", renewEvery)
	_, from, err := reader.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	f := reader.Watch(from, &wg)
	t.Cleanup(func() {
		f.Stop()
		wg.Wait()
	})
	return reader, f
}

// nextChanges returns the next batch of f with changes or an error,
// failing the test after within.
func nextChanges(t *testing.T, f ha.Feed, within time.Duration) ha.FeedBatch {
	t.Helper()
	timeout := time.After(within)
	for {
		select {
		case fb := <-f.Batches():
			if len(fb.Changes) > 0 || fb.Err != nil {
				return fb
			}
		case <-timeout:
			t.Fatalf("the feed delivered no change in %v", within)
		}
	}
}

// A change reaches a feed at once, by its notification: the poll and
// the progress are 30 s apart here.
func TestFeedIsWokenByANotification(t *testing.T) {
	t.Parallel()
	st, err := newStore(newPool(t, 4), StoreOptions{Poll: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	group := newGroup("notify")
	ctx := context.Background()
	a := feedBackend(st, group, "r0", 30*time.Second)
	s, err := a.Begin(ctx, 0, 5*time.Second, "d")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = a.End(ctx, s.ID) }()
	_, f := watchGroup(t, st, group, 30*time.Second)
	time.Sleep(200 * time.Millisecond) // the feed waits on its notifications
	claimed := time.Now()
	if _, _, err := a.Claim(ctx, s.ID, []string{"x"}); err != nil {
		t.Fatal(err)
	}
	fb := nextChanges(t, f, 3*time.Second)
	if fb.Err != nil || fb.Changes[0].Kind != ha.ClaimPut || fb.Changes[0].Name != "x" {
		t.Fatalf("the feed delivered %+v, want x claimed", fb)
	}
	t.Logf("the claim reached the feed %v after it was made", time.Since(claimed).Round(time.Millisecond))
}

// A session nobody renews and nobody else writes after is ended by the
// feed itself, as soon as it runs out on the server's clock, and never
// before: its end comes in one batch.
func TestFeedEndsAnUnrenewedSessionOnTime(t *testing.T) {
	t.Parallel()
	st, err := newStore(newPool(t, 4), StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	group := newGroup("expiry")
	ctx := context.Background()
	a := feedBackend(st, group, "r0", time.Second)
	const ttl = time.Second
	sent := time.Now()
	s, err := a.Begin(ctx, 0, ttl, "d")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.Claim(ctx, s.ID, []string{"x", "y"}); err != nil {
		t.Fatal(err)
	}
	_, f := watchGroup(t, st, group, time.Second)
	fb := nextChanges(t, f, ttl+3*time.Second)
	got := time.Since(sent)
	if fb.Err != nil || len(fb.Changes) != 3 {
		t.Fatalf("the feed delivered %+v; want r0's end: its member record and two holdings, in one batch", fb)
	}
	if got < ttl {
		t.Errorf("the session's end came %v after its begin, before its TTL %v", got, ttl)
	}
	t.Logf("the unrenewed session's end came %v after its begin (TTL %v)", got.Round(time.Millisecond), ttl)
}

// Positions the change log pruned are refused: HeldAt fails with
// ErrPruned, and a feed started there fails with it, for its caller to
// list again; a position after the pruned ones still answers.
func TestPrunedPositionsAreRefused(t *testing.T) {
	t.Parallel()
	st, err := newStore(newPool(t, 4), StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st.retention = 100 * time.Millisecond // below what StoreOptions allows: the test's alone
	group := newGroup("pruned")
	ctx := context.Background()
	a := feedBackend(st, group, "r0", 50*time.Millisecond)
	s, err := a.Begin(ctx, 0, 5*time.Second, "d")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = a.End(ctx, s.ID) }()
	if _, _, err := a.Claim(ctx, s.ID, []string{"x"}); err != nil {
		t.Fatal(err)
	}
	early := s.JoinedAt
	var wg sync.WaitGroup
	f := a.Watch(early, &wg) // its polls prune the log
	for deadline := time.After(400 * time.Millisecond); ; {
		select {
		case fb := <-f.Batches():
			if fb.Err != nil {
				t.Fatalf("the feed failed while it pruned: %v", fb.Err)
			}
			continue
		case <-deadline:
		}
		break
	}
	f.Stop()
	wg.Wait()
	if names, err := a.HeldAt(ctx, early); !errors.Is(err, ErrPruned) {
		t.Errorf("HeldAt(%d) after the log was pruned = %v, %v; want ErrPruned", early, names, err)
	}
	f = a.Watch(early, &wg)
	defer wg.Wait()
	defer f.Stop()
	if fb := nextChanges(t, f, 3*time.Second); !errors.Is(fb.Err, ErrPruned) {
		t.Errorf("a feed from pruned position %d delivered %+v; want it failed with ErrPruned", early, fb)
	}
	_, at, err := a.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if names, err := a.HeldAt(ctx, at); err != nil || !names["x"] {
		t.Errorf("HeldAt(%d), the listing's position = %v, %v; want x", at, names, err)
	}
}

// A position that goes back under a feed (a server that lost commits, as
// a failover to a standby behind the primary does) fails the feed with
// ErrPositionWentBack, for the replica to list again, instead of
// stalling it until the position passes the old one.
func TestFeedFailsWhenThePositionGoesBack(t *testing.T) {
	t.Parallel()
	st, err := newStore(newPool(t, 4), StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	group := newGroup("back")
	ctx := context.Background()
	a := feedBackend(st, group, "r0", 100*time.Millisecond)
	s, err := a.Begin(ctx, 0, 5*time.Second, "d")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = a.End(ctx, s.ID) }()
	if _, _, err := a.Claim(ctx, s.ID, []string{"x"}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	f := a.Watch(s.JoinedAt, &wg)
	defer wg.Wait()
	defer f.Stop()
	if fb := nextChanges(t, f, 3*time.Second); fb.Err != nil {
		t.Fatal(fb.Err)
	}
	// The commits after the session's begin lost.
	if _, err := st.pool.Exec(ctx, st.q.sql(`UPDATE {s}.groups SET pos = $2 WHERE grp = $1`), group, s.JoinedAt); err != nil {
		t.Fatal(err)
	}
	if fb := nextChanges(t, f, 3*time.Second); !errors.Is(fb.Err, ErrPositionWentBack) {
		t.Errorf("the feed after its group's position went back delivered %+v; want it failed with ErrPositionWentBack", fb)
	}
}
