// Claims: a batch of names held in one statement, a holding released at
// a position of its own, and the limits of one Claim.

package postgres

import (
	"context"
	"fmt"

	"github.com/bgctl/controller/ha"
	"github.com/jackc/pgx/v5"
)

const (
	sqlHeldOf    = `SELECT name, session, holder, created FROM {s}.claims WHERE grp = $1 AND name = ANY($2::text[])`
	sqlClaimAll  = `INSERT INTO {s}.claims (grp, name, session, holder, created) SELECT $1, n, $3, $4, $5 FROM unnest($2::text[]) AS n`
	sqlLogClaims = `INSERT INTO {s}.changes (grp, pos, kind, member, name, session, created) SELECT $1, $5, 2, $4, n, $3, $5 FROM unnest($2::text[]) AS n`
	sqlRelease   = `DELETE FROM {s}.claims WHERE grp = $1 AND name = $2 AND created = $3 RETURNING session, holder`
	sqlLogGone   = `INSERT INTO {s}.changes (grp, pos, kind, member, name, session, created) VALUES ($1, $2, 3, $3, $4, $5, $6)`
)

// Claim makes session id the holder of every one of names at one new
// position when none is held, in one statement for the batch, and else
// writes nothing and reads them: each held name's holding (Mine when
// id's: an earlier answer lost), the free ones in absent. The group's
// counter row orders it with every other write: two claimers of one
// name are one after the other.
func (b *backend) Claim(ctx context.Context, id ha.SessionID, names []string) (got []ha.Claimed, absent []string, err error) {
	if len(names) > b.st.claimNames {
		return nil, nil, fmt.Errorf("postgres: %d names in one Claim, at most %d: %w", len(names), b.st.claimNames, ha.ErrTooManyOps)
	}
	err = b.write(ctx, func(ctx context.Context, w *writeTx) error {
		got, absent = nil, nil
		if err := w.live(ctx, id); err != nil {
			return err
		}
		q := b.st.q
		rows, err := w.tx.Query(ctx, q.sql(sqlHeldOf), b.cfg.Group, names)
		if err != nil {
			return err
		}
		held := map[string]ha.Claimed{}
		var name, holder string
		var session ha.SessionID
		var created int64
		_, err = pgx.ForEachRow(rows, []any{&name, &session, &holder, &created}, func() error {
			c := ha.Claimed{Name: name, Revision: created, At: w.pos}
			if session == id {
				c.Mine, c.Key, c.Token = true, b.st.claimKey(b.cfg.Group, name), created
			} else {
				c.Holder, c.Session = holder, session
			}
			held[name] = c
			return nil
		})
		if err != nil {
			return err
		}
		if len(held) > 0 {
			for _, n := range names {
				if c, ok := held[n]; ok {
					got = append(got, c)
				} else {
					absent = append(absent, n)
				}
			}
			return nil
		}
		pos, err := w.next(ctx)
		if err != nil {
			return err
		}
		if _, err := w.tx.Exec(ctx, q.sql(sqlClaimAll), b.cfg.Group, names, int64(id), b.cfg.ID, pos); err != nil {
			return err
		}
		if _, err := w.tx.Exec(ctx, q.sql(sqlLogClaims), b.cfg.Group, names, int64(id), b.cfg.ID, pos); err != nil {
			return err
		}
		for _, n := range names {
			got = append(got, ha.Claimed{Name: n, Mine: true, Revision: pos, Key: b.st.claimKey(b.cfg.Group, n), Token: pos})
		}
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("postgres: claiming %d names: %w", len(names), err)
	}
	return got, absent, nil
}

// ClaimCost is what a name adds to a Claim: its bytes in the arrays the
// statements bind, and their overhead.
func (b *backend) ClaimCost(name string) int { return len(name) + 8 }

// ClaimLimits answers StoreOptions.ClaimNames (5000 by default) names
// and 8 MiB.
func (b *backend) ClaimLimits() (names, bytes int) { return b.st.claimNames, claimBytes }

// Release deletes holding c, only while the name's holding is the one
// created at c.Revision, and logs it at a position of its own.
func (b *backend) Release(ctx context.Context, c ha.Claim) error {
	err := b.write(ctx, func(ctx context.Context, w *writeTx) error {
		var session int64
		var holder string
		rows, err := w.tx.Query(ctx, b.st.q.sql(sqlRelease), b.cfg.Group, c.Name, c.Revision)
		if err != nil {
			return err
		}
		tag, err := pgx.ForEachRow(rows, []any{&session, &holder}, func() error { return nil })
		if err != nil || tag.RowsAffected() == 0 {
			return err
		}
		pos, err := w.next(ctx)
		if err != nil {
			return err
		}
		_, err = w.tx.Exec(ctx, b.st.q.sql(sqlLogGone), b.cfg.Group, pos, holder, c.Name, session, c.Revision)
		return err
	})
	if err != nil {
		return fmt.Errorf("postgres: releasing %q: %w", c.Name, err)
	}
	return nil
}
