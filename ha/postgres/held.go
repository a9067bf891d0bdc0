// The fence in the user's own transaction: Held checks, inside it, that
// a claim is still held, and locks the holding so that no takeover
// commits before the transaction ends.

package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/bgctl/controller/ha"
	"github.com/jackc/pgx/v5"
)

// ErrNotHeld is wrapped by Held's error when the claim is no longer
// held: its session ended or ran out, or the name was released or is
// held anew.
var ErrNotHeld = errors.New("postgres: the claim is no longer held")

// claimKey is a holding's ha.Claim.Key: where Held finds it, the schema
// (which holds no '/'), the group and the name.
func (s *store) claimKey(group, name string) string {
	return s.schema + "/" + group + "/claims/" + name
}

// splitClaimKey returns the schema and group of claim's Key.
func splitClaimKey(c ha.Claim) (schema, group string, ok bool) {
	schema, rest, ok := strings.Cut(c.Key, "/")
	group, ok2 := strings.CutSuffix(rest, "/claims/"+c.Name)
	return schema, group, ok && ok2 && schemaName.MatchString(schema) && c.Name != ""
}

const (
	// sqlHeldSession locks the holding's session and, in the same
	// statement (no pause of the client can fall between the two),
	// bounds how long the transaction may sit idle to the session's TTL
	// in ms, unless a shorter bound is set already.
	sqlHeldSession = `SELECT s.id, CASE WHEN b.setting::bigint = 0 OR b.setting::bigint > s.ttl_us / 1000
	THEN set_config('idle_in_transaction_session_timeout', greatest(s.ttl_us / 1000, 1)::text, true) END
FROM {s}.sessions s JOIN {s}.claims c ON c.session = s.id AND c.grp = $1 AND c.name = $2 AND c.created = $3,
	pg_settings b WHERE b.name = 'idle_in_transaction_session_timeout' AND s.expires_at > clock_timestamp() FOR KEY SHARE OF s`
	sqlHeldClaim = `SELECT 1 FROM {s}.claims WHERE grp = $1 AND name = $2 AND created = $3 AND session = $4 FOR KEY SHARE`
)

// Held checks, inside the caller's transaction tx, that claim (what
// ha.ClaimFrom gives a DoFunc on this store) is still held: by a session
// that has not run out on the server's clock, and as the holding its
// Revision names. It locks the session's row and the holding's row FOR
// KEY SHARE until tx ends, so the session's end, an expiry or a release
// of the name, which delete them, wait for tx: a write tx makes after
// Held commits before any other replica can hold the name. An error
// wrapping ErrNotHeld when it is not held; then roll tx back. A renewal
// does not wait for tx; the session's expiry and the others' takeover
// of its names do, so keep tx short. So that a process frozen inside tx
// (SIGSTOP, a long pause) cannot hold the takeover off for good, Held
// bounds the time tx may sit idle, waiting for its client, to the
// session's TTL (SET LOCAL idle_in_transaction_session_timeout, unless
// a shorter bound is set): past it the server ends the connection, tx
// with it, and nothing tx wrote commits. Under REPEATABLE READ or
// SERIALIZABLE, a holding ended after tx's snapshot fails with the
// server's serialization error instead.
//
// On etcd the same guard is a transaction compared with the claim key
// (ha/etcd's Held); on Kubernetes the claim's Token, compared by the
// store the write goes to. Here the write and the check share one
// transaction of the database that keeps the claims.
func Held(ctx context.Context, tx pgx.Tx, claim ha.Claim) error {
	if tx == nil {
		// Refused by name rather than a nil dereference: a DoFunc that
		// lost its transaction must not panic its controller.
		return fmt.Errorf("postgres: Held(%q): the transaction is nil", claim.Name)
	}
	schema, group, ok := splitClaimKey(claim)
	if !ok {
		return fmt.Errorf("postgres: Held: claim %q has key %q, not one of this store's", claim.Name, claim.Key)
	}
	q := queriesFor(pgx.Identifier{schema}.Sanitize())
	var session int64
	err := tx.QueryRow(ctx, q.sql(sqlHeldSession), group, claim.Name, claim.Revision).Scan(&session, new(*string))
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("postgres: %q at %d: %w", claim.Name, claim.Revision, ErrNotHeld)
	}
	if err != nil {
		return fmt.Errorf("postgres: checking the claim of %q: %w", claim.Name, err)
	}
	err = tx.QueryRow(ctx, q.sql(sqlHeldClaim), group, claim.Name, claim.Revision, session).Scan(new(int))
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("postgres: %q at %d: %w", claim.Name, claim.Revision, ErrNotHeld)
	}
	if err != nil {
		return fmt.Errorf("postgres: checking the claim of %q: %w", claim.Name, err)
	}
	return nil
}
