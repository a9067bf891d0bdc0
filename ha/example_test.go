// Examples for the package documentation. The one that joins needs a
// store, so it is compiled but not run; ha/etcd and ha/kube have the
// examples that make one, and examples/replicas is the runnable program.

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
)

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
	var store ha.Store // etcd.Store(cli), or kube.Store(cfg, namespace, kube.StoreOptions{})
	opts := controller.MetricsOpts{Namespace: "my_service"}
	coreMetrics, replicaMetrics := controller.NewMetrics(opts), ha.NewMetrics(opts)
	registry := prometheus.NewRegistry()
	registry.MustRegister(coreMetrics, replicaMetrics)

	r, err := ha.Join(context.Background(), store, ha.Options{
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
