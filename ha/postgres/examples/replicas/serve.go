// The pages (-listen): ha's placement page and health handler of each
// replica, and an index of them.

package main

import (
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/bgctl/controller/ha"
)

// serve listens on addr and serves, until stop, the placement page
// (ha.StatusHandler) and health (ha.HealthHandler) of each replica of rs
// under /replicas/<id>/, the first's also at /placement and /readyz, and
// their list at /. It prints the address it listens on. The server's
// goroutine is owned by serve and joined by stop.
func serve(addr string, rs []*ha.Replica) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	pages := map[string]*ha.Replica{"": rs[0]}
	for _, r := range rs {
		pages["/replicas/"+r.ID()] = r
	}
	var index strings.Builder
	for _, r := range rs {
		fmt.Fprintf(&index, "/replicas/%s/placement\n/replicas/%s/readyz\n", r.ID(), r.ID())
	}
	for base, r := range pages {
		mux.Handle(base+"/placement", ha.StatusHandler(r))
		mux.Handle(base+"/readyz", ha.HealthHandler(r))
	}
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprint(w, "/placement\n/readyz\n"+index.String())
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan struct{})
	go func() { // joined by stop
		defer close(served)
		_ = srv.Serve(ln) // ends with srv.Close
	}()
	fmt.Printf("serving http://%s/ (the pages it lists)\n", ln.Addr())
	return func() {
		_ = srv.Close()
		<-served
	}, nil
}
