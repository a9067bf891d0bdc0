// Command leaserenew re-creates the Kubernetes node-lease heartbeat: a node
// proves it is alive by renewing a lease object in a store every few
// seconds.
//
// The store here is in memory and uses optimistic concurrency, as the
// Kubernetes API does: every write carries the resource version it was
// based on, and a write based on a stale version fails with a conflict,
// after which the heartbeat re-reads the lease and tries again. One
// controller does the renewing:
//
//   - it renews every interval, plus up to 4 % jitter so that many nodes do
//     not renew in lockstep;
//   - after a failure it retries from 200ms, growing by 200ms per failure,
//     capped at 7s;
//   - its HealthReporter calls onRepeatedHeartbeatFailure once a streak of
//     failures reaches 5 (the kubelet uses such a hook to close its
//     connections to the API server);
//   - its StopFunc releases the lease.
//
// During the run another writer labels the lease (so the next renewal
// conflicts) and the store has an outage. The kubelet renews every 10s; this
// program renews every second so that a short run shows all of it.
//
//	go run ./examples/leaserenew -duration 12s
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/bgctl/controller"
	"github.com/sirupsen/logrus"
)

var (
	errNotFound      = errors.New("lease not found")
	errAlreadyExists = errors.New("lease already exists")
	errConflict      = errors.New("conflict: the lease was modified since it was read")
	errUnavailable   = errors.New("lease store unavailable")
)

// Lease is a node's lease, as the store holds it.
type Lease struct {
	Name            string
	HolderIdentity  string // empty: released
	RenewTime       time.Time
	LeaseDuration   time.Duration
	Labels          map[string]string
	ResourceVersion int64 // set by the store on every write
}

func (l Lease) clone() Lease {
	l.Labels = maps.Clone(l.Labels)
	return l
}

// request is one call the store answered, kept for the tests and the
// output.
type request struct {
	At  time.Time
	Op  string
	Err error
}

// leaseStore is an in-memory lease store with optimistic concurrency.
type leaseStore struct {
	mu       sync.Mutex
	leases   map[string]Lease
	lastRV   int64
	down     bool
	requests []request
}

func newLeaseStore() *leaseStore {
	return &leaseStore{leases: make(map[string]Lease)}
}

// begin records a request and returns the error it fails with, if any.
// The caller holds s.mu.
func (s *leaseStore) begin(ctx context.Context, op string) error {
	err := ctx.Err()
	if err == nil && s.down {
		err = errUnavailable
	}
	s.requests = append(s.requests, request{At: time.Now(), Op: op, Err: err})
	return err
}

// end records the outcome of the request begin recorded.
func (s *leaseStore) end(err error) {
	s.requests[len(s.requests)-1].Err = err
}

// Get returns the named lease.
func (s *leaseStore) Get(ctx context.Context, name string) (Lease, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.begin(ctx, "get"); err != nil {
		return Lease{}, err
	}
	l, ok := s.leases[name]
	if !ok {
		s.end(errNotFound)
		return Lease{}, errNotFound
	}
	return l.clone(), nil
}

// Create stores a new lease and returns it with its resource version.
func (s *leaseStore) Create(ctx context.Context, l Lease) (Lease, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.begin(ctx, "create"); err != nil {
		return Lease{}, err
	}
	if _, ok := s.leases[l.Name]; ok {
		s.end(errAlreadyExists)
		return Lease{}, errAlreadyExists
	}
	return s.storeLocked(l), nil
}

// Update replaces a lease, provided l.ResourceVersion is the stored one;
// otherwise it fails with errConflict and changes nothing.
func (s *leaseStore) Update(ctx context.Context, l Lease) (Lease, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.begin(ctx, "update"); err != nil {
		return Lease{}, err
	}
	cur, ok := s.leases[l.Name]
	switch {
	case !ok:
		s.end(errNotFound)
		return Lease{}, errNotFound
	case cur.ResourceVersion != l.ResourceVersion:
		err := fmt.Errorf("%w (have version %d, stored %d)", errConflict, l.ResourceVersion, cur.ResourceVersion)
		s.end(err)
		return Lease{}, err
	}
	return s.storeLocked(l), nil
}

func (s *leaseStore) storeLocked(l Lease) Lease {
	s.lastRV++
	l = l.clone()
	l.ResourceVersion = s.lastRV
	s.leases[l.Name] = l
	return l.clone()
}

// Label is another writer: it sets a label on the lease, which moves the
// lease to a new resource version behind the heartbeat's back.
func (s *leaseStore) Label(name, key, value string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	l, ok := s.leases[name]
	if !ok {
		return errNotFound
	}
	l = l.clone()
	if l.Labels == nil {
		l.Labels = make(map[string]string)
	}
	l.Labels[key] = value
	s.storeLocked(l)
	return nil
}

// SetDown starts (true) or ends (false) an outage: while down, every
// request fails with errUnavailable.
func (s *leaseStore) SetDown(down bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.down = down
}

// Requests returns the requests answered so far.
func (s *leaseStore) Requests() []request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]request(nil), s.requests...)
}

// maxUpdateAttempts bounds the re-read-and-retry on conflicts within one
// renewal; past it the conflict is a failure, retried with backoff.
const maxUpdateAttempts = 5

// heartbeat renews one node's lease. cached is touched only by renew and
// release, which are the controller's DoFunc and StopFunc: the library
// never runs those two at the same time, so no lock is needed.
type heartbeat struct {
	store         *leaseStore
	name          string
	holder        string
	leaseDuration time.Duration
	logf          func(format string, args ...any)

	cached *Lease // the lease as last written or read; nil: read it first
}

func newHeartbeat(store *leaseStore, node string, leaseDuration time.Duration, logf func(string, ...any)) *heartbeat {
	return &heartbeat{store: store, name: node, holder: node, leaseDuration: leaseDuration, logf: logf}
}

// renew is the DoFunc: one renewal.
func (h *heartbeat) renew(ctx context.Context) error {
	err := h.renewOnce(ctx)
	if err != nil && ctx.Err() == nil {
		h.logf("renewal failed: %v", err)
	}
	return err
}

// renewOnce renews the lease with as few requests as the cached lease
// allows, re-reading it after a conflict.
func (h *heartbeat) renewOnce(ctx context.Context) error {
	for attempt := 1; ; attempt++ {
		if h.cached == nil {
			l, err := h.store.Get(ctx, h.name)
			if errors.Is(err, errNotFound) {
				l, err = h.store.Create(ctx, Lease{
					Name: h.name, HolderIdentity: h.holder,
					RenewTime: time.Now(), LeaseDuration: h.leaseDuration,
				})
				if err == nil {
					h.cached = &l
					h.logf("created lease %s (version %d)", h.name, l.ResourceVersion)
					return nil
				}
			}
			if err != nil {
				return fmt.Errorf("reading lease %s: %w", h.name, err)
			}
			h.cached = &l
		}
		l := h.cached.clone()
		l.HolderIdentity, l.RenewTime, l.LeaseDuration = h.holder, time.Now(), h.leaseDuration
		updated, err := h.store.Update(ctx, l)
		h.cached = nil // re-read unless the update went through
		switch {
		case err == nil:
			h.cached = &updated
			h.logf("renewed lease %s (version %d)", h.name, updated.ResourceVersion)
			return nil
		case errors.Is(err, errConflict) && attempt < maxUpdateAttempts:
			h.logf("%v; re-reading", err)
		default:
			return fmt.Errorf("renewing lease %s: %w", h.name, err)
		}
	}
}

// release is the StopFunc: it gives the lease up, so another holder need
// not wait for it to expire.
func (h *heartbeat) release(ctx context.Context) error {
	for attempt := 1; ; attempt++ {
		l, err := h.store.Get(ctx, h.name)
		if errors.Is(err, errNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("releasing lease %s: %w", h.name, err)
		}
		l.HolderIdentity = ""
		if _, err = h.store.Update(ctx, l); err == nil {
			h.logf("released lease %s", h.name)
			return nil
		}
		if !errors.Is(err, errConflict) || attempt >= maxUpdateAttempts {
			return fmt.Errorf("releasing lease %s: %w", h.name, err)
		}
	}
}

// streakAlarm is a HealthReporter that calls hook once a streak of failures
// reaches threshold: once per streak, however long it lasts.
type streakAlarm struct {
	threshold int
	hook      func(err error)

	mu     sync.Mutex
	streak int
}

// OK ends the streak.
func (a *streakAlarm) OK(string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.streak = 0
}

// Degraded extends the streak and calls the hook when it reaches the
// threshold. The hook runs outside the lock.
func (a *streakAlarm) Degraded(_ string, err error) {
	a.mu.Lock()
	a.streak++
	fire := a.streak == a.threshold
	a.mu.Unlock()
	if fire {
		a.hook(err)
	}
}

// heartbeatParams are the controller's parameters: renew every interval
// plus up to jitterFactor×interval, retry failures after 200ms, 400ms, 600ms,
// … capped at 7s, and release the lease on removal.
func heartbeatParams(h *heartbeat, interval time.Duration, jitterFactor float64, health controller.HealthReporter) controller.ControllerParams {
	return controller.ControllerParams{
		Group:                  controller.NewGroup("node-lease"),
		DoFunc:                 h.renew,
		StopFunc:               h.release,
		RunInterval:            interval,
		Jitter:                 time.Duration(jitterFactor * float64(interval)),
		ErrorRetryBaseDuration: 200 * time.Millisecond,
		MaxRetryInterval:       7 * time.Second,
		Health:                 health,
	}
}

// heartbeatFailureThreshold is the streak of failures that calls
// onRepeatedHeartbeatFailure.
const heartbeatFailureThreshold = 5

// config is what run does; the options change it.
type config struct {
	duration      time.Duration
	renewInterval time.Duration
	jitterFactor  float64
	conflictAt    time.Duration // when another writer labels the lease; 0: never
	outageStart   time.Duration // 0: no outage
	outageEnd     time.Duration
	node          string
	store         *leaseStore
	logger        logrus.FieldLogger
	// onRepeatedHeartbeatFailure is called once a streak of failures
	// reaches heartbeatFailureThreshold. Nil: it prints a line.
	onRepeatedHeartbeatFailure func(err error)
}

type option func(*config)

func withDuration(d time.Duration) option    { return func(c *config) { c.duration = d } }
func withStore(s *leaseStore) option         { return func(c *config) { c.store = s } }
func withLogger(l logrus.FieldLogger) option { return func(c *config) { c.logger = l } }

// run keeps the node's lease renewed for the duration, or until ctx ends,
// then removes the controller, which releases the lease.
func run(ctx context.Context, out io.Writer, opts ...option) error {
	cfg := config{
		duration:      12 * time.Second,
		renewInterval: time.Second,
		jitterFactor:  0.04,
		conflictAt:    2500 * time.Millisecond,
		outageStart:   4500 * time.Millisecond,
		outageEnd:     10500 * time.Millisecond,
		node:          "node-1",
		logger:        logrus.StandardLogger(),
	}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.store == nil {
		cfg.store = newLeaseStore()
	}

	start := time.Now()
	var outMu sync.Mutex
	logf := func(format string, args ...any) {
		outMu.Lock()
		defer outMu.Unlock()
		fmt.Fprintf(out, "%8v  %s\n", time.Since(start).Round(time.Millisecond), fmt.Sprintf(format, args...))
	}
	hook := cfg.onRepeatedHeartbeatFailure
	if hook == nil {
		hook = func(err error) {
			logf("onRepeatedHeartbeatFailure: %d failures in a row, last: %v", heartbeatFailureThreshold, err)
		}
	}

	mgr := controller.NewManager(controller.WithLogger(cfg.logger), controller.WithMetrics(nil))
	h := newHeartbeat(cfg.store, cfg.node, 4*cfg.renewInterval, logf)
	alarm := &streakAlarm{threshold: heartbeatFailureThreshold, hook: hook}
	mgr.UpdateController("node-lease-heartbeat", heartbeatParams(h, cfg.renewInterval, cfg.jitterFactor, alarm))

	// at returns a channel that fires d after start, or never when d is 0.
	var timers []*time.Timer
	at := func(d time.Duration) <-chan time.Time {
		if d <= 0 {
			return nil
		}
		t := time.NewTimer(d - time.Since(start))
		timers = append(timers, t)
		return t.C
	}
	conflict, down, up, deadline := at(cfg.conflictAt), at(cfg.outageStart), at(cfg.outageEnd), at(cfg.duration)
	defer func() {
		for _, t := range timers {
			t.Stop()
		}
	}()
loop:
	for {
		select {
		case <-conflict:
			logf("another writer labels lease %s", cfg.node)
			if err := cfg.store.Label(cfg.node, "example.com/checked", "true"); err != nil {
				logf("labelling failed: %v", err)
			}
		case <-down:
			logf("lease store outage begins")
			cfg.store.SetDown(true)
		case <-up:
			logf("lease store is back")
			cfg.store.SetDown(false)
		case <-deadline:
			break loop
		case <-ctx.Done():
			break loop
		}
	}

	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return mgr.Shutdown(shutdownCtx)
}

func main() {
	duration := flag.Duration("duration", 12*time.Second, "how long to run before shutting down")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Stdout, withDuration(*duration))
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "leaserenew:", err)
		os.Exit(1)
	}
}
