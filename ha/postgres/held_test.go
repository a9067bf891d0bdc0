// Held: a user's write in the user's own transaction commits only while
// the claim holds, and a takeover waits for that transaction.

package postgres

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bgctl/controller/ha"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// heldFixture is one group on the test server with a user table, and
// the backends of two replicas.
type heldFixture struct {
	pool  *pgxpool.Pool
	table string // the user's table: one row per write, the name and who wrote it
	st    *store
	group string
}

// newHeldFixture makes a group and a user table of its own.
func newHeldFixture(t *testing.T) *heldFixture {
	t.Helper()
	f := &heldFixture{pool: newPool(t, 8), group: newGroup("held")}
	f.table = pgx.Identifier{"public", "writes_" + strconv.FormatInt(groupSeq.Add(1), 10)}.Sanitize()
	if _, err := f.pool.Exec(context.Background(), "CREATE TABLE "+f.table+" (name text, writer text)"); err != nil {
		t.Fatal(err)
	}
	var err error
	if f.st, err = newStore(f.pool, StoreOptions{}); err != nil {
		t.Fatal(err)
	}
	return f
}

// member begins a session of replica id with ttl and claims names.
func (f *heldFixture) member(t *testing.T, id string, ttl time.Duration, names ...string) (*backend, ha.Session, map[string]ha.Claim) {
	t.Helper()
	ctx := context.Background()
	b := f.st.backend(ha.BackendConfig{Group: f.group, ID: id, TTL: ttl})
	s, err := b.Begin(ctx, 0, ttl, "d")
	if err != nil {
		t.Fatal(err)
	}
	got, absent, err := b.Claim(ctx, s.ID, names)
	if err != nil || len(absent) > 0 {
		t.Fatalf("claim of %v = %+v, absent %v, %v", names, got, absent, err)
	}
	claims := map[string]ha.Claim{}
	for _, g := range got {
		if !g.Mine {
			t.Fatalf("claim of %v: %+v not ours", names, g)
		}
		claims[g.Name] = ha.Claim{Name: g.Name, Key: g.Key, Revision: g.Revision, Token: g.Token}
	}
	return b, s, claims
}

// fencedWrite writes a row for c by writer in a transaction guarded by
// Held, and commits it; the error of Held or of the commit.
func (f *heldFixture) fencedWrite(ctx context.Context, c ha.Claim, writer string) error {
	return pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
		if err := Held(ctx, tx, c); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "INSERT INTO "+f.table+" VALUES ($1, $2)", c.Name, writer)
		return err
	})
}

// heldTx begins a transaction on f's pool that passed Held for c; it is
// rolled back when t ends, unless it ended before.
func (f *heldFixture) heldTx(t *testing.T, c ha.Claim) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	tx, err := f.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	if err := Held(ctx, tx, c); err != nil {
		t.Fatal(err)
	}
	return tx
}

// busy keeps tx busy (not idle: the server's idle bound does not end
// it) for d, from a goroutine that t's end waits for.
func busy(t *testing.T, tx pgx.Tx, d time.Duration) {
	done := make(chan struct{})
	go func() { // joined when t ends
		defer close(done)
		_, _ = tx.Exec(context.Background(), "SELECT pg_sleep($1)", d.Seconds())
	}()
	t.Cleanup(func() { <-done })
}

// writes returns how many rows writer wrote.
func (f *heldFixture) writes(t *testing.T, writer string) int {
	t.Helper()
	var n int
	if err := f.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+f.table+" WHERE writer = $1", writer).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestHeldWriteCommitsWhileTheClaimHolds(t *testing.T) {
	t.Parallel()
	f := newHeldFixture(t)
	ctx := context.Background()
	b, s, claims := f.member(t, "r0", 5*time.Second, "x")
	if err := f.fencedWrite(ctx, claims["x"], "r0"); err != nil {
		t.Fatalf("a fenced write while x is held: %v", err)
	}
	if n := f.writes(t, "r0"); n != 1 {
		t.Fatalf("rows written while held: %d, want 1", n)
	}
	if err := b.End(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	if err := f.fencedWrite(ctx, claims["x"], "r0"); !errors.Is(err, ErrNotHeld) {
		t.Errorf("a fenced write after the session ended: %v, want ErrNotHeld", err)
	}
	if n := f.writes(t, "r0"); n != 1 {
		t.Errorf("rows written after the session ended: %d more", n-1)
	}
}

// A holder paused past its TTL (its session unrenewed, not yet deleted
// by anyone) writes nothing: Held counts the session's end on the
// server's clock, not only its row.
func TestHeldRefusesASessionThatRanOut(t *testing.T) {
	t.Parallel()
	f := newHeldFixture(t)
	ctx := context.Background()
	_, _, claims := f.member(t, "r0", 500*time.Millisecond, "x")
	time.Sleep(700 * time.Millisecond) // paused: no renewal, no other request of the group
	if err := f.fencedWrite(ctx, claims["x"], "r0"); !errors.Is(err, ErrNotHeld) {
		t.Errorf("a fenced write after the session ran out: %v, want ErrNotHeld", err)
	}
	if n := f.writes(t, "r0"); n != 0 {
		t.Errorf("rows written after the session ran out: %d", n)
	}
}

// A holding released and taken by another replica: the former holder's
// claim no longer passes Held, the new holder's does.
func TestHeldRefusesAFormerHolding(t *testing.T) {
	t.Parallel()
	f := newHeldFixture(t)
	ctx := context.Background()
	a, sa, old := f.member(t, "r0", 5*time.Second, "x")
	defer func() { _ = a.End(ctx, sa.ID) }()
	if err := a.Release(ctx, old["x"]); err != nil {
		t.Fatal(err)
	}
	b, sb, anew := f.member(t, "r1", 5*time.Second, "x")
	defer func() { _ = b.End(ctx, sb.ID) }()
	if err := f.fencedWrite(ctx, old["x"], "r0"); !errors.Is(err, ErrNotHeld) {
		t.Errorf("the former holder's fenced write: %v, want ErrNotHeld", err)
	}
	if err := f.fencedWrite(ctx, anew["x"], "r1"); err != nil {
		t.Errorf("the new holder's fenced write: %v", err)
	}
	if r0, r1 := f.writes(t, "r0"), f.writes(t, "r1"); r0 != 0 || r1 != 1 {
		t.Errorf("rows written by the former holder %d (want 0), by the new one %d (want 1)", r0, r1)
	}
	if err := f.fencedWrite(ctx, ha.Claim{Name: "x", Key: "not-a-key"}, "r2"); err == nil || !strings.Contains(err.Error(), "not-a-key") {
		t.Errorf("Held of a claim with a foreign key: %v; want it refused, naming the key", err)
	}
}

// A session's end waits for a transaction that passed Held: the write
// commits before the end does, so the next holder's claim comes after
// it, never beside it.
func TestHeldHoldsOffTheSessionsEnd(t *testing.T) {
	t.Parallel()
	f := newHeldFixture(t)
	ctx := context.Background()
	a, sa, claims := f.member(t, "r0", 5*time.Second, "x")
	tx := f.heldTx(t, claims["x"])
	ended := make(chan error, 1)
	go func() { ended <- a.End(ctx, sa.ID) }() // joined below: <-ended
	select {
	case err := <-ended:
		t.Fatalf("the session ended (%v) while a transaction that passed Held was open", err)
	case <-time.After(500 * time.Millisecond):
	}
	if _, err := tx.Exec(ctx, "INSERT INTO "+f.table+" VALUES ('x', 'r0')"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("the fenced transaction's commit: %v", err)
	}
	if err := <-ended; err != nil {
		t.Fatalf("end after the fenced transaction: %v", err)
	}
	b, sb, _ := f.member(t, "r1", 5*time.Second, "x") // free only now
	defer func() { _ = b.End(ctx, sb.ID) }()
	if n := f.writes(t, "r0"); n != 1 {
		t.Errorf("rows the fenced transaction wrote: %d, want 1", n)
	}
}

// A process frozen inside a transaction that passed Held (it sends
// nothing more) holds the session's end off for about a TTL at most: the
// server ends the idle transaction, the end goes through, and the
// frozen transaction's write never commits.
func TestHeldBoundsAFrozenTransaction(t *testing.T) {
	t.Parallel()
	f := newHeldFixture(t)
	ctx := context.Background()
	const ttl = time.Second
	a, sa, claims := f.member(t, "r0", ttl, "x")
	tx := f.heldTx(t, claims["x"])
	if _, err := tx.Exec(ctx, "INSERT INTO "+f.table+" VALUES ('x', 'r0')"); err != nil {
		t.Fatal(err)
	}
	frozen := time.Now() // from here the transaction sends nothing
	ectx, cancel := context.WithTimeout(ctx, ttl+5*time.Second)
	defer cancel()
	if err := a.End(ectx, sa.ID); err != nil {
		t.Fatalf("ending the session under a frozen transaction: %v", err)
	}
	t.Logf("the session ended %v after the transaction froze (TTL %v)", time.Since(frozen).Round(10*time.Millisecond), ttl)
	if waited := time.Since(frozen); waited < ttl/2 || waited > ttl+2*time.Second {
		t.Errorf("the session's end waited %v for the frozen transaction; want about its TTL %v", waited, ttl)
	}
	if err := tx.Commit(ctx); err == nil {
		t.Error("the frozen transaction committed after the session ended")
	}
	if n := f.writes(t, "r0"); n != 0 {
		t.Errorf("rows the frozen transaction wrote: %d, want none", n)
	}
}
