// The schema: the SQL file shipped with the module, run by the store on
// first use after the server's version was checked (version.go), and
// the version check that refuses tables of another version.

package postgres

import (
	"context"
	_ "embed"
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
)

// SchemaSQL is the text of schema.sql, the store's tables: what the store
// runs on first use in StoreOptions.Schema, and what a user who manages
// migrations runs with search_path set to that schema. It is idempotent.
//
//go:embed schema.sql
var SchemaSQL string

// SchemaVersion is the version of the tables SchemaSQL makes, kept in
// the table schema_version; a store refuses tables of another version.
const SchemaVersion = 1

// sqlSchemaLock takes the lock that serializes the checks of schema $1,
// for the transaction.
const sqlSchemaLock = `SELECT pg_advisory_xact_lock(hashtext('github.com/bgctl/controller/ha/postgres ' || $1))`

// schemaRelations are the names of the tables and indexes SchemaSQL
// makes.
var schemaRelations = func() []string {
	var names []string
	for _, m := range regexp.MustCompile(`CREATE (?:TABLE|INDEX) IF NOT EXISTS (\w+)`).FindAllStringSubmatch(SchemaSQL, -1) {
		names = append(names, m[1])
	}
	return names
}()

// sqlForeignRelations reads which of the relations $2 schema $1 holds.
const sqlForeignRelations = `SELECT coalesce(array_agg(c.relname::text ORDER BY c.relname), '{}') FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = ANY($2::text[])`

// ready checks the server's version, creates the store's schema if
// missing and checks its version, once per store: every backend's first
// request waits for it, as long as its context allows. Concurrent
// stores (replicas in other processes) serialize on an advisory lock
// held for the transaction, so that two never create the tables at
// once.
func (s *store) ready(ctx context.Context) error {
	select {
	case s.setup <- struct{}{}: // free: taken even when ctx has ended
	default:
		select {
		case s.setup <- struct{}{}:
		case <-ctx.Done():
			return fmt.Errorf("postgres: preparing schema %q: waiting for another call that prepares it: %w", s.schema, context.Cause(ctx))
		}
	}
	defer func() { <-s.setup }()
	if s.setupDone {
		return nil
	}
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{BeginQuery: beginBounded(0)}, func(tx pgx.Tx) error {
		var serverNum int
		var serverVersion string
		if err := tx.QueryRow(ctx, `SELECT current_setting('server_version_num')::int, current_setting('server_version')`).Scan(&serverNum, &serverVersion); err != nil {
			return fmt.Errorf("reading the server's version: %w", err)
		}
		if err := checkServerVersion(serverNum, serverVersion); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, sqlSchemaLock, s.schema); err != nil {
			return err
		}
		var exists bool
		if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, s.q.schema+".schema_version").Scan(&exists); err != nil {
			return err
		}
		if !exists {
			// No schema_version: the tables are the store's to make. One
			// of their names there already is someone else's (a user's
			// own "sessions" in public, say), which CREATE ... IF NOT
			// EXISTS would keep, and the store then write to.
			var foreign []string
			if err := tx.QueryRow(ctx, sqlForeignRelations, s.schema, schemaRelations).Scan(&foreign); err != nil {
				return err
			}
			if len(foreign) > 0 {
				return fmt.Errorf("schema %q holds %s, which the store did not make (there is no schema_version table): give the store a schema of its own (StoreOptions.Schema)", s.schema, strings.Join(foreign, ", "))
			}
			if _, err := tx.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+s.q.schema); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "SET LOCAL search_path TO "+s.q.schema); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, SchemaSQL); err != nil {
				return fmt.Errorf("running schema.sql: %w", err)
			}
		}
		var version int
		if err := tx.QueryRow(ctx, "SELECT version FROM "+s.q.schema+".schema_version").Scan(&version); err != nil {
			return fmt.Errorf("reading the schema version: %w", err)
		}
		if version != SchemaVersion {
			return fmt.Errorf("schema %q holds tables of version %d; this store needs version %d", s.schema, version, SchemaVersion)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("postgres: preparing schema %q: %w", s.schema, err)
	}
	s.setupDone = true
	return nil
}
