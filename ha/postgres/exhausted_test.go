// A pool exhausted by user code: the replicas on it cannot renew, their
// fences stop their names, and once the connections come back every
// name runs again on one replica, none on two at once.

package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

func TestReplicasRecoverFromAPoolUserCodeExhausted(t *testing.T) {
	t.Parallel()
	const conns = 6
	pool := newPool(t, conns)
	store := Store(pool, StoreOptions{})
	group := newGroup("exhausted")
	replicas, rec, once := joinThree(t, store, group)

	// User code takes every connection the pool will make, for longer
	// than the replicas' TTL.
	var held []*pgxpool.Conn
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for len(held) < conns {
		c, err := pool.Acquire(ctx)
		if err != nil {
			break // the feeds hold the rest (hijacked, outside the count)
		}
		held = append(held, c)
	}
	exhausted := time.Now()
	await(t, 2*replicaTTL+5*time.Second, "every name stopped while the pool is exhausted", func() bool {
		_, count := placement(replicas)
		return len(count) == 0
	})
	t.Logf("every name stopped %v after the pool was exhausted (%d connections taken)", time.Since(exhausted).Round(10*time.Millisecond), len(held))
	for _, c := range held {
		c.Release()
	}
	released := time.Now()
	await(t, replicaTTL+15*time.Second, "every name on one replica once the pool has room", once)
	t.Logf("every name ran again %v after the connections came back", time.Since(released).Round(10*time.Millisecond))
	if o := rec.Overlaps(); len(o) > 0 {
		t.Errorf("names ran on two replicas at once: %v", o)
	}
}
