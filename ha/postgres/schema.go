// The schema: the SQL file shipped with the module, run by the store on
// first use, and the version check that refuses tables of another
// version.

package postgres

import (
	"context"
	_ "embed"
	"fmt"

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

// ready creates the store's schema if missing and checks its version,
// once per store: every backend's first request waits for it, as long as its context allows. Concurrent
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
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('github.com/bgctl/controller/ha/postgres ' || $1))`, s.schema); err != nil {
			return err
		}
		var exists bool
		if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, s.q.schema+".schema_version").Scan(&exists); err != nil {
			return err
		}
		if !exists {
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
