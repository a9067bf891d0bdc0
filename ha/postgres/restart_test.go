// The server restarted under running replicas (a fast shutdown, then a
// start): they ride it out, their feeds listed again, and no name runs
// on two of them at once.

package postgres

import (
	"context"
	"testing"
	"time"
)

func TestReplicasRideOutAServerRestart(t *testing.T) {
	t.Parallel()
	srv, err := startPostgres() // a server of its own: the others' tests go on
	if err != nil {
		t.Fatalf("a second server: %v", err)
	}
	defer srv.Stop()
	pool := newPoolOn(t, srv.DSN, 16)
	store := Store(pool, StoreOptions{})
	group := newGroup("restart")
	replicas, rec, once := joinThree(t, store, group)

	down := time.Now()
	srv.Shutdown()
	time.Sleep(300 * time.Millisecond) // every request fails meanwhile
	if err := srv.Restart(); err != nil {
		t.Fatalf("starting the server again: %v", err)
	}
	t.Logf("the server was down %v", time.Since(down).Round(10*time.Millisecond))
	await(t, replicaTTL+10*time.Second, "every name on one replica after the restart", once)
	for id, r := range replicas {
		if err := r.Health(); err != nil {
			await(t, 10*time.Second, id+" healthy after the restart", func() bool { return r.Health() == nil })
		}
	}
	if o := rec.Overlaps(); len(o) > 0 {
		t.Errorf("names ran on two replicas at once: %v", o)
	}
	// Once their feeds listed again, one leaves, and its names move: at
	// once, or, if a replica's feed was still listing again when it
	// left (a busy machine), once that replica's wait for an early end
	// it did not watch ran out, a TTL.
	time.Sleep(2 * replicaTTL)
	left := time.Now()
	if err := replicas["r2"].Leave(context.Background()); err != nil {
		t.Fatalf("r2's Leave after the restart: %v", err)
	}
	delete(replicas, "r2")
	await(t, replicaTTL+2*time.Second, "r2's names on r0 and r1 after it left", once)
	t.Logf("r2's names moved %v after its Leave", time.Since(left).Round(10*time.Millisecond))
}
