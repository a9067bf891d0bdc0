// The pages an example serves (its -listen): each replica's placement
// page and health, ha's handlers.

package examplekit

import (
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/bgctl/controller/ha"
)

// Serve listens on addr and serves, until stop, ha.StatusHandler and
// ha.HealthHandler of each replica of rs under /replicas/<id>/, and the
// first's at /placement and /readyz. It prints the address it listens on.
// The server's goroutine is owned by Serve and joined by stop.
func Serve(addr string, rs []*ha.Replica) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/placement", ha.StatusHandler(rs[0]))
	mux.Handle("/readyz", ha.HealthHandler(rs[0]))
	index := "/placement\n/readyz\n"
	for _, r := range rs {
		mux.Handle("/replicas/"+r.ID()+"/placement", ha.StatusHandler(r))
		mux.Handle("/replicas/"+r.ID()+"/readyz", ha.HealthHandler(r))
		index += "/replicas/" + r.ID() + "/placement\n/replicas/" + r.ID() + "/readyz\n"
	}
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprint(w, index)
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
