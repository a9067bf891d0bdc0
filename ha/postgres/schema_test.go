// The schema: the shipped file is what the store runs, a version
// mismatch is refused by name, and bad options are refused naming the
// culprit.

package postgres

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/bgctl/controller/ha"
	"github.com/jackc/pgx/v5"
)

// beginIn begins a session of replica r0 in a fresh group of a store on
// schema; its error.
func beginIn(t *testing.T, schema string) error {
	t.Helper()
	st, err := newStore(newPool(t, 2), StoreOptions{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	b := st.backend(ha.BackendConfig{Group: newGroup("schema"), ID: "r0", TTL: time.Second})
	s, err := b.Begin(context.Background(), 0, time.Second, "d")
	if err == nil {
		_ = b.End(context.Background(), s.ID)
	}
	return err
}

// newSchema returns a schema name no other test of the run uses.
func newSchema(what string) string { return fmt.Sprintf("%s_%d", what, groupSeq.Add(1)) }

// A user who runs schema.sql themselves, as their migrations would, gets
// the tables the store works on.
func TestSchemaFileMadeByHandIsUsed(t *testing.T) {
	t.Parallel()
	pool := newPool(t, 2)
	ctx := context.Background()
	schema := newSchema("by_hand")
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for _, stmt := range []string{"CREATE SCHEMA " + schema, "SET LOCAL search_path TO " + schema, SchemaSQL} {
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("running schema.sql by hand: %v", err)
	}
	if err := beginIn(t, schema); err != nil {
		t.Fatalf("a store on the schema made by hand: %v", err)
	}
}

// Tables of another version are refused, with an error naming the
// schema and both versions, before anything is written.
func TestSchemaOfAnotherVersionIsRefused(t *testing.T) {
	t.Parallel()
	schema := newSchema("versioned")
	if err := beginIn(t, schema); err != nil {
		t.Fatal(err)
	}
	pool := newPool(t, 2)
	if _, err := pool.Exec(context.Background(), "UPDATE "+schema+".schema_version SET version = 99"); err != nil {
		t.Fatal(err)
	}
	err := beginIn(t, schema)
	if err == nil || !strings.Contains(err.Error(), `schema "`+schema+`" holds tables of version 99`) || !strings.Contains(err.Error(), "needs version 1") {
		t.Errorf("a store on tables of version 99: %v; want them refused, naming the schema and both versions", err)
	}
}

func TestStoreOptionsRefusedByName(t *testing.T) {
	pool := newPool(t, 1)
	for _, tc := range []struct {
		o    StoreOptions
		want string
	}{
		{StoreOptions{Schema: "Bad-Name"}, `Schema "Bad-Name"`},
		{StoreOptions{Schema: "a.b"}, `Schema "a.b"`},
		{StoreOptions{Schema: strings.Repeat("s", 64)}, "Schema"},
		{StoreOptions{Retention: time.Second}, "Retention 1s is less than a minute"},
		{StoreOptions{Poll: -time.Second}, "Poll -1s is negative"},
		{StoreOptions{ClaimNames: -1}, "ClaimNames -1 is negative"},
	} {
		if _, err := newStore(pool, tc.o); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("newStore(%+v) = %v; want an error naming %s", tc.o, err, tc.want)
		}
	}
	if _, err := ha.New(Store(pool, StoreOptions{Schema: "Bad-Name"}), ha.Options{Prefix: "g", ID: "r0"}); err == nil || !strings.Contains(err.Error(), `Schema "Bad-Name"`) {
		t.Errorf("ha.New on a store of a bad schema name: %v; want an error naming it", err)
	}
	st := Store(pool, StoreOptions{})
	if _, err := st.Backend(ha.BackendConfig{ID: "r0"}); err == nil || !strings.Contains(err.Error(), "Prefix") {
		t.Errorf("a backend without a group: %v; want an error naming Options.Prefix", err)
	}
}
