// Command replicas runs three replicas of a service in one process, sharing
// twelve controllers through etcd, crashes one half-way and prints how the
// other two take its controllers over.
//
//	cd ha/examples/replicas
//	go run .                       # starts an etcd inside the process
//	go run . -etcd 127.0.0.1:2379  # uses a running one
//	go run . -serve-etcd           # only serves an etcd, for replicas of your own
//	go run . -listen :8080 -duration 5m  # and serves who runs what at /placement, beside /metrics
//
// It is a module of its own, so that the etcd server it embeds is never a
// dependency of github.com/bgctl/controller/ha.
//
// Each replica reaches etcd with its own client, as separate processes
// would. The crash closes the replica's client without revoking its
// lease, so the others wait for the lease to expire: about -ttl.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/bgctl/controller"
	"github.com/bgctl/controller/ha"
	"github.com/bgctl/controller/ha/etcd"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

func main() {
	etcdAddr := flag.String("etcd", "", "etcd client address host:port; empty: start an etcd inside this process, in a temporary directory")
	names := flag.Int("names", 12, "how many controllers the replicas share")
	ttl := flag.Duration("ttl", 2*time.Second, "lease TTL, whole seconds")
	duration := flag.Duration("duration", 8*time.Second, "how long to run; the crash comes half-way")
	verbose := flag.Bool("v", false, "show the replicas' Info logs (claims taken and released), and the etcd client's through log/slog")
	serveEtcd := flag.Bool("serve-etcd", false, "run no replicas: start the embedded etcd, print its address and serve until SIGINT or SIGTERM")
	listen := flag.String("listen", "", "serve HTTP on this host:port (port 0: any) while the replicas run: /placement, /metrics, /controllers, /replicas/<id>/readyz")
	flag.Parse()

	if *serveEtcd {
		if err := serveEmbeddedEtcd(); err != nil {
			log.Fatal(err)
		}
		return
	}

	addr := *etcdAddr
	if addr == "" {
		var stop func()
		var err error
		addr, stop, err = startEtcd()
		if err != nil {
			log.Fatalf("no -etcd given and the embedded etcd did not start: %v", err)
		}
		defer stop()
	}

	logger := logrus.New()
	logger.SetLevel(logrus.WarnLevel)
	// The etcd client logs with zap, apart from the replicas: quiet here,
	// or with -v through log/slog, as a service on slog would pass its
	// own logger. A request Leave or the crash cancels is a Debug line
	// there, below slog's default level: see etcd.ClientLogger.
	clientLog := zap.NewNop()
	if *verbose {
		logger.SetLevel(logrus.InfoLevel)
		clientLog = etcd.ClientLogger(slog.Default())
	}
	board := newBoard()
	prefix := fmt.Sprintf("/examples/replicas/%d", time.Now().UnixNano())
	// The core's metrics and the replicas', made with the same options
	// and registered together.
	metricsOpts := controller.MetricsOpts{Namespace: "example"}
	coreMetrics, haMetrics := controller.NewMetrics(metricsOpts), ha.NewMetrics(metricsOpts)
	registry := prometheus.NewRegistry()
	registry.MustRegister(coreMetrics, haMetrics)

	type member struct {
		cli *clientv3.Client
		r   *ha.Replica
	}
	members := map[string]member{}
	for _, id := range []string{"r0", "r1", "r2"} {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{addr}, DialTimeout: 5 * time.Second, Logger: clientLog})
		if err != nil {
			log.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		r, err := ha.Join(ctx, etcd.Store(cli), ha.Options{Prefix: prefix, ID: id, TTL: *ttl, Logger: logger,
			Metrics: haMetrics, ManagerOptions: []controller.Option{controller.WithMetrics(coreMetrics)}})
		cancel()
		if err != nil {
			log.Fatal(err)
		}
		// Every replica registers every controller; each runs on one.
		for i := range *names {
			name := fmt.Sprintf("job-%02d", i)
			_ = r.UpdateController(name, controller.ControllerParams{
				DoFunc: func(ctx context.Context) error {
					board.start(name, id)
					defer board.stop(name, id)
					<-ctx.Done() // a long-running job: it works until told to stop
					return nil
				},
				RunInterval: 100 * time.Millisecond,
			})
		}
		members[id] = member{cli, r}
	}

	if *listen != "" {
		replicas := map[string]*ha.Replica{}
		for id, m := range members {
			replicas[id] = m.r
		}
		stop, err := serveHTTP(*listen, registry, replicas, "r0")
		if err != nil {
			log.Fatal(err)
		}
		defer stop()
	}

	// The crash hits r1, which runs the most of the twelve names: the
	// names are spread by hashing, and with so few the shares are uneven.
	const victim = "r1"
	start := time.Now()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	crashed := false
	var crashAt time.Time
	var orphans []string
	for now := range tick.C {
		at := now.Sub(start).Round(100 * time.Millisecond)
		fmt.Printf("%5v  %s\n", at, strings.TrimRight(board.table(), " "))
		if !crashed && now.Sub(start) >= *duration/2 {
			crashed = true
			orphans = board.on(victim)
			fmt.Printf("%5v  crashing %s, which runs %s\n", at, victim, strings.Join(orphans, " "))
			crashAt = time.Now()
			m := members[victim]
			m.cli.Close() // no revoke: the lease must expire
			_ = m.r.Close()
			delete(members, victim)
			go func() { // ends when the victim's names run elsewhere, or with the program
				for !board.allElsewhere(orphans, victim) {
					time.Sleep(10 * time.Millisecond)
				}
				fmt.Printf("        the others took over %s's %d controllers %v after the crash (TTL %v)\n",
					victim, len(orphans), time.Since(crashAt).Round(10*time.Millisecond), *ttl)
			}()
		}
		if now.Sub(start) >= *duration {
			break
		}
	}
	for id := range members {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := members[id].r.Leave(ctx); err != nil {
			log.Print(err)
		}
		cancel()
		members[id].cli.Close()
	}
	runs, overlaps := board.summary()
	fmt.Printf("%d runs; %d times a controller started while it ran on another replica\n", runs, overlaps)
	if overlaps > 0 {
		os.Exit(1)
	}
}

// board records where each controller runs.
type board struct {
	mu       sync.Mutex
	where    map[string][]string // guarded by mu; replicas running the name now
	runs     int                 // guarded by mu
	overlaps int                 // guarded by mu
}

func newBoard() *board { return &board{where: map[string][]string{}} }

func (b *board) start(name, replica string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.runs++
	if len(b.where[name]) > 0 {
		b.overlaps++
	}
	b.where[name] = append(b.where[name], replica)
}

func (b *board) stop(name, replica string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.where[name] = slices.DeleteFunc(b.where[name], func(r string) bool { return r == replica })
}

func (b *board) on(replica string) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var names []string
	for name, rs := range b.where {
		if slices.Contains(rs, replica) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

func (b *board) allElsewhere(names []string, replica string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, name := range names {
		if rs := b.where[name]; len(rs) != 1 || rs[0] == replica {
			return false
		}
	}
	return true
}

// table prints "r0: 01 04 | r1: … | r2: …", the names each replica runs.
func (b *board) table() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	by := map[string][]string{}
	for name, rs := range b.where {
		for _, r := range rs {
			by[r] = append(by[r], strings.TrimPrefix(name, "job-"))
		}
	}
	var parts []string
	for _, r := range []string{"r0", "r1", "r2"} {
		slices.Sort(by[r])
		parts = append(parts, fmt.Sprintf("%s: %-24s", r, strings.Join(by[r], " ")))
	}
	return strings.Join(parts, " | ")
}

func (b *board) summary() (runs, overlaps int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.runs, b.overlaps
}
