// The example's HTTP server (-listen): the group's placement as any
// replica sees it, each replica's readiness, the controllers' status and
// the metrics.

package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/bgctl/controller"
	"github.com/bgctl/controller/ha"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// serveHTTP listens on addr (port 0: one the kernel picks) and serves,
// until stop:
//
//	/placement                  who runs what, as the replica pageFrom sees it (HTML, JSON or text)
//	/replicas/<id>/placement    the same, as replica <id> sees it
//	/replicas/<id>/readyz       replica <id>'s Health: 200 ok, or 503 and why
//	/controllers                the status of every controller running in the process
//	/metrics                    the core's and the replicas' metrics, from reg
//
// It prints the address it listens on. The server's goroutine is owned by
// serveHTTP and joined by stop.
func serveHTTP(addr string, reg *prometheus.Registry, replicas map[string]*ha.Replica, pageFrom string) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.Handle("/placement", ha.StatusHandler(replicas[pageFrom]))
	mux.Handle("/controllers", controller.StatusHandler(nil))
	ids := make([]string, 0, len(replicas))
	for id, r := range replicas {
		ids = append(ids, id)
		mux.Handle("/replicas/"+id+"/placement", ha.StatusHandler(r))
		mux.Handle("/replicas/"+id+"/readyz", ha.HealthHandler(r))
	}
	slices.Sort(ids)
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "/placement\n/controllers\n/metrics")
		for _, id := range ids {
			fmt.Fprintf(w, "/replicas/%s/placement\n/replicas/%s/readyz\n", id, id)
		}
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }() // joined by stop
	base := "http://" + ln.Addr().String()
	fmt.Printf("listening on %s: %s/placement, %s/metrics, %s/controllers, %s/replicas/{%s}/readyz\n",
		base, base, base, base, base, strings.Join(ids, ","))
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			fmt.Printf("http server: %v\n", err)
		}
	}, nil
}
