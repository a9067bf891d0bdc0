// The Backend: one replica's access to the store, each method of
// ha.Backend as a transaction on the group's tables.

package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/bgctl/controller/ha"
	"github.com/jackc/pgx/v5"
)

// backend is one replica's Backend on the store. Its methods are safe
// for concurrent use: each is its own transaction on a connection of the
// pool.
type backend struct {
	// Immutable after store.backend.
	st  *store
	cfg ha.BackendConfig // RequestTimeout, RenewEvery, Window and Logger set
}

var (
	_ ha.Backend       = (*backend)(nil)
	_ ha.Requester     = (*backend)(nil)
	_ ha.ClaimLimiter  = (*backend)(nil)
	_ ha.HistoryReader = (*backend)(nil)
	_ ha.Rounding      = (*backend)(nil)
)

// Request returns parent bounded by the replica's RequestTimeout.
func (b *backend) Request(parent context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(parent, b.cfg.RequestTimeout)
}

// Rounding is a millisecond: the readings are differences of two times
// of the server's one clock (expires_at, set from clock_timestamp() at
// the renewal, less clock_timestamp() at the reading), in microseconds;
// a millisecond covers their truncation. A server clock slower than the
// replicas' lengthens the session more than it shortens a reading, and
// a faster one is the fence's Margin's to cover (DESIGN.md).
func (b *backend) Rounding() time.Duration { return time.Millisecond }

// micros is d in whole microseconds, as the store keeps durations.
func micros(d time.Duration) int64 { return int64(d / time.Microsecond) }

const (
	sqlMemberOf      = `SELECT session, created FROM {s}.members WHERE grp = $1 AND member = $2`
	sqlBeginSession  = `INSERT INTO {s}.sessions (grp, member, ttl_us, expires_at) VALUES ($1, $2, $3::bigint, clock_timestamp() + $3::bigint * interval '1 microsecond') RETURNING id`
	sqlPutMember     = `INSERT INTO {s}.members (grp, member, session, digest, leaving, created, modified) VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (grp, member) DO UPDATE SET session = $3, digest = $4, leaving = $5, modified = $7`
	sqlLogMemberPut  = `INSERT INTO {s}.changes (grp, pos, kind, member, session, created, digest, leaving) VALUES ($1, $2, 0, $3, $4, $5, $6, $7)`
	sqlRenew         = `UPDATE {s}.sessions SET expires_at = clock_timestamp() + ttl_us * interval '1 microsecond' WHERE id = $1 AND grp = $2 AND expires_at > clock_timestamp() RETURNING ttl_us`
	sqlSessionLive   = `SELECT EXISTS (SELECT 1 FROM {s}.sessions WHERE id = $1 AND grp = $2 AND expires_at > clock_timestamp())`
	sqlRewriteMember = `UPDATE {s}.members SET digest = $4, leaving = $5, modified = $6 WHERE grp = $1 AND member = $2 AND session = $3 RETURNING created`
	sqlTimeLeft      = `SELECT ttl_us, floor(extract(epoch FROM expires_at - clock_timestamp()) * 1000000)::bigint FROM {s}.sessions WHERE id = $1 AND grp = $2`
	sqlLiveMember    = `SELECT m.session FROM {s}.members m JOIN {s}.sessions s ON s.id = m.session AND s.expires_at > clock_timestamp() WHERE m.grp = $1 AND m.member = $2`
)

// Begin starts a session valid until clock_timestamp() + ttl on the
// server, a moment after Sent, and writes or moves the member record
// under it, in one write transaction. On an error after the transaction
// may have committed, it ends the session, best effort.
func (b *backend) Begin(ctx context.Context, prev ha.SessionID, ttl time.Duration, digest string) (ha.Session, error) {
	if ttl < time.Microsecond {
		return ha.Session{}, fmt.Errorf("postgres: Begin: ttl %v is less than a microsecond", ttl)
	}
	sent := time.Now()
	rctx, cancel := b.Request(ctx)
	defer cancel()
	var started ha.Session
	err := b.write(rctx, func(ctx context.Context, w *writeTx) error {
		q := b.st.q
		var under ha.SessionID
		var created int64
		err := w.tx.QueryRow(ctx, q.sql(sqlMemberOf), b.cfg.Group, b.cfg.ID).Scan(&under, &created)
		found := err == nil
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		if found && (prev == 0 || under != prev) {
			return fmt.Errorf("postgres: member %q of group %q is under session %d: %w", b.cfg.ID, b.cfg.Group, under, ha.ErrDuplicateID)
		}
		var id int64
		if err := w.tx.QueryRow(ctx, q.sql(sqlBeginSession), b.cfg.Group, b.cfg.ID, micros(ttl)).Scan(&id); err != nil {
			return err
		}
		before := w.pos
		pos, err := w.next(ctx)
		if err != nil {
			return err
		}
		started = ha.Session{ID: ha.SessionID(id), Sent: sent, JoinedAt: pos}
		if !found {
			created = pos
		} else {
			started.JoinedAt = before // moved: found at the position before the move
		}
		if _, err := w.tx.Exec(ctx, q.sql(sqlPutMember), b.cfg.Group, b.cfg.ID, id, digest, false, created, pos); err != nil {
			return err
		}
		_, err = w.tx.Exec(ctx, q.sql(sqlLogMemberPut), b.cfg.Group, pos, b.cfg.ID, id, created, digest, false)
		return err
	})
	if err == nil && b.st.afterBegin != nil {
		err = b.st.afterBegin()
	}
	if err != nil && started.ID != 0 {
		// The commit's answer may be lost with the session made.
		ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.cfg.RequestTimeout)
		defer cancel()
		_ = b.End(ectx, started.ID)
		return ha.Session{}, err
	}
	if err != nil {
		return ha.Session{}, fmt.Errorf("postgres: beginning a session of %q: %w", b.cfg.ID, err)
	}
	return started, nil
}

// Renew moves the session's end to clock_timestamp() + its TTL on the
// server, in one statement, only while it has not passed: a renewal
// never revives a session that ran out.
func (b *backend) Renew(ctx context.Context, id ha.SessionID) (time.Duration, error) {
	if err := b.st.ready(ctx); err != nil {
		return 0, err
	}
	var ttl int64
	err := b.st.pool.QueryRow(ctx, b.st.q.sql(sqlRenew), int64(id), b.cfg.Group).Scan(&ttl)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("postgres: renewing session %d: %w", id, ha.ErrSessionEnded)
	}
	if err != nil {
		return 0, fmt.Errorf("postgres: renewing session %d: %w", id, err)
	}
	return time.Duration(ttl) * time.Microsecond, nil
}

// End deletes the session and every record under it in one write
// transaction, at one position.
func (b *backend) End(ctx context.Context, id ha.SessionID) error {
	return b.write(ctx, func(ctx context.Context, w *writeTx) error { return w.end(ctx, id) })
}

// live fails with ErrSessionEnded unless session id lives, within w:
// its row is there and its time has not run out on the server's clock.
// The row alone does not do: the expiry skips a row that a fenced
// transaction (Held) holds, and a session that ran out must take no
// holding, set or member record meanwhile.
func (w *writeTx) live(ctx context.Context, id ha.SessionID) error {
	var ok bool
	if err := w.tx.QueryRow(ctx, w.b.st.q.sql(sqlSessionLive), int64(id), w.b.cfg.Group).Scan(&ok); err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("postgres: session %d: %w", id, ha.ErrSessionEnded)
	}
	return nil
}

// PutMember rewrites the member record only while it is under session
// id; ErrSessionEnded when id has ended.
func (b *backend) PutMember(ctx context.Context, id ha.SessionID, digest string, leaving bool) (written bool, err error) {
	err = b.write(ctx, func(ctx context.Context, w *writeTx) error {
		if err := w.live(ctx, id); err != nil {
			return err
		}
		var under ha.SessionID
		err := w.tx.QueryRow(ctx, b.st.q.sql(sqlMemberOf), b.cfg.Group, b.cfg.ID).Scan(&under, new(int64))
		if errors.Is(err, pgx.ErrNoRows) || err == nil && under != id {
			return nil
		}
		if err != nil {
			return err
		}
		pos, err := w.next(ctx)
		if err != nil {
			return err
		}
		var created int64
		if err := w.tx.QueryRow(ctx, b.st.q.sql(sqlRewriteMember), b.cfg.Group, b.cfg.ID, int64(id), digest, leaving, pos).Scan(&created); err != nil {
			return err
		}
		_, err = w.tx.Exec(ctx, b.st.q.sql(sqlLogMemberPut), b.cfg.Group, pos, b.cfg.ID, int64(id), created, digest, leaving)
		written = err == nil
		return err
	})
	return written, err
}

// EnsureMember writes the member record under session id if there is
// none, and answers the session it is under; ErrSessionEnded when id has
// ended.
func (b *backend) EnsureMember(ctx context.Context, id ha.SessionID, digest string) (under ha.SessionID, found bool, err error) {
	err = b.write(ctx, func(ctx context.Context, w *writeTx) error {
		if err := w.live(ctx, id); err != nil {
			return err
		}
		err := w.tx.QueryRow(ctx, b.st.q.sql(sqlMemberOf), b.cfg.Group, b.cfg.ID).Scan(&under, new(int64))
		if err == nil {
			found = true
			return nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		pos, err := w.next(ctx)
		if err != nil {
			return err
		}
		if _, err := w.tx.Exec(ctx, b.st.q.sql(sqlPutMember), b.cfg.Group, b.cfg.ID, int64(id), digest, false, pos, pos); err != nil {
			return err
		}
		_, err = w.tx.Exec(ctx, b.st.q.sql(sqlLogMemberPut), b.cfg.Group, pos, b.cfg.ID, int64(id), pos, digest, false)
		under, found = id, err == nil
		return err
	})
	if err != nil {
		return 0, false, err
	}
	return under, found, nil
}

// MemberSession reads the session the member record is under, counting
// a record under a session that has run out (and is not yet deleted) as
// none.
func (b *backend) MemberSession(ctx context.Context) (id ha.SessionID, found bool, err error) {
	if err := b.st.ready(ctx); err != nil {
		return 0, false, err
	}
	err = b.st.pool.QueryRow(ctx, b.st.q.sql(sqlLiveMember), b.cfg.Group, b.cfg.ID).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("postgres: reading the member record of %q: %w", b.cfg.ID, err)
	}
	return id, true, nil
}

// TimeLeft reads how long session id lives unless renewed, on the
// server's clock (Rounding); once it has run out, it ends it and answers
// ErrSessionEnded.
func (b *backend) TimeLeft(ctx context.Context, id ha.SessionID) (left, granted time.Duration, err error) {
	return b.timeLeft(ctx, id)
}

// PeerLeft reads another member's session as TimeLeft does: the server
// keeps every session's end.
func (b *backend) PeerLeft(ctx context.Context, id ha.SessionID) (left, granted time.Duration, err error) {
	return b.timeLeft(ctx, id)
}

// timeLeft is TimeLeft and PeerLeft.
func (b *backend) timeLeft(ctx context.Context, id ha.SessionID) (left, granted time.Duration, err error) {
	return b.readLeft(ctx, id, true)
}

// readLeft reads session id's time left; when it has run out and expire
// is set, it carries the end out by a write and reads again once (a
// session row a transaction holds, by Held, is left for a later write,
// and answered with nothing left).
func (b *backend) readLeft(ctx context.Context, id ha.SessionID, expire bool) (left, granted time.Duration, err error) {
	if err := b.st.ready(ctx); err != nil {
		return 0, 0, err
	}
	var ttl, leftUS int64
	err = b.st.pool.QueryRow(ctx, b.st.q.sql(sqlTimeLeft), int64(id), b.cfg.Group).Scan(&ttl, &leftUS)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return 0, 0, fmt.Errorf("postgres: session %d: %w", id, ha.ErrSessionEnded)
	case err != nil:
		return 0, 0, fmt.Errorf("postgres: reading session %d: %w", id, err)
	case leftUS <= 0 && expire:
		// Run out: carried out (by this write, or a write before it)
		// before it is answered ended.
		if err := b.write(ctx, func(context.Context, *writeTx) error { return nil }); err != nil {
			return 0, 0, fmt.Errorf("postgres: ending session %d: %w", id, err)
		}
		return b.readLeft(ctx, id, false)
	}
	return time.Duration(max(leftUS, 0)) * time.Microsecond, time.Duration(ttl) * time.Microsecond, nil
}
