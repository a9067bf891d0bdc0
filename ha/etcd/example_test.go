// Examples for the package documentation. They need an etcd, so they
// are compiled but not run; ha/examples/replicas is the runnable program.

package etcd_test

import (
	"context"
	"log"
	"time"

	"github.com/bgctl/controller"
	"github.com/bgctl/controller/ha"
	"github.com/bgctl/controller/ha/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Every replica of the service runs the same code: join, register every
// controller, leave on shutdown. Each controller runs on one replica.
func ExampleStore() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:2379"}, DialTimeout: 5 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := ha.Join(ctx, etcd.Store(cli), ha.Options{Prefix: "/my-service", TTL: 10 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	_ = r.UpdateController("pod-gc", controller.ControllerParams{
		DoFunc:      func(ctx context.Context) error { return nil }, // one step of work
		RunInterval: time.Minute,
	})

	// ... on shutdown: the other replicas take pod-gc over at once.
	if err := r.Leave(ctx); err != nil {
		log.Print(err)
	}
}

// A write that must never come from a former holder of the name, even one
// that was frozen and woke up after its claim moved, is guarded by the
// claim in an etcd transaction.
func ExampleHeld() {
	var cli *clientv3.Client // the service's client
	doFunc := func(ctx context.Context) error {
		claim, ok := ha.ClaimFrom(ctx)
		if !ok {
			return nil // not run by a Replica
		}
		resp, err := cli.Txn(ctx).
			If(etcd.Held(claim)).
			Then(clientv3.OpPut("/my-service/state", "written by the holder")).
			Commit()
		if err != nil {
			return err // retried with backoff
		}
		if !resp.Succeeded {
			return controller.NewExitReason("claim lost: another replica runs this now")
		}
		return nil
	}
	_ = doFunc
}
