// Command endpoint re-creates the job an agent such as Cilium's does for its
// network endpoints. Each endpoint is an owner that embeds a
// controller.Manager and binds its controllers to its own lifetime:
//
//   - sync-to-store writes the endpoint's revision to a key-value store
//     that refuses writes at random; failures are retried with a linear
//     backoff capped at one second, and every regeneration triggers it;
//   - regenerate bumps the endpoint's revision every second, with jitter;
//   - annotate writes an annotation once and ends with an ExitReason.
//
// Endpoints are created and deleted while the program runs; deleting one
// removes all its controllers and waits for their StopFuncs, which clean
// up the endpoint's keys. Every two seconds the program prints the status
// of every controller. With -listen it also serves /metrics, /controllers
// and /healthz. It stops after -duration, or on SIGINT or SIGTERM.
//
//	go run ./examples/endpoint -duration 10s -listen 127.0.0.1:9090
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/bgctl/controller"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/sirupsen/logrus"
)

// errStoreUnavailable is what the store answers to a write it refuses.
var errStoreUnavailable = errors.New("store unavailable")

// kvStore is an in-memory key-value store whose writes fail when its
// failure policy says so. Deletes never fail, so cleanup in a StopFunc
// always succeeds.
type kvStore struct {
	mu    sync.Mutex
	data  map[string]string
	fails func(key string) bool // called under mu
}

func newKVStore(fails func(key string) bool) *kvStore {
	if fails == nil {
		fails = func(string) bool { return false }
	}
	return &kvStore{data: make(map[string]string), fails: fails}
}

// randomFailures returns a failure policy that refuses a write with
// probability rate, drawing from a generator seeded with seed, so a run can
// be repeated.
func randomFailures(seed uint64, rate float64) func(string) bool {
	rng := rand.New(rand.NewPCG(seed, seed))
	return func(string) bool { return rng.Float64() < rate }
}

// SetFailures replaces the failure policy.
func (s *kvStore) SetFailures(fails func(key string) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fails = fails
}

// Put writes value under key, unless the context is done or the failure
// policy refuses the write.
func (s *kvStore) Put(ctx context.Context, key, value string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fails(key) {
		return fmt.Errorf("put %s: %w", key, errStoreUnavailable)
	}
	s.data[key] = value
	return nil
}

// Delete removes key.
func (s *kvStore) Delete(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.data, key)
}

// Get returns the value under key.
func (s *kvStore) Get(key string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.data[key]
	return v, ok
}

// Keys returns the keys that start with prefix, sorted.
func (s *kvStore) Keys(prefix string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var keys []string
	for k := range s.data {
		if strings.HasPrefix(k, prefix) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys
}

// Endpoint is the owner of three controllers. It embeds a Manager by value,
// so deleting the endpoint is deleting its controllers.
type Endpoint struct {
	controller.Manager

	ID    int
	store *kvStore

	mu       sync.Mutex
	revision int // bumped by every regeneration
}

// Names of the controller groups: a small fixed set for the metrics'
// group_name label, never derived from an endpoint id.
var (
	groupSync       = controller.NewGroup("endpoint-sync")
	groupRegenerate = controller.NewGroup("endpoint-regenerate")
	groupAnnotate   = controller.NewGroup("endpoint-annotate")
)

// newEndpoint returns an endpoint with its controllers installed. opts
// configure its Manager.
func newEndpoint(id int, store *kvStore, opts ...controller.Option) *Endpoint {
	ep := &Endpoint{ID: id, store: store, revision: 1}
	// The Manager is embedded by value, so it cannot come from NewManager;
	// an Option is a func(*Manager), and applying the options before the
	// Manager's first use configures it as NewManager would.
	for _, o := range opts {
		o(&ep.Manager)
	}

	ep.UpdateController(ep.controllerName("sync-to-store"), controller.ControllerParams{
		Group:                  groupSync,
		DoFunc:                 ep.syncToStore,
		StopFunc:               ep.deleteFromStore,
		ErrorRetryBaseDuration: 100 * time.Millisecond,
		MaxRetryInterval:       time.Second,
	})
	ep.UpdateController(ep.controllerName("regenerate"), controller.ControllerParams{
		Group:       groupRegenerate,
		DoFunc:      ep.regenerate,
		RunInterval: time.Second,
		Jitter:      250 * time.Millisecond,
	})
	ep.UpdateController(ep.controllerName("annotate"), controller.ControllerParams{
		Group:                  groupAnnotate,
		DoFunc:                 ep.annotate,
		StopFunc:               ep.removeAnnotation,
		ErrorRetryBaseDuration: 100 * time.Millisecond,
		MaxRetryInterval:       time.Second,
	})
	return ep
}

func (ep *Endpoint) controllerName(what string) string {
	return fmt.Sprintf("endpoint-%d-%s", ep.ID, what)
}

func (ep *Endpoint) storeKey() string      { return fmt.Sprintf("endpoint/%d", ep.ID) }
func (ep *Endpoint) annotationKey() string { return ep.storeKey() + "/annotation" }

// syncToStore writes the current revision. The endpoint's lock is held
// only to read the revision, not across the write, so a slow store never
// blocks the endpoint.
func (ep *Endpoint) syncToStore(ctx context.Context) error {
	ep.mu.Lock()
	rev := ep.revision
	ep.mu.Unlock()
	return ep.store.Put(ctx, ep.storeKey(), fmt.Sprintf("revision=%d", rev))
}

func (ep *Endpoint) deleteFromStore(ctx context.Context) error {
	ep.store.Delete(ep.storeKey())
	return nil
}

// regenerate bumps the revision and asks sync-to-store to write it.
func (ep *Endpoint) regenerate(ctx context.Context) error {
	ep.mu.Lock()
	ep.revision++
	ep.mu.Unlock()
	ep.TriggerController(ep.controllerName("sync-to-store"))
	return nil
}

// annotate writes the annotation once; the ExitReason tells the controller
// there is nothing more to do.
func (ep *Endpoint) annotate(ctx context.Context) error {
	if err := ep.store.Put(ctx, ep.annotationKey(), "managed-by=endpoint-example"); err != nil {
		return err
	}
	return controller.NewExitReason("annotation applied")
}

func (ep *Endpoint) removeAnnotation(ctx context.Context) error {
	ep.store.Delete(ep.annotationKey())
	return nil
}

// Delete tears the endpoint down: when it returns, every controller of the
// endpoint has been removed and its StopFunc has run, or ctx ended first.
func (ep *Endpoint) Delete(ctx context.Context) error {
	return ep.Shutdown(ctx)
}

// agent owns the endpoints.
type agent struct {
	store    *kvStore
	ctrlOpts []controller.Option

	mu        sync.Mutex
	endpoints []*Endpoint // oldest first
	lastID    int
}

func newAgent(store *kvStore, opts ...controller.Option) *agent {
	return &agent{store: store, ctrlOpts: opts}
}

// createEndpoint creates the next endpoint.
func (a *agent) createEndpoint() *Endpoint {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.lastID++
	ep := newEndpoint(a.lastID, a.store, a.ctrlOpts...)
	a.endpoints = append(a.endpoints, ep)
	return ep
}

// deleteOldest deletes the oldest endpoint; it returns nil when there is
// none.
func (a *agent) deleteOldest(ctx context.Context) (*Endpoint, error) {
	a.mu.Lock()
	if len(a.endpoints) == 0 {
		a.mu.Unlock()
		return nil, nil
	}
	ep := a.endpoints[0]
	a.endpoints = a.endpoints[1:]
	a.mu.Unlock()
	return ep, ep.Delete(ctx)
}

func (a *agent) snapshot() []*Endpoint {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.endpoints)
}

// health is nil when no controller of any endpoint is failing, else the
// Health errors of the endpoints, joined.
func (a *agent) health() error {
	var errs []error
	for _, ep := range a.snapshot() {
		errs = append(errs, ep.Health())
	}
	return errors.Join(errs...)
}

// shutdown deletes every endpoint.
func (a *agent) shutdown(ctx context.Context) error {
	a.mu.Lock()
	eps := a.endpoints
	a.endpoints = nil
	a.mu.Unlock()
	var errs []error
	for _, ep := range eps {
		errs = append(errs, ep.Delete(ctx))
	}
	return errors.Join(errs...)
}

// newHandler serves the agent's introspection endpoints, the last two the
// library's handlers over every Manager of the process (each endpoint
// has its own):
//
//	/metrics      the Prometheus metrics in reg
//	/controllers  the status of every controller: a page in a browser,
//	              a table for curl, JSON with ?format=json
//	/healthz      200 "ok", or 503 and the failing or stuck controllers
func newHandler(reg *prometheus.Registry) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.Handle("GET /controllers", controller.StatusHandler(nil))
	mux.Handle("GET /healthz", controller.HealthHandler(nil))
	return mux
}

// newMetrics returns the library's metrics as this program exports them.
func newMetrics(clusterID string) *controller.Metrics {
	return controller.NewMetrics(controller.MetricsOpts{
		Namespace:   "agent",
		ConstLabels: prometheus.Labels{"cluster_id": clusterID},
		// DoFuncs here take microseconds; the default buckets start at 5ms.
		DurationBuckets: []float64{0.0001, 0.001, 0.01, 0.1, 1},
	})
}

// config is what run does; the options change it.
type config struct {
	duration        time.Duration
	statusInterval  time.Duration
	churnInterval   time.Duration
	shutdownTimeout time.Duration
	initial         int
	listen          string
	onListen        func(addr string)
	clusterID       string
	store           *kvStore
	logger          logrus.FieldLogger
}

type option func(*config)

func withDuration(d time.Duration) option      { return func(c *config) { c.duration = d } }
func withChurnInterval(d time.Duration) option { return func(c *config) { c.churnInterval = d } }
func withListen(addr string) option            { return func(c *config) { c.listen = addr } }
func withOnListen(f func(addr string)) option  { return func(c *config) { c.onListen = f } }
func withStore(s *kvStore) option              { return func(c *config) { c.store = s } }
func withLogger(l logrus.FieldLogger) option   { return func(c *config) { c.logger = l } }

// run creates endpoints, deletes the oldest and creates a new one every
// churn interval, prints the status of every controller every status
// interval, and, after the duration or when ctx ends, deletes every
// endpoint and returns.
func run(ctx context.Context, out io.Writer, opts ...option) error {
	cfg := config{
		duration:        10 * time.Second,
		statusInterval:  2 * time.Second,
		churnInterval:   3 * time.Second,
		shutdownTimeout: 5 * time.Second,
		initial:         3,
		clusterID:       "example-cluster",
		logger:          logrus.StandardLogger(),
	}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.store == nil {
		cfg.store = newKVStore(randomFailures(1, 0.3))
	}

	reg := prometheus.NewRegistry()
	met := newMetrics(cfg.clusterID)
	reg.MustRegister(met)
	a := newAgent(cfg.store, controller.WithLogger(cfg.logger), controller.WithMetrics(met))
	for range cfg.initial {
		fmt.Fprintf(out, "created endpoint %d\n", a.createEndpoint().ID)
	}

	shutdown := func(errs ...error) error {
		ctx, cancel := context.WithTimeout(context.Background(), cfg.shutdownTimeout)
		defer cancel()
		return errors.Join(append(errs, a.shutdown(ctx))...)
	}

	var srv *http.Server
	served := make(chan error, 1)
	if cfg.listen != "" {
		ln, err := net.Listen("tcp", cfg.listen)
		if err != nil {
			return shutdown(err)
		}
		srv = &http.Server{Handler: newHandler(reg), ReadHeaderTimeout: 5 * time.Second}
		// Joined below, after srv.Shutdown made Serve return.
		go func() { served <- srv.Serve(ln) }()
		fmt.Fprintf(out, "serving /metrics, /controllers and /healthz on http://%s\n", ln.Addr())
		if cfg.onListen != nil {
			cfg.onListen(ln.Addr().String())
		}
	}

	status := time.NewTicker(cfg.statusInterval)
	defer status.Stop()
	churn := time.NewTicker(cfg.churnInterval)
	defer churn.Stop()
	deadline := time.NewTimer(cfg.duration)
	defer deadline.Stop()
	var errs []error
loop:
	for {
		select {
		case <-status.C:
			if err := controller.FormatStatus(out, controller.GetGlobalStatus(), true); err != nil {
				errs = append(errs, err)
				break loop
			}
			fmt.Fprintln(out)
		case <-churn.C:
			dctx, cancel := context.WithTimeout(context.Background(), cfg.shutdownTimeout)
			ep, err := a.deleteOldest(dctx)
			cancel()
			if err != nil {
				errs = append(errs, err)
				break loop
			}
			if ep != nil {
				fmt.Fprintf(out, "deleted endpoint %d (%d controllers left)\n", ep.ID, len(ep.GetStatusModel()))
			}
			fmt.Fprintf(out, "created endpoint %d\n", a.createEndpoint().ID)
		case <-deadline.C:
			break loop
		case <-ctx.Done():
			break loop
		}
	}

	if srv != nil {
		sctx, cancel := context.WithTimeout(context.Background(), cfg.shutdownTimeout)
		errs = append(errs, srv.Shutdown(sctx))
		cancel()
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			errs = append(errs, err)
		}
	}
	return shutdown(errs...)
}

func main() {
	duration := flag.Duration("duration", 10*time.Second, "how long to run before shutting down")
	listen := flag.String("listen", "", "serve /metrics, /controllers and /healthz on this address, e.g. 127.0.0.1:9090")
	seed := flag.Uint64("seed", 1, "seed of the store's random failures")
	failRate := flag.Float64("fail-rate", 0.3, "probability that the store refuses a write")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	log := logrus.New()
	log.SetLevel(logrus.InfoLevel)
	err := run(ctx, os.Stdout,
		withDuration(*duration),
		withListen(*listen),
		withStore(newKVStore(randomFailures(*seed, *failRate))),
		withLogger(log),
	)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "endpoint:", err)
		os.Exit(1)
	}
}
