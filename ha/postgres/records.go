// Published sets, the listing of a group at one position, and the names
// held at an earlier position, read from the change log.

package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/bgctl/controller/ha"
	"github.com/jackc/pgx/v5"
)

const (
	sqlPutChunks = `WITH put AS (
	INSERT INTO {s}.chunks (grp, member, digest, idx, count, session, data, modified)
	SELECT $1, $2, $3, i - 1, $5, $4, d, $6 FROM unnest($7::bytea[]) WITH ORDINALITY AS c(d, i)
	ON CONFLICT (grp, member, digest, idx, count) DO UPDATE SET session = $4, data = excluded.data, modified = $6
	RETURNING idx, data)
INSERT INTO {s}.changes (grp, pos, kind, member, digest, idx, count, data, session)
SELECT $1, $6, 4, $2, $3, idx, $5, data, $4 FROM put`
	sqlWithdraw = `WITH gone AS (
	DELETE FROM {s}.chunks WHERE grp = $1 AND member = $2 AND ($3 = '' OR digest = $3) RETURNING digest, idx, count, session)
INSERT INTO {s}.changes (grp, pos, kind, member, digest, idx, count, session)
SELECT $1, $4, 5, $2, digest, idx, count, session FROM gone`
	sqlFetch      = `SELECT idx, count, data FROM {s}.chunks c JOIN {s}.sessions s ON s.id = c.session AND s.expires_at > clock_timestamp() WHERE c.grp = $1 AND c.member = $2 AND c.digest = $3`
	sqlGroupPos   = `SELECT coalesce((SELECT pos FROM {s}.groups WHERE grp = $1), 0), coalesce((SELECT pruned FROM {s}.groups WHERE grp = $1), 0)`
	sqlListMember = `SELECT member, session, created, modified, digest, leaving FROM {s}.members WHERE grp = $1`
	sqlListClaims = `SELECT name, holder, session, created FROM {s}.claims WHERE grp = $1`
	sqlListChunks = `SELECT member, digest, idx, count, data, modified FROM {s}.chunks WHERE grp = $1`
	sqlHeldAt     = `SELECT name FROM {s}.claims WHERE grp = $1 AND created <= $2
UNION SELECT name FROM {s}.changes WHERE grp = $1 AND kind = 3 AND pos > $2 AND created <= $2`
)

// Publish writes chunks as this replica's set with digest under session
// id and withdraws its set of digest old (every set, for a digest of
// ""), at one position, in one write transaction.
func (b *backend) Publish(ctx context.Context, id ha.SessionID, digest, old string, chunks [][]byte) error {
	ctx, cancel := b.Request(ctx)
	defer cancel()
	err := b.write(ctx, func(ctx context.Context, w *writeTx) error {
		if err := w.live(ctx, id); err != nil {
			return err
		}
		pos, err := w.next(ctx)
		if err != nil {
			return err
		}
		q := b.st.q
		if digest != "" && len(chunks) > 0 {
			data := make([][]byte, len(chunks))
			for i, c := range chunks {
				data[i] = append([]byte{}, c...) // never NULL
			}
			if _, err := w.tx.Exec(ctx, q.sql(sqlPutChunks), b.cfg.Group, b.cfg.ID, digest, int64(id), len(chunks), pos, data); err != nil {
				return err
			}
		}
		switch {
		case digest == "":
			_, err = w.tx.Exec(ctx, q.sql(sqlWithdraw), b.cfg.Group, b.cfg.ID, "", pos)
		case old != "" && old != digest:
			_, err = w.tx.Exec(ctx, q.sql(sqlWithdraw), b.cfg.Group, b.cfg.ID, old, pos)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("postgres: publishing set %q of %q: %w", digest, b.cfg.ID, err)
	}
	return nil
}

// readOnly runs f in a read-only REPEATABLE READ transaction: every
// statement of f reads the group at one snapshot, and so at one
// position.
func (b *backend) readOnly(ctx context.Context, f func(tx pgx.Tx) error) error {
	if err := b.st.ready(ctx); err != nil {
		return err
	}
	return pgx.BeginTxFunc(ctx, b.st.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, f)
}

// Fetch reads the chunks member published of its set with digest under
// a live session, and the group's position, at one snapshot.
func (b *backend) Fetch(ctx context.Context, member, digest string) (chunks []ha.Chunk, at int64, err error) {
	err = b.readOnly(ctx, func(tx pgx.Tx) error {
		chunks = nil
		if err := tx.QueryRow(ctx, b.st.q.sql(sqlGroupPos), b.cfg.Group).Scan(&at, new(int64)); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, b.st.q.sql(sqlFetch), b.cfg.Group, member, digest)
		if err != nil {
			return err
		}
		c := ha.Chunk{Member: member, Digest: digest}
		_, err = pgx.ForEachRow(rows, []any{&c.Index, &c.Count, &c.Data}, func() error {
			chunks = append(chunks, c)
			return nil
		})
		return err
	})
	if err != nil {
		return nil, 0, fmt.Errorf("postgres: fetching set %q of %q: %w", digest, member, err)
	}
	return chunks, at, nil
}

// List ends the sessions due (a write, when any is), then reads every
// member record, holding and chunk of the group at one snapshot, with
// the group's position.
func (b *backend) List(ctx context.Context) (records []ha.Change, at int64, err error) {
	ctx, cancel := b.Request(ctx)
	defer cancel()
	if err := b.expireIfDue(ctx); err != nil {
		return nil, 0, fmt.Errorf("postgres: listing group %q: %w", b.cfg.Group, err)
	}
	err = b.readOnly(ctx, func(tx pgx.Tx) error {
		records = nil
		q := b.st.q
		if err := tx.QueryRow(ctx, q.sql(sqlGroupPos), b.cfg.Group).Scan(&at, new(int64)); err != nil {
			return err
		}
		m := ha.Change{Kind: ha.MemberPut}
		rows, err := tx.Query(ctx, q.sql(sqlListMember), b.cfg.Group)
		if err != nil {
			return err
		}
		if _, err := pgx.ForEachRow(rows, []any{&m.Member, &m.Session, &m.Created, &m.At, &m.Digest, &m.Leaving}, func() error {
			records = append(records, m)
			return nil
		}); err != nil {
			return err
		}
		c := ha.Change{Kind: ha.ClaimPut}
		rows, err = tx.Query(ctx, q.sql(sqlListClaims), b.cfg.Group)
		if err != nil {
			return err
		}
		if _, err := pgx.ForEachRow(rows, []any{&c.Name, &c.Member, &c.Session, &c.Created}, func() error {
			c.At = c.Created
			records = append(records, c)
			return nil
		}); err != nil {
			return err
		}
		k := ha.Change{Kind: ha.ChunkPut}
		rows, err = tx.Query(ctx, q.sql(sqlListChunks), b.cfg.Group)
		if err != nil {
			return err
		}
		_, err = pgx.ForEachRow(rows, []any{&k.Chunk.Member, &k.Chunk.Digest, &k.Chunk.Index, &k.Chunk.Count, &k.Chunk.Data, &k.At}, func() error {
			records = append(records, k)
			return nil
		})
		return err
	})
	if err != nil {
		return nil, 0, fmt.Errorf("postgres: listing group %q: %w", b.cfg.Group, err)
	}
	return records, at, nil
}

// ErrPruned is wrapped by HeldAt's error for a position the change log
// no longer holds (StoreOptions.Retention), and by a feed's that falls
// that far behind.
var ErrPruned = errors.New("postgres: the change log was pruned past the position")

// ErrPositionWentBack is wrapped by a feed's error when the group's
// position is below one the feed delivered: the server lost commits (a
// failover to a standby that had not received them). The replica lists
// the group again; see DESIGN.md for what such a failover costs.
var ErrPositionWentBack = errors.New("postgres: the group's position went back")

// HeldAt reads the names held at position at: the holdings created by
// then and still held, and those the change log shows released or ended
// since. It fails with ErrPruned for a position before the oldest the
// change log holds.
func (b *backend) HeldAt(ctx context.Context, at int64) (names map[string]bool, err error) {
	ctx, cancel := b.Request(ctx)
	defer cancel()
	err = b.readOnly(ctx, func(tx pgx.Tx) error {
		var pos, pruned int64
		if err := tx.QueryRow(ctx, b.st.q.sql(sqlGroupPos), b.cfg.Group).Scan(&pos, &pruned); err != nil {
			return err
		}
		if at < pruned {
			return fmt.Errorf("position %d, the log holds positions after %d: %w", at, pruned, ErrPruned)
		}
		if at > pos {
			return fmt.Errorf("position %d is past the group's %d", at, pos)
		}
		rows, err := tx.Query(ctx, b.st.q.sql(sqlHeldAt), b.cfg.Group, at)
		if err != nil {
			return err
		}
		names = map[string]bool{}
		var name string
		_, err = pgx.ForEachRow(rows, []any{&name}, func() error {
			names[name] = true
			return nil
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("postgres: reading the names held at %d: %w", at, err)
	}
	return names, nil
}
