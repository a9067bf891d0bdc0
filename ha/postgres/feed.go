// The feed: the change log read by position on a connection of its own,
// woken by LISTEN/NOTIFY and polled as a fallback, which also ends the
// sessions due on time and prunes the log.

package postgres

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/bgctl/controller/ha"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

const (
	// sqlNextExpiry reads how long until the next session not yet due
	// runs out (-1: none), and how many are due. Only those not yet due
	// count for the wait: one that is due and stays (a fenced
	// transaction holds its row, and the expiry skips it) would
	// otherwise keep the feed from waking for the next one's end.
	sqlNextExpiry = `SELECT coalesce(floor(extract(epoch FROM min(expires_at) FILTER (WHERE expires_at > clock_timestamp()) - clock_timestamp()) * 1000000)::bigint, -1), count(*) FILTER (WHERE expires_at <= clock_timestamp()) FROM {s}.sessions WHERE grp = $1`
	sqlChanges    = `SELECT pos, kind, member, name, session, created, digest, leaving, idx, count, data FROM {s}.changes WHERE grp = $1 AND pos > $2 AND pos <= $3 ORDER BY pos`
	sqlPrune      = `WITH cut AS (SELECT max(pos) AS pos FROM {s}.changes WHERE grp = $1 AND logged_at < clock_timestamp() - $2::bigint * interval '1 microsecond'),
	gone AS (DELETE FROM {s}.changes WHERE grp = $1 AND pos <= (SELECT pos FROM cut))
UPDATE {s}.groups SET pruned = greatest(pruned, (SELECT pos FROM cut)) WHERE grp = $1 AND (SELECT pos FROM cut) IS NOT NULL`
)

// feedPage is how many positions a feed reads at once at most.
const feedPage = 512

// feed is one replica's feed of its group's changes (backend.Watch).
type feed struct {
	out    chan ha.FeedBatch  // unbuffered: the goroutine hands each batch over
	cancel context.CancelFunc // called by Stop: ends the goroutine's requests and waits
	done   chan struct{}      // closed as the feed's goroutine returns
}

// Batches is where the feed delivers.
func (f *feed) Batches() <-chan ha.FeedBatch { return f.out }

// Stop ends the feed and waits for its goroutine.
func (f *feed) Stop() {
	f.cancel()
	<-f.done
}

// Watch starts the feed of the group's changes after position from. Its
// goroutine takes a connection of the pool for itself (LISTEN), which it
// closes as it ends; it is counted in wg, and ends when Stop returns.
func (b *backend) Watch(from int64, wg *sync.WaitGroup) ha.Feed {
	ctx, cancel := context.WithCancel(context.Background())
	f := &feed{out: make(chan ha.FeedBatch), cancel: cancel, done: make(chan struct{})}
	wg.Add(1)
	go func() { // owned by the feed; joined by Stop, and through wg
		defer wg.Done()
		defer close(f.done)
		err := b.follow(ctx, f, from)
		if err == nil || ctx.Err() != nil {
			return
		}
		select {
		case f.out <- ha.FeedBatch{Err: fmt.Errorf("postgres: the feed of group %q: %w", b.cfg.Group, err)}:
		case <-ctx.Done():
		}
	}()
	return f
}

// follow delivers the change log after position from to f until ctx
// ends or a request fails (its error). Each turn it ends the sessions
// due (a write transaction, only when one is), reads the log's next
// positions at one snapshot and delivers them in one batch, or a batch
// of progress alone once RenewEvery passed since the last; then it
// waits for a notification, the next session's end, the next progress,
// or StoreOptions.Poll, whichever comes first.
func (b *backend) follow(ctx context.Context, f *feed, from int64) error {
	if err := b.st.ready(ctx); err != nil {
		return err
	}
	var pc *pgxpool.Conn
	if err := b.query(ctx, func(ctx context.Context) (err error) {
		pc, err = b.st.pool.Acquire(ctx) // bounded: a pool user code exhausted fails the feed
		return err
	}); err != nil {
		return err
	}
	conn := pc.Hijack() // closed below: a LISTENing connection never goes back to the pool
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), b.cfg.RequestTimeout)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	if err := b.query(ctx, func(ctx context.Context) error {
		_, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{b.st.schema}.Sanitize())
		return err
	}); err != nil {
		return err
	}
	last := from
	delivered := time.Now()
	pruned := time.Now()
	for {
		var due time.Duration // until the next session's end; < 0: none
		var expired int
		if err := b.query(ctx, func(ctx context.Context) error {
			var us int64
			err := conn.QueryRow(ctx, b.st.q.sql(sqlNextExpiry), b.cfg.Group).Scan(&us, &expired)
			due = time.Duration(us) * time.Microsecond
			return err
		}); err != nil {
			return err
		}
		if expired > 0 {
			if err := b.query(ctx, func(ctx context.Context) error {
				return b.write(ctx, func(context.Context, *writeTx) error { return nil })
			}); err != nil {
				return err
			}
		}
		if time.Since(pruned) > b.st.retention/4 {
			if err := b.query(ctx, func(ctx context.Context) error {
				_, err := conn.Exec(ctx, b.st.q.sql(sqlPrune), b.cfg.Group, micros(b.st.retention))
				return err
			}); err != nil {
				return err
			}
			pruned = time.Now()
		}
		batch, err := b.readLog(ctx, conn, last)
		if err != nil {
			return err
		}
		if len(batch.Changes) > 0 || time.Since(delivered) >= b.cfg.RenewEvery {
			select {
			case f.out <- batch:
			case <-ctx.Done():
				return nil
			}
			last, delivered = max(last, batch.At), time.Now()
			if len(batch.Changes) > 0 {
				continue // more may follow at once
			}
		}
		wait := min(b.st.poll, b.cfg.RenewEvery-time.Since(delivered))
		if due >= 0 {
			wait = min(wait, due+time.Millisecond)
		}
		wctx, cancel := context.WithTimeout(ctx, max(wait, time.Millisecond))
		_, err = conn.WaitForNotification(wctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil && !pgconn.Timeout(err):
			return err
		}
	}
}

// query runs one request of the feed, bounded by RequestTimeout.
func (b *backend) query(ctx context.Context, f func(ctx context.Context) error) error {
	rctx, cancel := context.WithTimeout(ctx, b.cfg.RequestTimeout)
	defer cancel()
	return f(rctx)
}

// readLog reads the log's changes after position last, up to feedPage
// positions, and the group's position, at one snapshot: a batch that
// says it delivered everything up to its At. It fails with ErrPruned
// when the log no longer holds the positions after last.
func (b *backend) readLog(ctx context.Context, conn *pgx.Conn, last int64) (ha.FeedBatch, error) {
	var fb ha.FeedBatch
	err := b.query(ctx, func(ctx context.Context) error {
		return pgx.BeginTxFunc(ctx, conn, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
			var pos, pruned int64
			if err := tx.QueryRow(ctx, b.st.q.sql(sqlGroupPos), b.cfg.Group).Scan(&pos, &pruned); err != nil {
				return err
			}
			if last < pruned {
				return fmt.Errorf("position %d, the log holds positions after %d: %w", last, pruned, ErrPruned)
			}
			if pos < last {
				// Positions only grow: a server that lost commits (a
				// failover to a standby behind the primary) answers
				// less than was delivered. Listed again, the replica
				// takes the group as it now stands.
				return fmt.Errorf("the group's position went back from %d to %d: %w", last, pos, ErrPositionWentBack)
			}
			fb = ha.FeedBatch{At: max(pos, last)}
			if pos <= last {
				return nil
			}
			upTo := min(pos, last+feedPage)
			fb.At = upTo
			rows, err := tx.Query(ctx, b.st.q.sql(sqlChanges), b.cfg.Group, last, upTo)
			if err != nil {
				return err
			}
			var c ha.Change
			var kind int16
			var data []byte
			_, err = pgx.ForEachRow(rows, []any{&c.At, &kind, &c.Member, &c.Name, &c.Session, &c.Created, &c.Digest, &c.Leaving, &c.Chunk.Index, &c.Chunk.Count, &data}, func() error {
				fb.Changes = append(fb.Changes, logged(c, ha.ChangeKind(kind), data))
				return nil
			})
			return err
		})
	})
	return fb, err
}

// logged is the change a row of the change log holds: c as scanned,
// whose fields it arranges by kind.
func logged(c ha.Change, kind ha.ChangeKind, data []byte) ha.Change {
	c.Kind = kind
	switch kind {
	case ha.ChunkPut, ha.ChunkGone:
		c.Chunk.Member, c.Chunk.Digest = c.Member, c.Digest
		c.Member, c.Digest = "", ""
		if kind == ha.ChunkPut {
			c.Chunk.Data = append([]byte{}, data...)
		}
	default:
		c.Chunk = ha.Chunk{}
	}
	return c
}
