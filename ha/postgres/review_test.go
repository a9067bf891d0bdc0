// The store under hostile conditions: a session that ran out while a
// fenced transaction holds its row, a schema being made while a call's
// context ends, a server that stops answering in the middle of a write,
// a write whose client gave up, bad input, and three replicas making the
// schema at once.

package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/bgctl/controller/ha"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A session that ran out on the server's clock is ended for every write
// made under it, even while a fenced transaction (Held) holds its row
// and so keeps the expiry from deleting it: no holding is made, no set
// published, no member record written under it.
func TestNoWriteUnderASessionThatRanOut(t *testing.T) {
	t.Parallel()
	f := newHeldFixture(t)
	ctx := context.Background()
	const ttl = 500 * time.Millisecond
	b, s, claims := f.member(t, "r0", ttl, "x")
	// The fenced transaction busy until well after the session ran out.
	busy(t, f.heldTx(t, claims["x"]), 2*time.Second)
	time.Sleep(ttl + 200*time.Millisecond) // run out: no renewal
	if got, absent, err := b.Claim(ctx, s.ID, []string{"y"}); !errors.Is(err, ha.ErrSessionEnded) {
		t.Errorf("a claim under a session that ran out = %+v, absent %v, %v; want ErrSessionEnded", got, absent, err)
	}
	if err := b.Publish(ctx, s.ID, "d2", "d", [][]byte{[]byte("y")}); !errors.Is(err, ha.ErrSessionEnded) {
		t.Errorf("a publish under a session that ran out: %v; want ErrSessionEnded", err)
	}
	if written, err := b.PutMember(ctx, s.ID, "d3", true); written || !errors.Is(err, ha.ErrSessionEnded) {
		t.Errorf("a member record rewritten under a session that ran out: written %v, %v; want ErrSessionEnded", written, err)
	}
}

// A call that comes while another call of the store is making the
// schema (held up here by a migration holding the store's advisory
// lock) returns when its own context ends, not when the other's does.
func TestSetupWaitEndsWithTheContext(t *testing.T) {
	t.Parallel()
	pool := newPool(t, 4)
	schema := newSchema("setup_wait")
	st, err := newStore(pool, StoreOptions{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	migration, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = migration.Rollback(ctx) }()
	if _, err := migration.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('github.com/bgctl/controller/ha/postgres ' || $1))`, schema); err != nil {
		t.Fatal(err)
	}
	b := st.backend(ha.BackendConfig{Group: newGroup("setup"), ID: "r0", TTL: time.Second})
	long, cancelLong := context.WithTimeout(ctx, 10*time.Second)
	defer cancelLong()
	first := make(chan error, 1)
	go func() { // joined below: <-first
		_, err := b.Renew(long, 1)
		first <- err
	}()
	defer func() { <-first }()
	defer cancelLong()
	await(t, 5*time.Second, "the first call waiting on the advisory lock", func() bool {
		var waiting bool
		err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted)`).Scan(&waiting)
		return err == nil && waiting
	})
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancelShort()
	start := time.Now()
	err = b.End(short, 1)
	if waited := time.Since(start); waited > 2*time.Second {
		t.Errorf("End with a 300ms context returned after %v (%v), waiting for another call's schema setup", waited.Round(time.Millisecond), err)
	}
	if err == nil {
		t.Error("End succeeded while the schema could not be made")
	}
}

// A write that fails between two statements (its context's deadline
// passed there) just as the server stops answering returns within
// RequestTimeout: its rollback is bounded too.
func TestFailedWriteReturnsWhileTheServerStopsAnswering(t *testing.T) {
	t.Parallel()
	st, err := newStore(newPool(t, 4), StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	const requestTimeout = time.Second
	b := st.backend(ha.BackendConfig{Group: newGroup("stopped"), ID: "r0", TTL: time.Second, RequestTimeout: requestTimeout})
	var pid int
	defer func() {
		if pid != 0 {
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := make(chan error, 1)
	start := time.Now()
	go func() { // joined below: <-done
		done <- b.write(ctx, func(ctx context.Context, w *writeTx) error {
			if err := w.tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
				return err
			}
			if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
				return err
			}
			cancel() // the deadline passes between two statements
			_, err := w.tx.Exec(ctx, "SELECT 1")
			return err
		})
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Error("the write succeeded")
		}
		t.Logf("the write returned %v after it failed (%v)", time.Since(start).Round(time.Millisecond), err)
	case <-time.After(requestTimeout + 3*time.Second):
		t.Errorf("the write still hangs %v after it failed, on a server that stopped answering", time.Since(start).Round(time.Millisecond))
		_ = syscall.Kill(pid, syscall.SIGCONT)
		<-done
	}
}

// A write whose client gave up (its context ended while it waited for a
// lock: a release waiting for a fenced transaction) stops waiting on the
// server too, by then: it holds the group's other writes off no longer
// than its context, although the transaction it waits for goes on.
func TestAWriteGivenUpHoldsTheGroupNoLonger(t *testing.T) {
	t.Parallel()
	f := newHeldFixture(t)
	ctx := context.Background()
	a, sa, claims := f.member(t, "r0", 5*time.Second, "x")
	defer func() { _ = a.End(ctx, sa.ID) }()
	busy(t, f.heldTx(t, claims["x"]), 4*time.Second) // a slow fenced transaction
	rctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	if err := a.Release(rctx, claims["x"]); err == nil {
		t.Fatal("a release of a name a fenced transaction holds returned before it")
	}
	other := f.st.backend(ha.BackendConfig{Group: f.group, ID: "r1", TTL: 5 * time.Second})
	bctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	start := time.Now()
	s, err := other.Begin(bctx, 0, 5*time.Second, "d")
	if err != nil {
		t.Fatalf("another replica's begin after a release gave up: %v (after %v)", err, time.Since(start).Round(time.Millisecond))
	}
	defer func() { _ = other.End(ctx, s.ID) }()
	t.Logf("another replica's begin took %v after the release gave up", time.Since(start).Round(time.Millisecond))
}

// Held refuses a nil transaction with an error, rather than a panic.
func TestHeldRefusesANilTransaction(t *testing.T) {
	t.Parallel()
	f := newHeldFixture(t)
	_, _, claims := f.member(t, "r0", 5*time.Second, "x")
	if err := Held(context.Background(), nil, claims["x"]); err == nil || !strings.Contains(err.Error(), "nil") {
		t.Errorf("Held on a nil transaction: %v; want an error naming it", err)
	}
}

// Three replicas (three stores, as three processes have) starting at
// once on a database without the schema: each begins, the schema is
// made once.
func TestSchemaMadeOnceByThreeReplicasAtOnce(t *testing.T) {
	t.Parallel()
	schema := newSchema("three")
	group := newGroup("three")
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range errs {
		st, err := newStore(newPool(t, 2), StoreOptions{Schema: schema})
		if err != nil {
			t.Fatal(err)
		}
		b := st.backend(ha.BackendConfig{Group: group, ID: "r" + string(rune('0'+i)), TTL: 5 * time.Second})
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			s, err := b.Begin(ctx, 0, 5*time.Second, "d")
			if err == nil {
				err = b.End(ctx, s.ID)
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("replica r%d on a schema made at once by three: %v", i, err)
		}
	}
}

// A schema that holds tables of the store's names the store did not make
// (no schema_version: a user's own "sessions" in the schema named,
// public say) is refused, naming the schema and the table, rather than
// written to, or failing later with a column's name.
func TestSchemaWithForeignTablesIsRefused(t *testing.T) {
	t.Parallel()
	pool := newPool(t, 2)
	schema := newSchema("foreign")
	for _, stmt := range []string{"CREATE SCHEMA " + schema, "CREATE TABLE " + schema + ".sessions (id bigint PRIMARY KEY, user_name text)"} {
		if _, err := pool.Exec(context.Background(), stmt); err != nil {
			t.Fatal(err)
		}
	}
	err := beginIn(t, schema)
	if err == nil || !strings.Contains(err.Error(), `"`+schema+`"`) || !strings.Contains(err.Error(), "sessions") {
		t.Errorf("a store on a schema with a user's own sessions table: %v; want it refused, naming the schema and the table", err)
	}
}

// A group or an ID that PostgreSQL's text cannot hold (a NUL byte,
// invalid UTF-8) is refused by ha.New, naming the field, rather than
// failing every request of the replica.
func TestGroupAndIDTextCannotHoldAreRefused(t *testing.T) {
	t.Parallel()
	st := Store(newPool(t, 1), StoreOptions{})
	for _, c := range []struct {
		cfg  ha.BackendConfig
		want string
	}{
		{ha.BackendConfig{Group: "g\x00", ID: "r0"}, "Prefix"},
		{ha.BackendConfig{Group: "g\xff", ID: "r0"}, "Prefix"},
		{ha.BackendConfig{Group: "g", ID: "r\xff"}, "ID"},
	} {
		if _, err := st.Backend(c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("a backend of group %q, ID %q: %v; want an error naming %s", c.cfg.Group, c.cfg.ID, err, c.want)
		}
	}
}

// A fenced transaction at REPEATABLE READ whose snapshot was taken
// before the session ended (a read of the user's came first) does not
// pass Held, and writes nothing.
func TestHeldAtRepeatableReadRefusesASessionEndedAfterTheSnapshot(t *testing.T) {
	t.Parallel()
	f := newHeldFixture(t)
	ctx := context.Background()
	for _, iso := range []pgx.TxIsoLevel{pgx.RepeatableRead, pgx.Serializable} {
		a, sa, claims := f.member(t, "r0", 5*time.Second, "x")
		tx, err := f.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, "SELECT count(*) FROM "+f.table); err != nil { // the snapshot
			t.Fatal(err)
		}
		if err := a.End(ctx, sa.ID); err != nil {
			t.Fatal(err)
		}
		err = Held(ctx, tx, claims["x"])
		if err == nil {
			_, err = tx.Exec(ctx, "INSERT INTO "+f.table+" VALUES ('x', 'r0')")
			if err == nil {
				err = tx.Commit(ctx)
			}
		}
		_ = tx.Rollback(ctx)
		if err == nil {
			t.Errorf("%s: a fenced write after the session ended (snapshot before) committed", iso)
		}
		t.Logf("%s: %v", iso, err)
	}
	if n := f.writes(t, "r0"); n != 0 {
		t.Errorf("rows written after the session ended: %d", n)
	}
}

// A replica's renewal goes through while one of its fenced transactions
// is open (Held locks the session's row FOR KEY SHARE, which a renewal
// does not wait for).
func TestRenewalGoesOnUnderAFencedTransaction(t *testing.T) {
	t.Parallel()
	f := newHeldFixture(t)
	a, sa, claims := f.member(t, "r0", 5*time.Second, "x")
	busy(t, f.heldTx(t, claims["x"]), 1500*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := a.Renew(ctx, sa.ID); err != nil {
		t.Errorf("a renewal under the replica's own fenced transaction: %v", err)
	}
}

// A change whose notification never came (written here without one)
// reaches the feed by its poll.
func TestFeedPollsForAChangeNotNotified(t *testing.T) {
	t.Parallel()
	// A schema of its own: no other test's notifications wake the feed.
	st, err := newStore(newPool(t, 4), StoreOptions{Schema: newSchema("poll"), Poll: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	group := newGroup("poll")
	ctx := context.Background()
	reader, f := watchGroup(t, st, group, 30*time.Second)
	// logGone logs name's holding gone, notifying the feeds or not.
	logGone := func(name string, notify bool) {
		err := reader.write(ctx, func(ctx context.Context, w *writeTx) error {
			pos, err := w.next(ctx)
			if err != nil {
				return err
			}
			w.changed = notify
			_, err = w.tx.Exec(ctx, st.q.sql(sqlLogGone), group, pos, "r9", name, 9, 1)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	// A change notified, then one not: the feed, which delivered the
	// first, waits on its notifications (or reads again at once, a
	// race the poll then does not decide).
	logGone("w", true)
	if fb := nextChanges(t, f, 3*time.Second); fb.Err != nil || fb.Changes[0].Name != "w" {
		t.Fatalf("the feed delivered %+v; want w's holding gone", fb)
	}
	logGone("x", false)
	written := time.Now()
	fb := nextChanges(t, f, 3*time.Second)
	if fb.Err != nil || fb.Changes[0].Kind != ha.ClaimGone || fb.Changes[0].Name != "x" {
		t.Fatalf("the feed delivered %+v; want x's holding gone", fb)
	}
	t.Logf("the change reached the feed %v after it was written, without a notification (poll 300ms)", time.Since(written).Round(time.Millisecond))
}

// Under writers racing one another (begins, claims, releases, ends), a
// feed delivers every change the log holds, each once, in the order of
// the positions, each batch's changes after the previous batch's At and
// at or before its own: none committed at a lower position after the
// feed passed it.
func TestFeedMissesNoChangeUnderConcurrentWrites(t *testing.T) {
	t.Parallel()
	st, err := newStore(newPool(t, 12), StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	group := newGroup("race")
	ctx := context.Background()
	reader := feedBackend(st, group, "reader", 100*time.Millisecond)
	var feedWG sync.WaitGroup
	f := reader.Watch(0, &feedWG)
	defer feedWG.Wait()
	defer f.Stop()

	var writers sync.WaitGroup
	stop := time.Now().Add(1500 * time.Millisecond)
	for w := range 6 {
		b := feedBackend(st, group, fmt.Sprintf("w%d", w), time.Second)
		writers.Go(func() {
			for i := 0; time.Now().Before(stop); i++ {
				s, err := b.Begin(ctx, 0, 5*time.Second, "d")
				if err != nil {
					t.Error(err)
					return
				}
				names := []string{fmt.Sprintf("n%d", i%5), fmt.Sprintf("m%d-%d", w, i)}
				got, _, err := b.Claim(ctx, s.ID, names)
				if err != nil {
					t.Error(err)
				}
				for _, c := range got {
					if c.Mine && i%2 == 0 {
						if err := b.Release(ctx, ha.Claim{Name: c.Name, Key: c.Key, Revision: c.Revision, Token: c.Token}); err != nil {
							t.Error(err)
						}
					}
				}
				if err := b.End(ctx, s.ID); err != nil {
					t.Error(err)
				}
			}
		})
	}
	writers.Wait()

	type row struct {
		at         int64
		kind       ha.ChangeKind
		member     string
		name       string
		session    ha.SessionID
		chunkIndex int
	}
	var logged []row
	rows, err := st.pool.Query(ctx, st.q.sql(`SELECT pos, kind, member, name, session, idx FROM {s}.changes WHERE grp = $1 ORDER BY pos, kind, member, name, session, idx`), group)
	if err != nil {
		t.Fatal(err)
	}
	var r row
	var kind int16
	if _, err := pgx.ForEachRow(rows, []any{&r.at, &kind, &r.member, &r.name, &r.session, &r.chunkIndex}, func() error {
		r.kind = ha.ChangeKind(kind)
		logged = append(logged, r)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	last := logged[len(logged)-1].at

	var delivered []row
	var at int64
	for timeout := time.After(10 * time.Second); at < last; {
		select {
		case fb := <-f.Batches():
			if fb.Err != nil {
				t.Fatalf("the feed failed: %v", fb.Err)
			}
			for _, c := range fb.Changes {
				if c.At <= at || c.At > fb.At {
					t.Fatalf("a change at %d in a batch after %d, up to %d", c.At, at, fb.At)
				}
				delivered = append(delivered, row{c.At, c.Kind, c.Member, c.Name, c.Session, c.Chunk.Index})
			}
			at = fb.At
		case <-timeout:
			t.Fatalf("the feed delivered up to %d in 10s, the log holds up to %d", at, last)
		}
	}
	slices.SortStableFunc(delivered, func(a, b row) int {
		return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.kind, b.kind), cmp.Compare(a.member, b.member), cmp.Compare(a.name, b.name), cmp.Compare(a.session, b.session), cmp.Compare(a.chunkIndex, b.chunkIndex))
	})
	if !slices.Equal(delivered, logged) {
		t.Errorf("the feed delivered %d changes, the log holds %d; they differ", len(delivered), len(logged))
	}
	t.Logf("%d changes at %d positions, by 6 writers, all delivered once, in order", len(logged), last)
}

// A session that ran out but cannot be ended yet (a fenced transaction
// holds its row) does not keep the feed from waking for the next
// session's end: that one is delivered on time, not at the next poll.
func TestFeedEndsTheNextSessionOnTimeBesideOneHeldPastItsEnd(t *testing.T) {
	t.Parallel()
	f := newHeldFixture(t)
	// A schema of its own: no other test's notifications wake the feed.
	st, err := newStore(f.pool, StoreOptions{Schema: newSchema("next_due"), Poll: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	f.st = st
	_, _, claims := f.member(t, "held", 300*time.Millisecond, "x")
	busy(t, f.heldTx(t, claims["x"]), 4*time.Second) // x's session runs out, its row held
	const ttl = 1500 * time.Millisecond
	next, s, _ := f.member(t, "next", ttl, "y")
	begun := time.Now()
	_, feed := watchGroup(t, st, f.group, 30*time.Second)
	fb := nextChanges(t, feed, 2*ttl)
	if fb.Err != nil || len(fb.Changes) == 0 || fb.Changes[0].Session != s.ID {
		t.Fatalf("the feed delivered %+v; want the end of %s's session %d", fb, next.cfg.ID, s.ID)
	}
	t.Logf("the next session's end came %v after its begin (TTL %v)", time.Since(begun).Round(time.Millisecond), ttl)
}

// A database whose default isolation is SERIALIZABLE (a server's or a
// role's setting, or the DSN's) changes nothing for the store: three
// replicas make the schema at once, and race one another's claims,
// without a serialization error; the store's writes run at READ
// COMMITTED, which its arguments assume (a write that waited for the
// group's row reads what the one before it committed).
func TestStoreIgnoresTheDefaultIsolation(t *testing.T) {
	t.Parallel()
	schema := newSchema("serializable")
	group := newGroup("serializable")
	var wg sync.WaitGroup
	errs := make(chan error, 3*20)
	for i := range 3 {
		cfg, err := pgxpool.ParseConfig(testServer.DSN)
		if err != nil {
			t.Fatal(err)
		}
		cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = "serializable"
		pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		st, err := newStore(pool, StoreOptions{Schema: schema})
		if err != nil {
			t.Fatal(err)
		}
		b := st.backend(ha.BackendConfig{Group: group, ID: fmt.Sprintf("r%d", i), TTL: 5 * time.Second})
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			s, err := b.Begin(ctx, 0, 5*time.Second, "d")
			if err != nil {
				errs <- err
				return
			}
			for j := range 20 {
				if _, _, err := b.Claim(ctx, s.ID, []string{fmt.Sprintf("n%d", j)}); err != nil {
					errs <- err
				}
			}
			if err := b.End(ctx, s.ID); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("a replica on a pool whose default isolation is serializable: %v", err)
	}
}

// A schema named like an SQL keyword works: the store quotes it
// everywhere (statements, LISTEN, the claim's key in Held).
func TestSchemaNamedLikeAKeyword(t *testing.T) {
	t.Parallel()
	f := newHeldFixture(t)
	st, err := newStore(f.pool, StoreOptions{Schema: "order", Poll: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	f.st = st
	ctx := context.Background()
	_, feed := watchGroup(t, st, f.group, 30*time.Second)
	a, s, claims := f.member(t, "r0", 5*time.Second, "x")
	defer func() { _ = a.End(ctx, s.ID) }()
	if err := f.fencedWrite(ctx, claims["x"], "r0"); err != nil {
		t.Errorf("a fenced write on schema \"order\": %v", err)
	}
	if fb := nextChanges(t, feed, 3*time.Second); fb.Err != nil {
		t.Errorf("the feed on schema \"order\": %v", fb.Err)
	}
}

// A nil pool is refused by ha.New, naming it.
func TestNilPoolIsRefused(t *testing.T) {
	if _, err := ha.New(Store(nil, StoreOptions{}), ha.Options{Prefix: "g", ID: "r0"}); err == nil || !strings.Contains(err.Error(), "pool is nil") {
		t.Errorf("ha.New on a store of a nil pool: %v; want an error naming the pool", err)
	}
}
