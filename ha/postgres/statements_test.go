// Set-based writes: a claim and a session's end take as many statements
// for a thousand names as for ten.

package postgres

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bgctl/controller/ha"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// countingTracer counts the statements a pool sends.
type countingTracer struct{ n atomic.Int64 }

// TraceQueryStart counts one statement.
func (c *countingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

// TraceQueryEnd does nothing.
func (c *countingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func TestClaimAndEndTakeStatementsIndependentOfTheNames(t *testing.T) {
	t.Parallel()
	cfg, err := pgxpool.ParseConfig(testServer.DSN)
	if err != nil {
		t.Fatal(err)
	}
	tracer := &countingTracer{}
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	st, err := newStore(pool, StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// statements returns how many statements a claim of n names, and
	// then the end of the session holding them, sent.
	statements := func(n int) (claim, end int64) {
		b := st.backend(ha.BackendConfig{Group: newGroup("statements"), ID: "r0", TTL: 5 * time.Second})
		s, err := b.Begin(ctx, 0, 5*time.Second, "d")
		if err != nil {
			t.Fatal(err)
		}
		names := make([]string, n)
		for i := range names {
			names[i] = fmt.Sprintf("name-%05d", i)
		}
		before := tracer.n.Load()
		if got, absent, err := b.Claim(ctx, s.ID, names); err != nil || len(got) != n || len(absent) != 0 {
			t.Fatalf("claim of %d names: %d held, %d absent, %v", n, len(got), len(absent), err)
		}
		claimed := tracer.n.Load()
		if err := b.End(ctx, s.ID); err != nil {
			t.Fatal(err)
		}
		return claimed - before, tracer.n.Load() - claimed
	}
	claim10, end10 := statements(10)
	claim1000, end1000 := statements(1000)
	if claim10 != claim1000 || end10 != end1000 {
		t.Errorf("statements: a claim of 10 names %d, of 1000 %d; the end of their session %d and %d; want the same for both", claim10, claim1000, end10, end1000)
	}
	t.Logf("a claim: %d statements, a session's end: %d, for 10 names as for 1000", claim1000, end1000)
}
