// The oldest PostgreSQL release the store runs on, and the check that
// refuses an older server at the store's first request.

package postgres

import (
	"errors"
	"fmt"
)

// ErrServerTooOld is wrapped by the error of a store's first request
// when the server is a PostgreSQL release older than the store needs
// (10: the tables' session IDs are identity columns); the error names
// the server's version.
var ErrServerTooOld = errors.New("postgres: the server's PostgreSQL release is too old for the store")

// oldestServer is the oldest server_version_num the store runs on:
// PostgreSQL 10, the first with identity columns (GENERATED ALWAYS AS
// IDENTITY, in schema.sql), the newest feature the store uses. The
// others came before it: ON CONFLICT and SKIP LOCKED in 9.5,
// idle_in_transaction_session_timeout in 9.6. The tests run against 15
// alone (Debian's).
const oldestServer = 100000

// checkServerVersion returns nil when num, the server's
// server_version_num, is oldestServer or later, else an error wrapping
// ErrServerTooOld that names version, its server_version.
func checkServerVersion(num int, version string) error {
	if num >= oldestServer {
		return nil
	}
	return fmt.Errorf("%w: PostgreSQL %s (server_version_num %d); it needs 10 or later", ErrServerTooOld, version, num)
}
