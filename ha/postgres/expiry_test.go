// A renewal and an expiry of one session never both succeed: either
// the renewal wins and the session lives its new validity, or the
// expiry wins and the renewal says it ended.

package postgres

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/bgctl/controller/ha"
)

// The two orders, held open at the moment that matters. A renewal
// uncommitted when the session runs out, then committed while an expiry
// waits on its row: the expiry leaves the renewed session alone. An
// expiry uncommitted while a renewal waits: the renewal says the session
// ended.
func TestRenewalAndExpiryInEitherOrder(t *testing.T) {
	t.Parallel()
	st, err := newStore(newPool(t, 8), StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const ttl = 600 * time.Millisecond
	begin := func() (*backend, ha.Session) {
		b := st.backend(ha.BackendConfig{Group: newGroup("order"), ID: "r0", TTL: ttl})
		s, err := b.Begin(ctx, 0, ttl, "d")
		if err != nil {
			t.Fatal(err)
		}
		return b, s
	}

	t.Run("RenewalFirst", func(t *testing.T) {
		b, s := begin()
		defer func() { _ = b.End(ctx, s.ID) }()
		renewal, err := st.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = renewal.Rollback(ctx) }()
		// Renew's statement, late in the validity (it extends it by
		// 5/6 of a TTL), in a transaction held open.
		time.Sleep(5 * ttl / 6)
		if err := renewal.QueryRow(ctx, st.q.sql(sqlRenew), int64(s.ID), b.cfg.Group).Scan(new(int64)); err != nil {
			t.Fatalf("the renewal: %v", err)
		}
		time.Sleep(ttl/6 + 50*time.Millisecond) // the committed row has run out
		expiry := make(chan error, 1)
		go func() { // joined below: <-expiry
			expiry <- b.write(ctx, func(context.Context, *writeTx) error { return nil })
		}()
		time.Sleep(ttl / 6) // the expiry meets the renewal's row lock
		if err := renewal.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-expiry; err != nil {
			t.Fatal(err)
		}
		if under, found, err := b.MemberSession(ctx); err != nil || !found || under != s.ID {
			t.Errorf("after a renewal committed under a waiting expiry, the record is under %d (found %v, %v); want the renewed session %d", under, found, err, s.ID)
		}
		if _, err := b.Renew(ctx, s.ID); err != nil {
			t.Errorf("the renewed session's next renewal: %v", err)
		}
	})

	t.Run("ExpiryFirst", func(t *testing.T) {
		b, s := begin()
		time.Sleep(ttl + 50*time.Millisecond)
		// An expiry's transaction, held open after its delete.
		tx, err := st.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		w := &writeTx{tx: tx, b: b}
		if err := w.lock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := w.expireDue(ctx); err != nil {
			t.Fatal(err)
		}
		renewed := make(chan error, 1)
		go func() { // joined below: <-renewed
			_, err := b.Renew(ctx, s.ID)
			renewed <- err
		}()
		time.Sleep(100 * time.Millisecond) // the renewal meets the expiry's row lock
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-renewed; !errors.Is(err, ha.ErrSessionEnded) {
			t.Errorf("a renewal waiting on an expiry that committed: %v; want ErrSessionEnded", err)
		}
	})
}

// A write transaction of the store frozen with the group's row locked (a
// replica paused inside a write) holds the group's other writes off for
// about its RequestTimeout at most: the server ends it, idle.
func TestFrozenWriteHoldsTheGroupOffBriefly(t *testing.T) {
	t.Parallel()
	st, err := newStore(newPool(t, 4), StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	group := newGroup("frozenwrite")
	frozenB := st.backend(ha.BackendConfig{Group: group, ID: "r0", TTL: 5 * time.Second, RequestTimeout: time.Second})
	if err := frozenB.write(ctx, func(context.Context, *writeTx) error { return nil }); err != nil {
		t.Fatal(err) // the group's row made
	}
	tx, err := st.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	w := &writeTx{tx: tx, b: frozenB}
	if err := w.lock(ctx); err != nil {
		t.Fatal(err)
	}
	frozen := time.Now() // from here the transaction sends nothing
	other := st.backend(ha.BackendConfig{Group: group, ID: "r1", TTL: 5 * time.Second})
	bctx, cancel := context.WithTimeout(ctx, 6*time.Second)
	defer cancel()
	s, err := other.Begin(bctx, 0, 5*time.Second, "d")
	if err != nil {
		t.Fatalf("a begin while another replica's write is frozen: %v", err)
	}
	defer func() { _ = other.End(ctx, s.ID) }()
	if waited := time.Since(frozen); waited > 3*time.Second {
		t.Errorf("the begin waited %v for the frozen write; want about its RequestTimeout, 1s", waited)
	}
	t.Logf("the begin waited %v for the frozen write (RequestTimeout 1s)", time.Since(frozen).Round(10*time.Millisecond))
}
