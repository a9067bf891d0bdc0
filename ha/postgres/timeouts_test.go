// Timeouts of statements and transactions: the server's own, set low on
// the store's role; a user's long transaction holding what Held locked
// while its replica is cut off; and the store's statements hanging on a
// lock another connection holds.

package postgres

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/bgctl/controller"
	"github.com/bgctl/controller/ha"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The server's timeouts set low on the role the store connects as (for
// its user code, say): the store's transactions set their own
// statement and lock timeouts, so that a first request waiting for the
// schema's lock and a write waiting for the group's row wait past the
// role's; the replicas spread, crash and leave without overlap. Without
// those, each wait fails with the server's lock timeout (55P03).
func TestReplicasWorkUnderLowServerTimeouts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin := newPool(t, 2)
	role := fmt.Sprintf("low_timeouts_%d", groupSeq.Add(1))
	for _, stmt := range []string{
		"CREATE ROLE " + role + " LOGIN SUPERUSER",
		"ALTER ROLE " + role + " SET statement_timeout = '100ms'",
		"ALTER ROLE " + role + " SET lock_timeout = '50ms'",
		"ALTER ROLE " + role + " SET idle_in_transaction_session_timeout = '100ms'",
	} {
		if _, err := admin.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	pool := newPoolOn(t, fmt.Sprintf("postgres://%s@127.0.0.1:%d/postgres?sslmode=disable", role, testServer.Port), 16)
	var settings string
	if err := pool.QueryRow(ctx, "SELECT current_setting('statement_timeout') || ' ' || current_setting('lock_timeout') || ' ' || current_setting('idle_in_transaction_session_timeout')").Scan(&settings); err != nil {
		t.Fatal(err)
	}
	if settings != "100ms 50ms 100ms" {
		t.Fatalf("the role's timeouts: %q, want 100ms 50ms 100ms", settings)
	}
	group := newGroup("timeouts")

	// A store's first request, a Begin, waits 300ms for the schema's
	// lock, and another Begin as long for the group's row, held by
	// another transaction: past the role's lock_timeout and
	// statement_timeout.
	st := newPoolStore(t, pool)
	b := st.backend(ha.BackendConfig{Group: group, ID: "r9", TTL: 5 * time.Second})
	beginAndEnd := func() error {
		s, err := b.Begin(ctx, 0, 5*time.Second, "d")
		if err == nil {
			err = b.End(ctx, s.ID)
		}
		return err
	}
	if err := whileLocked(t, admin, beginAndEnd, sqlSchemaLock, defaultSchema); err != nil {
		t.Fatalf("a store's first Begin, which waited for the schema's lock: %v", err)
	}
	if err := whileLocked(t, admin, beginAndEnd, "SELECT 1 FROM bgctl_ha.groups WHERE grp = $1 FOR UPDATE", group); err != nil {
		t.Fatalf("a Begin which waited for the group's row: %v", err)
	}

	replicas, rec, _ := joinThree(t, Store(pool, StoreOptions{}), group)
	await(t, 20*time.Second, "every name on one replica, each running some", func() bool { return spreadOver(replicas) })
	crashThenLeave(t, replicas, rec)
}

// A DoFunc that keeps a long transaction busy after Held (a statement
// every 50ms, each ignoring its context, then a commit once its context
// ended) holds its session's end off
// while its replica is cut off from the server, but no longer than the
// bound Held set: idle for a TTL, the server ends the transaction, and
// the waiting replica takes the names. Nothing the long transaction
// wrote commits.
func TestLongFencedTransactionHoldsTheTakeoverOffATTLAtMost(t *testing.T) {
	t.Parallel()
	direct := newPool(t, 8)
	group := newGroup("longtx")
	table, ids := newWriteTable(t, direct, group)
	cutPool, proxy := proxiedPool(t, testServer, 8)
	defer proxy.heal() // before the pools close: the long transactions end

	var mu sync.Mutex
	var longErrs []error // guarded by mu: how each long transaction ended
	r0, err := ha.New(Store(cutPool, StoreOptions{}), pausedOptions(group, "r0"))
	if err != nil {
		t.Fatal(err)
	}
	defer r0.Close()
	for _, name := range pausedNames {
		_ = r0.UpdateController(name, controller.ControllerParams{DoFunc: func(ctx context.Context) error {
			claim, _ := ha.ClaimFrom(ctx)
			bg := context.Background() // the transaction ignores ctx
			err := pgx.BeginFunc(bg, cutPool, func(tx pgx.Tx) error {
				if err := Held(bg, tx, claim); err != nil {
					return err
				}
				for ctx.Err() == nil {
					if _, err := tx.Exec(bg, "INSERT INTO "+table+" (name, writer) VALUES ($1, 'r0')", claim.Name); err != nil {
						return err
					}
					time.Sleep(50 * time.Millisecond)
				}
				return nil // its work done: commit
			})
			mu.Lock()
			longErrs = append(longErrs, err)
			mu.Unlock()
			return nil
		}})
	}
	if err := r0.Join(context.Background()); err != nil {
		t.Fatal(err)
	}
	await(t, 10*time.Second, "r0 running every name", func() bool { return allRunning(r0, pausedNames) })

	joinFencedHolder(t, context.Background(), direct, group, table, func(n string) {
		t.Errorf("r1, the new holder, was refused for %s", n)
	})
	time.Sleep(200 * time.Millisecond) // the long transactions write on
	cut := time.Now()
	proxy.cut()
	await(t, pausedTTL+5*time.Second, "r1 writing every name after r0 was cut off", func() bool { return len(ids("min", "r1")) == len(pausedNames) })
	t.Logf("r1 wrote every name %v after r0 was cut off inside its long transactions (TTL %v)", time.Since(cut).Round(10*time.Millisecond), pausedTTL)
	proxy.heal()
	await(t, 20*time.Second, "r0's long transactions ending after the heal", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(longErrs) == len(pausedNames)
	})
	mu.Lock()
	for _, err := range longErrs {
		var pe *pgconn.PgError
		if err == nil {
			t.Error("a long transaction of r0 committed after it was cut off")
		} else if !errors.As(err, &pe) || pe.Code != "25P03" {
			t.Logf("a long transaction of r0 ended with %v (not the server's idle-in-transaction timeout)", err)
		}
	}
	mu.Unlock()
	if n := len(ids("min", "r0")); n != 0 {
		t.Errorf("rows of r0's long transactions committed for %d names", n)
	}
}

// newPoolStore returns a store of its own on pool, with the default
// options.
func newPoolStore(t *testing.T, pool *pgxpool.Pool) *store {
	t.Helper()
	st, err := newStore(pool, StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// whileLocked runs request while a transaction of admin holds the lock
// lock takes, which it lets go after 300ms, and returns request's error.
func whileLocked(t *testing.T, admin *pgxpool.Pool, request func() error, lock string, args ...any) error {
	t.Helper()
	ctx := context.Background()
	holder, err := admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Rollback(ctx) }()
	if _, err := holder.Exec(ctx, lock, args...); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- request() }()  // joined below: <-done
	time.Sleep(300 * time.Millisecond) // the lock held
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	return <-done
}

// allRunning reports whether r runs every one of names.
func allRunning(r *ha.Replica, names []string) bool {
	for _, name := range names {
		if !r.Running(name) {
			return false
		}
	}
	return true
}

// The store's statements hang on locks another connection holds, on a
// replica's session row (its renewals) and the group's row (every
// write): its renewals time out by their context, its fence stops its
// names, its Close returns within its bound, and once the locks go its
// names run elsewhere, never on two replicas at once.
func TestHangingStatementsTimeOutAndTheReplicaFencesItself(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t, 16)
	group := newGroup("hanging")
	replicas, rec, once := joinThree(t, Store(pool, StoreOptions{}), group)
	await(t, 20*time.Second, "every name on one replica, each running some", func() bool { return spreadOver(replicas) })
	victim := replicas["r1"]

	locker, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = locker.Rollback(ctx) }()
	var session int64
	if err := locker.QueryRow(ctx, "SELECT id FROM bgctl_ha.sessions WHERE grp = $1 AND member = 'r1' FOR UPDATE", group).Scan(&session); err != nil {
		t.Fatalf("locking r1's session row: %v", err)
	}
	if _, err := locker.Exec(ctx, "SELECT pos FROM bgctl_ha.groups WHERE grp = $1 FOR UPDATE", group); err != nil {
		t.Fatalf("locking the group's row: %v", err)
	}
	locked := time.Now()
	await(t, 5*time.Second, "a statement of the store's waiting on the locks", func() bool {
		var waiting bool
		err := pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%bgctl_ha%' AND pid <> pg_backend_pid())").Scan(&waiting)
		return err == nil && waiting
	})
	await(t, replicaTTL+5*time.Second, "r1 running nothing while its renewals hang", func() bool { return len(runningOn(victim)) == 0 })
	t.Logf("r1 ran nothing %v after its session row was locked (TTL %v); its health: %v", time.Since(locked).Round(10*time.Millisecond), replicaTTL, victim.Health())
	closeWithinTTL(t, victim, "r1", "while its statements hang")
	delete(replicas, "r1")
	if err := locker.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	released := time.Now()
	await(t, replicaTTL+5*time.Second, "every name on r0 or r2 once the locks went", once)
	t.Logf("r1's names ran on r0 and r2 %v after the locks went", time.Since(released).Round(10*time.Millisecond))
	if o := rec.Overlaps(); len(o) > 0 {
		t.Errorf("names ran on two replicas at once: %v", o)
	}
}
