// A replica that was frozen while it held a claim, and wakes after another
// replica took the name over, cannot write through the claim's revision.

package etcd

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/bgctl/controller"
	"github.com/bgctl/controller/ha"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The local fence cannot stop a process that was frozen (SIGSTOP, a long
// pause) inside its DoFunc: when it wakes its claim is gone, but its code
// goes on. Here A's DoFunc ignores its context, as a frozen process would,
// while A is cut off from etcd; B takes the name over once A's lease has
// expired. When A wakes, its write guarded by the claim is refused by
// etcd, while B's went through, and an unguarded write of A's still would.
func TestFencedWriteFromAFormerHolderIsRefused(t *testing.T) {
	c := newCluster(t, 0, testOptions())
	data := c.prefix + "/data"
	type write struct {
		claim     ha.Claim
		succeeded bool
		err       error
	}
	fencedWrite := func(cli *clientv3.Client, value string, claim ha.Claim) write {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := cli.Txn(ctx).If(Held(claim)).Then(clientv3.OpPut(data, value)).Commit()
		if err != nil {
			return write{claim: claim, err: err}
		}
		return write{claim: claim, succeeded: resp.Succeeded}
	}

	a := c.join("a")
	wake, aStarted, aWrote := make(chan struct{}), make(chan ha.Claim, 1), make(chan write, 1)
	aCause := make(chan error, 1)
	err := a.r.UpdateController("job", controller.ControllerParams{DoFunc: func(ctx context.Context) error {
		claim, ok := ha.ClaimFrom(ctx)
		if !ok {
			t.Error("A's DoFunc context carries no claim")
		}
		aStarted <- claim
		<-wake // frozen: the cancellation goes unseen
		aCause <- context.Cause(ctx)
		aWrote <- fencedWrite(a.cli, "from a", claim)
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	aClaim := <-aStarted

	a.proxy.cut()
	b := c.join("b")
	bWrote := make(chan write, 1)
	err = b.r.UpdateController("job", controller.ControllerParams{DoFunc: func(ctx context.Context) error {
		claim, _ := ha.ClaimFrom(ctx)
		bWrote <- fencedWrite(b.cli, "from b", claim)
		<-ctx.Done()
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	var bw write
	select {
	case bw = <-bWrote:
	case <-time.After(c.opts.TTL + 5*time.Second):
		t.Fatal("B never took the name over")
	}
	if bw.err != nil || !bw.succeeded {
		t.Fatalf("B's fenced write: succeeded %v, err %v", bw.succeeded, bw.err)
	}
	if bw.claim.Revision <= aClaim.Revision || bw.claim.Key != aClaim.Key {
		t.Errorf("B's claim %+v should be a newer holding of A's %+v", bw.claim, aClaim)
	}

	a.proxy.heal()
	close(wake)
	aw := <-aWrote
	if cause := <-aCause; !errors.Is(cause, ha.ErrFencePassed) {
		t.Errorf("A's DoFunc context ended with %v, want ErrFencePassed", cause)
	}
	if aw.err != nil {
		t.Fatalf("A's fenced write failed to reach etcd: %v", aw.err)
	}
	if aw.succeeded {
		t.Fatal("etcd accepted a write guarded by a claim A no longer held")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	got, err := a.cli.Get(ctx, data)
	if err != nil || len(got.Kvs) != 1 || string(got.Kvs[0].Value) != "from b" {
		t.Fatalf("data = %v (err %v), want B's write", got.Kvs, err)
	}
	// The same write without the guard goes through: the guard made the
	// difference.
	if _, err := a.cli.Put(ctx, data, "from a, unguarded"); err != nil {
		t.Fatalf("A cannot reach etcd: %v", err)
	}
}
