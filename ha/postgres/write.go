// A write transaction of a group: the counter row that orders it and
// gives its positions, the expiry of the sessions due that it carries
// out first, and the notification that wakes the feeds.

package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/bgctl/controller/ha"
	"github.com/jackc/pgx/v5"
)

// queries writes the store's SQL for one schema: "{s}" in a text stands
// for the quoted schema.
type queries struct {
	schema string // quoted: pgx.Identifier.Sanitize
}

// queriesFor returns the queries of quoted schema.
func queriesFor(schema string) queries { return queries{schema: schema} }

// sql returns text with {s} replaced by the schema.
func (q queries) sql(text string) string { return strings.ReplaceAll(text, "{s}", q.schema) }

// writeTx is one write transaction of the group. The lock on the
// group's counter row, taken first, orders every write transaction of
// the group: the positions they take commit in their order, and no
// session of the group is ended, nor any record written, by another
// transaction meanwhile. Used by the goroutine that runs it alone.
type writeTx struct {
	tx      pgx.Tx
	b       *backend
	pos     int64 // the group's position: its last write's, or this transaction's last
	changed bool  // a change was logged: the feeds are notified at commit
}

// writeBound is the server's bound, in ms, on a write transaction's
// statements, lock waits and idle time: the request's, at least a
// second.
func (b *backend) writeBound() int64 { return max(b.cfg.RequestTimeout, time.Second).Milliseconds() }

// beginBounded is the BEGIN of the store's own transactions (its writes
// and its schema check): at READ COMMITTED whatever the database's
// default isolation, as the arguments of DESIGN.md assume that each
// statement reads what committed before it, so that a write that waited
// for the group's row (or the schema's advisory lock) sees the one
// before it (at REPEATABLE READ or SERIALIZABLE, a default a server, a
// role or a DSN may set, it would fail with a serialization error
// instead, or read the schema's version from before it was written);
// and setting the server's statement_timeout and lock_timeout for the
// transaction to ms (0: none, the request's context alone bounds it), in
// the same round trip. A role or a database may set them low for user code; the
// store's statements are short, but its writes wait their turn for the
// group's row and its first request for the schema's lock, waits its
// requests' contexts already bound. DESIGN.md, "Partitions and
// timeouts".
func beginBounded(ms int64) string {
	return fmt.Sprintf("BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL statement_timeout = %d; SET LOCAL lock_timeout = %d", ms, ms)
}

// Expiry and a renewal of one session cannot both succeed: the expiry
// locks the session row and deletes it only while expires_at has passed
// on the server's clock (a renewal committed first moved it: the row is
// re-read and left); a renewal updates the row only while expires_at
// has not passed (an expiry committed first deleted it: nothing to
// update). A session row a renewal or Held is holding is skipped, and
// expired at a later write. DESIGN.md, "Expiry".
const (
	// sqlLockGroup locks the group's row and, in the same statement,
	// bounds how long the transaction may sit idle while it holds it
	// to $2 ms: a replica frozen inside a write never holds the
	// group's writes off for longer.
	sqlLockGroup   = `SELECT pos, set_config('idle_in_transaction_session_timeout', $2::bigint::text, true) FROM {s}.groups WHERE grp = $1 FOR UPDATE`
	sqlAddGroup    = `INSERT INTO {s}.groups (grp) VALUES ($1) ON CONFLICT DO NOTHING`
	sqlNextPos     = `UPDATE {s}.groups SET pos = pos + 1 WHERE grp = $1 RETURNING pos`
	sqlExpireDue   = `DELETE FROM {s}.sessions WHERE id IN (SELECT id FROM {s}.sessions WHERE grp = $1 AND expires_at <= clock_timestamp() FOR UPDATE SKIP LOCKED) AND expires_at <= clock_timestamp() RETURNING id`
	sqlEndSession  = `DELETE FROM {s}.sessions WHERE id = $1 AND grp = $2 RETURNING id`
	sqlDropRecords = `WITH m AS (DELETE FROM {s}.members WHERE grp = $1 AND session = $2 RETURNING member),
	c AS (DELETE FROM {s}.claims WHERE grp = $1 AND session = $2 RETURNING name, holder, created),
	k AS (DELETE FROM {s}.chunks WHERE grp = $1 AND session = $2 RETURNING member, digest, idx, count)
INSERT INTO {s}.changes (grp, pos, kind, member, name, session, created, digest, idx, count)
SELECT $1::text, $3::bigint, 1::smallint, member, ''::text, $2::bigint, 0::bigint, ''::text, 0, 0 FROM m
UNION ALL SELECT $1, $3, 3, holder, name, $2, created, '', 0, 0 FROM c
UNION ALL SELECT $1, $3, 5, member, '', $2, 0, digest, idx, count FROM k`
	sqlNotify = `SELECT pg_notify($1, $2)`
)

// refusal reports whether err is an answer of the store's (a session
// ended, an ID taken), after which the transaction still commits what
// it did: the expiry it carried out stays carried out.
func refusal(err error) bool {
	return errors.Is(err, ha.ErrSessionEnded) || errors.Is(err, ha.ErrDuplicateID)
}

// write runs f in a write transaction of the group, after locking the
// group's counter row and ending the sessions that are due. It commits
// when f returns nil or a refusal (which it then returns), and rolls
// back on any other error.
func (b *backend) write(ctx context.Context, f func(ctx context.Context, w *writeTx) error) error {
	if err := b.st.ready(ctx); err != nil {
		return err
	}
	tx, err := b.st.pool.BeginTx(ctx, pgx.TxOptions{BeginQuery: beginBounded(b.writeBound())})
	if err != nil {
		return err
	}
	defer func() {
		// After Commit, does nothing. Bounded by RequestTimeout of its
		// own: ctx may have ended already (that may be why f failed),
		// and a rollback without a deadline, sent as the server stops
		// answering, would wait for it for good.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.cfg.RequestTimeout)
		defer cancel()
		_ = tx.Rollback(rctx)
	}()
	w := &writeTx{tx: tx, b: b}
	if err := w.lock(ctx); err != nil {
		return err
	}
	if err := w.expireDue(ctx); err != nil {
		return err
	}
	ferr := f(ctx, w)
	if ferr != nil && !refusal(ferr) {
		return ferr
	}
	if w.changed {
		if _, err := tx.Exec(ctx, sqlNotify, b.st.schema, b.cfg.Group); err != nil {
			return err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	return ferr
}

// lock takes the group's counter row, creating it if missing, and reads
// the group's position.
func (w *writeTx) lock(ctx context.Context) error {
	q := w.b.st.q
	err := w.tx.QueryRow(ctx, q.sql(sqlLockGroup), w.b.cfg.Group, w.b.writeBound()).Scan(&w.pos, new(string))
	if errors.Is(err, pgx.ErrNoRows) {
		if _, err := w.tx.Exec(ctx, q.sql(sqlAddGroup), w.b.cfg.Group); err != nil {
			return err
		}
		err = w.tx.QueryRow(ctx, q.sql(sqlLockGroup), w.b.cfg.Group, w.b.writeBound()).Scan(&w.pos, new(string))
	}
	if err != nil {
		return fmt.Errorf("locking group %q: %w", w.b.cfg.Group, err)
	}
	return nil
}

// next takes the group's next position for this transaction's next
// change, and marks the feeds to be notified.
func (w *writeTx) next(ctx context.Context) (int64, error) {
	if err := w.tx.QueryRow(ctx, w.b.st.q.sql(sqlNextPos), w.b.cfg.Group).Scan(&w.pos); err != nil {
		return 0, err
	}
	w.changed = true
	return w.pos, nil
}

// expireDue ends every session of the group whose validity has passed
// on the server's clock, each at a position of its own.
func (w *writeTx) expireDue(ctx context.Context) error {
	rows, err := w.tx.Query(ctx, w.b.st.q.sql(sqlExpireDue), w.b.cfg.Group)
	if err != nil {
		return err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return err
	}
	for _, id := range ids {
		if err := w.dropRecords(ctx, ha.SessionID(id)); err != nil {
			return err
		}
	}
	return nil
}

// end ends live session id now: ErrSessionEnded when there is none.
func (w *writeTx) end(ctx context.Context, id ha.SessionID) error {
	rows, err := w.tx.Query(ctx, w.b.st.q.sql(sqlEndSession), int64(id), w.b.cfg.Group)
	if err != nil {
		return err
	}
	n, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return err
	}
	if len(n) == 0 {
		return fmt.Errorf("postgres: session %d: %w", id, ha.ErrSessionEnded)
	}
	return w.dropRecords(ctx, id)
}

// dropRecords deletes the member record, holdings and chunks of session
// id, whose row is gone, and logs their deletions at one new position:
// the feeds deliver them in one batch.
func (w *writeTx) dropRecords(ctx context.Context, id ha.SessionID) error {
	pos, err := w.next(ctx)
	if err != nil {
		return err
	}
	_, err = w.tx.Exec(ctx, w.b.st.q.sql(sqlDropRecords), w.b.cfg.Group, int64(id), pos)
	return err
}

// sqlAnyDue reads whether a session of the group has run out.
const sqlAnyDue = `SELECT EXISTS (SELECT 1 FROM {s}.sessions WHERE grp = $1 AND expires_at <= clock_timestamp())`

// expireIfDue ends the sessions of the group that have run out, by a
// write transaction, when a read finds any.
func (b *backend) expireIfDue(ctx context.Context) error {
	if err := b.st.ready(ctx); err != nil {
		return err
	}
	var due bool
	if err := b.st.pool.QueryRow(ctx, b.st.q.sql(sqlAnyDue), b.cfg.Group).Scan(&due); err != nil || !due {
		return err
	}
	return b.write(ctx, func(context.Context, *writeTx) error { return nil })
}
