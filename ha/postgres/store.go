// The Store: a pool, the options of the schema it keeps the groups in, and
// the Backend it gives each Replica.

package postgres

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/bgctl/controller/ha"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// StoreOptions configures a Store. The zero value is valid: each zero
// field means the default written next to it.
type StoreOptions struct {
	// Schema is the PostgreSQL schema the store's tables live in,
	// created on first use if missing. A lower-case SQL identifier:
	// letters, digits and underscores, not starting with a digit, at
	// most 63 bytes. Default "bgctl_ha". Every group of replicas (their
	// Options.Prefix) shares its tables, apart by a column. A schema
	// without the store's tables that holds a table or index of one of
	// their names (a service's own "sessions" in public) is refused.
	Schema string
	// Retention is how long the change log keeps a change: a feed that
	// falls further behind lists the group again, and HeldAt fails for
	// a position pruned. Default 10 minutes; at least a minute.
	Retention time.Duration
	// Poll is how often a feed reads the change log when no
	// notification (LISTEN/NOTIFY) woke it: the fallback for a
	// notification lost. Default a second.
	Poll time.Duration
	// ClaimNames is how many names one Claim takes at most, in one
	// statement of arrays. Default 5000.
	ClaimNames int
}

// The defaults of StoreOptions.
const (
	defaultSchema     = "bgctl_ha"
	defaultRetention  = 10 * time.Minute
	defaultPoll       = time.Second
	defaultClaimNames = 5000
	// claimBytes is the bytes one Claim takes at most: its arrays are
	// bound as parameters, which PostgreSQL takes up to 1 GB each; 8 MiB
	// keeps one statement's work small.
	claimBytes = 8 << 20
)

// schemaName is what StoreOptions.Schema may be.
var schemaName = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// Store returns the store of the replicas that keep their groups on the
// PostgreSQL server pool reaches, in the tables of schema o.Schema, for
// [ha.New] or [ha.Join]. It sends nothing: the first request of the
// first backend creates the schema if missing, and checks its version.
// The pool serves the backends' requests; each replica's feed takes a
// connection from it and keeps it for itself while it runs (LISTEN),
// outside the pool's count, which may open another in its place: count
// one connection per replica on top of the pool's MaxConns against the
// server's max_connections. When pool is nil or o is invalid (a Schema that is not a
// plain identifier, a negative duration), the store's Backend, and so
// ha.New, fails with an error naming the culprit.
func Store(pool *pgxpool.Pool, o StoreOptions) ha.Store {
	st, err := newStore(pool, o)
	if err != nil {
		return invalidStore{err}
	}
	return st
}

// invalidStore is the Store of invalid options: its Backend fails.
type invalidStore struct{ err error }

// Backend returns the error the options were refused with.
func (s invalidStore) Backend(ha.BackendConfig) (ha.Backend, error) { return nil, s.err }

// store is the ha.Store Store returns.
type store struct {
	// Immutable after newStore.
	pool       *pgxpool.Pool
	schema     string // validated: a plain identifier
	q          queries
	retention  time.Duration
	poll       time.Duration
	claimNames int

	// afterBegin, if set (tests only, before the first Begin), runs
	// after a Begin's transaction committed, and its error fails the
	// Begin: an answer held back, or lost.
	afterBegin func() error

	// setup holds a token while a call checks the schema: a channel, not
	// a mutex, so that a call waiting for another's check gives up when
	// its own context ends.
	setup     chan struct{}
	setupDone bool // guarded by setup: the schema was checked
}

// newStore is Store, with an error for invalid options.
func newStore(pool *pgxpool.Pool, o StoreOptions) (*store, error) {
	if pool == nil {
		return nil, errors.New("postgres: Store: the pool is nil")
	}
	schema := cmp.Or(o.Schema, defaultSchema)
	if !schemaName.MatchString(schema) {
		return nil, fmt.Errorf("postgres: StoreOptions.Schema %q is not a lower-case identifier (letters, digits, _; at most 63 bytes)", o.Schema)
	}
	switch {
	case o.Retention < 0:
		return nil, fmt.Errorf("postgres: StoreOptions.Retention %v is negative", o.Retention)
	case o.Retention > 0 && o.Retention < time.Minute:
		return nil, fmt.Errorf("postgres: StoreOptions.Retention %v is less than a minute", o.Retention)
	case o.Poll < 0:
		return nil, fmt.Errorf("postgres: StoreOptions.Poll %v is negative", o.Poll)
	case o.ClaimNames < 0:
		return nil, fmt.Errorf("postgres: StoreOptions.ClaimNames %d is negative", o.ClaimNames)
	}
	return &store{
		pool:       pool,
		schema:     schema,
		q:          queriesFor(pgx.Identifier{schema}.Sanitize()),
		retention:  cmp.Or(o.Retention, defaultRetention),
		poll:       cmp.Or(o.Poll, defaultPoll),
		claimNames: cmp.Or(o.ClaimNames, defaultClaimNames),
		setup:      make(chan struct{}, 1),
	}, nil
}

// Backend returns the backend of the replica c describes. It sends
// nothing and starts no goroutine.
func (s *store) Backend(c ha.BackendConfig) (ha.Backend, error) {
	if c.Group == "" {
		return nil, errors.New("postgres: the replica's group (Options.Prefix) is empty")
	}
	if c.ID == "" {
		return nil, errors.New("postgres: the replica's ID is empty")
	}
	// Refused here, by name: PostgreSQL's text holds neither, and every
	// request of the replica would fail with the server's encoding error.
	if !textHolds(c.Group) {
		return nil, fmt.Errorf("postgres: the replica's group (Options.Prefix) %q has a NUL byte or is not UTF-8, which PostgreSQL's text cannot hold", c.Group)
	}
	if !textHolds(c.ID) {
		return nil, fmt.Errorf("postgres: the replica's ID %q has a NUL byte or is not UTF-8, which PostgreSQL's text cannot hold", c.ID)
	}
	return s.backend(c), nil
}

// textHolds reports whether PostgreSQL's text (in a UTF-8 database)
// holds s: valid UTF-8 without a NUL byte.
func textHolds(s string) bool { return utf8.ValidString(s) && !strings.ContainsRune(s, 0) }

// backend is Backend, typed; zero durations of c get defaults, as the
// conformance suite passes them.
func (s *store) backend(c ha.BackendConfig) *backend {
	c.RequestTimeout = cmp.Or(c.RequestTimeout, 2*time.Second)
	c.RenewEvery = cmp.Or(c.RenewEvery, c.TTL/4, time.Second)
	c.Window = cmp.Or(c.Window, 4*c.RenewEvery)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return &backend{st: s, cfg: c}
}
