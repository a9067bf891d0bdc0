// The tests' server, started once for the package, and the pools and
// stores the tests make on it.

package postgres

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bgctl/controller/ha/postgres/internal/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"
)

// pgBin is the directory of initdb and postgres; empty: the newest of
// /usr/lib/postgresql/*/bin (Debian's packages).
var pgBin = flag.String("pg.bin", "", "directory of PostgreSQL's initdb and postgres (default: the newest /usr/lib/postgresql/*/bin)")

// testServer is the server every test of the package runs against.
var testServer *pgtest.Server

// startPostgres starts a server of the tests' own (pgtest.Start), from
// -pg.bin.
func startPostgres() (*pgtest.Server, error) { return pgtest.Start(*pgBin) }

// TestMain starts the server, runs the tests, and stops it; the run
// fails, never skips, when the server cannot start.
func TestMain(m *testing.M) {
	if os.Getenv(measureKind) != "" {
		os.Exit(runMeasureChild()) // a holder of the measured names (measure_test.go)
	}
	if os.Getenv(childDSN) != "" {
		os.Exit(runChild()) // a replica of the paused test (paused_test.go)
	}
	os.Exit(run(m))
}

// run is TestMain's body, so that its deferred stop runs before the exit.
func run(m *testing.M) int {
	var err error
	testServer, err = startPostgres()
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: the tests need a PostgreSQL server of their own: %v\n", err)
		return 1
	}
	defer testServer.Stop()
	code := m.Run()
	if code == 0 {
		// Every pool closed, every feed stopped: nothing of the tests'
		// may run on.
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "FAIL: goroutines left running after the tests: %v\n", err)
			return 1
		}
	}
	return code
}

// newPool returns a pool on the test server of at most conns
// connections, closed when t ends.
func newPool(t testing.TB, conns int32) *pgxpool.Pool {
	t.Helper()
	return newPoolOn(t, testServer.DSN, conns)
}

// newPoolOn returns a pool on the server dsn names, of at most conns
// connections, closed when t ends.
func newPoolOn(t testing.TB, dsn string, conns int32) *pgxpool.Pool {
	t.Helper()
	return newTracedPool(t, dsn, conns, nil)
}

// newTracedPool is newPoolOn, with tracer (if not nil) tracing the
// pool's statements.
func newTracedPool(t testing.TB, dsn string, conns int32, tracer pgx.QueryTracer) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = conns
	if tracer != nil {
		cfg.ConnConfig.Tracer = tracer
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("a pool on the test server: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// groupSeq numbers the groups the tests make, so that none shares one.
var groupSeq atomic.Int64

// newGroup returns a group name no other test of the run uses.
func newGroup(what string) string {
	return fmt.Sprintf("%s-%d-%d", what, time.Now().UnixNano(), groupSeq.Add(1))
}
