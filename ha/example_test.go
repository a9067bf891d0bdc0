// Examples for the package documentation. Those that join need an etcd,
// so they are compiled but not run; examples/replicas is the runnable
// program.

package ha_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"time"

	"github.com/bgctl/controller"
	"github.com/bgctl/controller/ha"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Every replica of the service runs the same code: join, register every
// controller, leave on shutdown. Each controller runs on one replica.
func ExampleJoin() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:2379"}, DialTimeout: 5 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := ha.Join(ctx, ha.Etcd(cli), ha.Options{Prefix: "/my-service", TTL: 10 * time.Second})
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
func ExampleClaim_Held() {
	var cli *clientv3.Client // the service's client
	doFunc := func(ctx context.Context) error {
		claim, ok := ha.ClaimFrom(ctx)
		if !ok {
			return nil // not run by a Replica
		}
		resp, err := cli.Txn(ctx).
			If(claim.Held()).
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

// registerSync is service code written once: it registers the service's
// controllers on Controllers, a Replica or Local of a Manager.
func registerSync(c ha.Controllers, synced chan<- struct{}) error {
	return c.UpdateController("sync", controller.ControllerParams{
		DoFunc: func(ctx context.Context) error {
			select {
			case synced <- struct{}{}:
			default:
			}
			return nil
		},
		RunInterval: time.Minute,
	})
}

// Where the service runs alone, Local runs every controller in this
// process, on a Manager; the registering code is the one that registers on
// a Replica.
func ExampleLocal() {
	m := controller.NewManager(controller.WithMetrics(nil))
	c := ha.Local(m)
	synced := make(chan struct{}, 1)
	if err := registerSync(c, synced); err != nil {
		log.Fatal(err)
	}
	<-synced
	fmt.Println("sync running here:", c.Running("sync"))
	if err := m.Shutdown(context.Background()); err != nil {
		log.Print(err)
	}
	// Output: sync running here: true
}

// A replica's observability: its metrics in the registry of the core's,
// made with the same options; who runs what, from any replica; and its
// health for a readiness probe.
func ExampleStatusHandler() {
	var cli *clientv3.Client // the service's client
	opts := controller.MetricsOpts{Namespace: "my_service"}
	coreMetrics, replicaMetrics := controller.NewMetrics(opts), ha.NewMetrics(opts)
	registry := prometheus.NewRegistry()
	registry.MustRegister(coreMetrics, replicaMetrics)

	r, err := ha.Join(context.Background(), ha.Etcd(cli), ha.Options{
		Prefix:         "/my-service",
		Metrics:        replicaMetrics,
		ManagerOptions: []controller.Option{controller.WithMetrics(coreMetrics)},
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{}))
	mux.Handle("/placement", ha.StatusHandler(r)) // HTML, JSON or text
	mux.Handle("/readyz", ha.HealthHandler(r))    // 503 and why, while not a working member
	log.Fatal(http.ListenAndServe(":8080", mux))
}
