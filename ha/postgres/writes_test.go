// Counting what a pool sends the server: its statements, its renewals,
// its write transactions (those that lock the group's row) and the
// statements sent in them, and the rows its statements wrote. The scale
// and measurement tests read these counts before and after what they
// time.

package postgres

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
)

// writeCounts are the counts of a writeTracer, or the difference of two.
type writeCounts struct {
	Statements int64 // every statement, begin and commit included
	Renewals   int64 // sqlRenew: a write of one row, outside any transaction
	WriteTxs   int64 // transactions that locked the group's row: every other write
	InWrites   int64 // statements sent in those, from the lock to the commit or rollback
	Rows       int64 // rows inserted, updated or deleted, as the server answered
}

// sub returns c less before.
func (c writeCounts) sub(before writeCounts) writeCounts {
	return writeCounts{
		Statements: c.Statements - before.Statements,
		Renewals:   c.Renewals - before.Renewals,
		WriteTxs:   c.WriteTxs - before.WriteTxs,
		InWrites:   c.InWrites - before.InWrites,
		Rows:       c.Rows - before.Rows,
	}
}

// add returns c plus o.
func (c writeCounts) add(o writeCounts) writeCounts {
	return c.sub(writeCounts{}.sub(o))
}

// String is the counts on one line.
func (c writeCounts) String() string {
	return fmt.Sprintf("%d statements, %d renewals, %d write transactions of %d statements, %d rows written", c.Statements, c.Renewals, c.WriteTxs, c.InWrites, c.Rows)
}

// writeTracer counts what the connections of a pool send (writeCounts);
// its methods are called by pgx on each connection's goroutine.
type writeTracer struct {
	lock, renew string // the store's statements that start a write, and renew

	mu      sync.Mutex
	n       writeCounts        // guarded by mu
	writing map[*pgx.Conn]bool // guarded by mu: the connections inside a write transaction
}

// newWriteTracer returns a tracer of the statements of the store on
// schema (the default's when "").
func newWriteTracer(schema string) *writeTracer {
	q := queriesFor(pgx.Identifier{cmp.Or(schema, defaultSchema)}.Sanitize())
	return &writeTracer{lock: q.sql(sqlLockGroup), renew: q.sql(sqlRenew), writing: map[*pgx.Conn]bool{}}
}

// TraceQueryStart counts the statement.
func (w *writeTracer) TraceQueryStart(ctx context.Context, conn *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.n.Statements++
	switch {
	case d.SQL == w.renew:
		w.n.Renewals++
	case d.SQL == w.lock:
		w.n.WriteTxs++
		w.writing[conn] = true
	}
	if w.writing[conn] {
		w.n.InWrites++
		if end := strings.ToLower(d.SQL); end == "commit" || end == "rollback" {
			delete(w.writing, conn)
		}
	}
	return ctx
}

// TraceQueryEnd counts the rows the statement wrote.
func (w *writeTracer) TraceQueryEnd(_ context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	if tag := d.CommandTag; tag.Insert() || tag.Update() || tag.Delete() {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.n.Rows += tag.RowsAffected()
	}
}

// counts returns the counts so far.
func (w *writeTracer) counts() writeCounts {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n
}
