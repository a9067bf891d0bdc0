// A genuine duplicate ID against a real etcd: the replica that finds its
// ID taken says so at Warn, rate-limited, and in Status, and joins again
// once the other is gone.

package ha

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// A replica cut off until its lease expired finds, once healed, another
// live replica joined under its ID. It retries every 200ms or so; it must
// say why at Warn once, not at every attempt, show it in Status, and join
// again as soon as the other leaves.
func TestDuplicateIDIsReported(t *testing.T) {
	opts := testOptions()
	warned := countWarnings(&opts, "cannot join again")
	c := newCluster(t, 3, opts)
	a := c.join("r0")
	c.waitPlacement(c.expected([]string{"r0"}), 10*time.Second)
	a.proxy.cut()

	// The other replica of the same ID joins once a's lease has expired;
	// until then Join refuses it (or times out, on a loaded machine).
	bcli := newClient(t, testEtcd)
	bopts := opts
	bopts.Prefix, bopts.ID = c.prefix, "r0"
	var b *Replica
	refused := 0
	for deadline := time.Now().Add(15 * time.Second); b == nil; {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		r, err := Join(ctx, bcli, bopts)
		cancel()
		switch {
		case err == nil:
			b = r
		case time.Now().After(deadline):
			t.Fatalf("the second r0 could not join within 15s: %v", err)
		default:
			if errors.Is(err, ErrDuplicateID) {
				refused++
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	if refused == 0 {
		t.Error("the second r0's Join was never refused with ErrDuplicateID while the first held the ID")
	}
	t.Cleanup(func() { b.Close(); bcli.Close() })
	for _, name := range c.names {
		if err := b.UpdateController(name, c.rec.params("r0 (second)", name)); err != nil {
			t.Fatal(err)
		}
	}
	second := map[string]string{}
	for _, name := range c.names {
		second[name] = "r0 (second)"
	}
	c.waitPlacement(second, 10*time.Second)

	a.proxy.heal()
	const watchFor = 3 * time.Second // some fifteen attempts
	time.Sleep(watchFor)
	st := a.r.Status()
	t.Logf("%v after the heal: %d warnings; status: lease %q, join error %q", watchFor, warned.n.Load(), st.Lease, st.JoinError)
	if n := warned.n.Load(); n != 1 {
		t.Errorf("%d warnings about the duplicate ID in %v, want 1 (at Warn, at most every %v)", n, watchFor, duplicateWarnEvery)
	}
	if st.Lease != "" || !strings.Contains(st.JoinError, ErrDuplicateID.Error()) {
		t.Errorf("the first r0's status: lease %q, join error %q; want no lease and an error that says %q", st.Lease, st.JoinError, ErrDuplicateID)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.Leave(ctx); err != nil {
		t.Fatalf("the second r0's Leave: %v", err)
	}
	took := c.waitPlacement(c.expected([]string{"r0"}), 10*time.Second)
	st = a.r.Status()
	t.Logf("the first r0 runs every name again %v after the second left; status: lease %q, join error %q", took, st.Lease, st.JoinError)
	if st.Lease == "" || st.JoinError != "" {
		t.Errorf("the first r0's status after it joined again: lease %q, join error %q; want a lease and no error", st.Lease, st.JoinError)
	}
	c.rec.assertNoOverlap(t)
}
