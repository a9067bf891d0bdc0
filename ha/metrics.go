// The Prometheus metrics of replicas: fence passes, claims held, acquired
// and released, keepalive round trips, and how far behind the watch is.

package ha

import (
	"sync"
	"time"

	"github.com/bgctl/controller"
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics holds the Prometheus metrics of one or more replicas and
// implements [prometheus.Collector]. Make it with the options of the
// core's [controller.Metrics] and register both in the same registry, so
// that they share a namespace and constant labels:
//
//	opts := controller.MetricsOpts{Namespace: "svc"}
//	cm, hm := controller.NewMetrics(opts), ha.NewMetrics(opts)
//	registry.MustRegister(cm, hm)
//	r, err := ha.Join(ctx, etcd.Store(cli), ha.Options{
//		Prefix:         "/svc",
//		Metrics:        hm,
//		ManagerOptions: []controller.Option{controller.WithMetrics(cm)},
//	})
//
// The metrics, with an empty Namespace:
//
//	controllers_replica_fence_passes_total             counter    fences that passed: no keepalive answered in time, the lease lost, or the ID taken
//	controllers_replica_claims_held                    gauge      claims held: names running here, or stopping before their claim is deleted
//	controllers_replica_claims_acquired_total          counter    claims created
//	controllers_replica_claims_released_total{reason}  counter    claims given up, by reason (below)
//	controllers_replica_keepalive_rtt_seconds          histogram  round-trip time of each answered keepalive
//	controllers_replica_watch_lag_seconds              gauge      time since the watch of the group last delivered anything (below)
//	controllers_replica_names_owner_unconfirmed        gauge      names registered here whose owner is not known to register them (below)
//
// A claim is released for one of four reasons: moved (another member owns
// the name now), removed (the name was unregistered here), lost (its key
// was deleted under it, or the fence passed), leave (Leave or Close).
// Acquired minus released is the claims held. (A claim this replica
// created without learning so, its answer lost, is deleted when found,
// and counted nowhere: nothing ran under it.) The watch lag is the time
// since the watch of the group last delivered anything, events or a
// progress notification: a quiet watch is asked for its progress every
// (TTL − Margin)/4, so while the watch works the lag stays below about
// twice that period, and a watch that stopped delivering shows as a lag that
// grows until it is replaced, at TTL − Margin ([Replica.Health] reports
// it then). A watch that delivers but runs behind, catching up, does not
// show here.
//
// During a rolling upgrade the members register different names, and a
// name is owned only by a member that registers it, which the members
// learn from one another's published names. names_owner_unconfirmed counts
// the names registered on a replica whose owner has not published its
// names yet: such a name runs nowhere if the owner does not register it.
// It is 0 when every member registers the same names, and should fall
// back to 0 within a few etcd round trips of a member joining.
//
// When several replicas share a Metrics, claims_held is their sum and
// watch_lag_seconds their maximum; both are computed when scraped, visiting
// every replica recording into the Metrics. MetricsOpts.DurationBuckets and
// DisableGroupMetrics do not apply here.
type Metrics struct {
	fencePasses prometheus.Counter
	acquired    prometheus.Counter
	released    map[string]prometheus.Counter // by reason; immutable after NewMetrics
	releasedVec *prometheus.CounterVec
	rtt         prometheus.Histogram
	heldDesc    *prometheus.Desc
	lagDesc     *prometheus.Desc
	unconfDesc  *prometheus.Desc

	mu       sync.Mutex
	replicas map[*Replica]struct{} // guarded by mu; those recording here, from Join until their loop ends
}

// The reasons a claim is released, the values of the reason label.
const (
	releaseMoved   = "moved"
	releaseRemoved = "removed"
	releaseLost    = "lost"
	releaseLeave   = "leave"
)

// keepAliveBuckets are the upper bounds of keepalive_rtt_seconds: from a
// millisecond, a local etcd's round trip, to 10 s, beyond any fence window
// worth having.
var keepAliveBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

// DefaultMetrics is used by every [Replica] joined without
// Options.Metrics. Nothing is registered until the program registers it,
// as with [controller.DefaultMetrics]:
//
//	prometheus.MustRegister(controller.DefaultMetrics, ha.DefaultMetrics)
var DefaultMetrics = NewMetrics(controller.MetricsOpts{})

// NewMetrics returns a new, unregistered set of metrics named with
// opts.Namespace and labelled with opts.ConstLabels, as the core's
// [controller.NewMetrics] names its own.
func NewMetrics(opts controller.MetricsOpts) *Metrics {
	ns, cl := opts.Namespace, opts.ConstLabels
	m := &Metrics{
		fencePasses: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, ConstLabels: cl,
			Name: "controllers_replica_fence_passes_total",
			Help: "Number of times a replica's fence passed (no keepalive answered in time, the lease lost, or its ID taken), stopping every controller there.",
		}),
		acquired: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, ConstLabels: cl,
			Name: "controllers_replica_claims_acquired_total",
			Help: "Number of claims a replica created, each the start of a name's run there.",
		}),
		releasedVec: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, ConstLabels: cl,
			Name: "controllers_replica_claims_released_total",
			Help: "Number of claims a replica gave up, by reason: moved (owned by another member), removed (unregistered), lost (deleted under it, or the fence passed), leave (Leave or Close).",
		}, []string{"reason"}),
		rtt: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: ns, ConstLabels: cl,
			Name:    "controllers_replica_keepalive_rtt_seconds",
			Help:    "Round-trip time of each answered lease keepalive, in seconds.",
			Buckets: keepAliveBuckets,
		}),
		heldDesc: prometheus.NewDesc(prometheus.BuildFQName(ns, "", "controllers_replica_claims_held"),
			"Number of claims the replicas hold: names running there, or stopping before their claim is deleted.",
			nil, cl),
		lagDesc: prometheus.NewDesc(prometheus.BuildFQName(ns, "", "controllers_replica_watch_lag_seconds"),
			"Time since a replica's watch of its group last delivered events or a progress notification, in seconds; the largest of the replicas.",
			nil, cl),
		unconfDesc: prometheus.NewDesc(prometheus.BuildFQName(ns, "", "controllers_replica_names_owner_unconfirmed"),
			"Number of names registered on a replica whose owner is not known to register them (a rolling upgrade, until the owner's names are published): they may run nowhere.",
			nil, cl),
		released: make(map[string]prometheus.Counter),
		replicas: make(map[*Replica]struct{}),
	}
	for _, reason := range []string{releaseMoved, releaseRemoved, releaseLost, releaseLeave} {
		m.released[reason] = m.releasedVec.WithLabelValues(reason) // every reason exported from the start, at 0
	}
	return m
}

// Describe implements [prometheus.Collector].
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.heldDesc
	ch <- m.lagDesc
	ch <- m.unconfDesc
	for _, c := range m.collectors() {
		c.Describe(ch)
	}
}

// Collect implements [prometheus.Collector].
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	held, lag, unconfirmed := m.scrapeReplicas(time.Now())
	ch <- prometheus.MustNewConstMetric(m.heldDesc, prometheus.GaugeValue, float64(held))
	ch <- prometheus.MustNewConstMetric(m.lagDesc, prometheus.GaugeValue, lag.Seconds())
	ch <- prometheus.MustNewConstMetric(m.unconfDesc, prometheus.GaugeValue, float64(unconfirmed))
	for _, c := range m.collectors() {
		c.Collect(ch)
	}
}

func (m *Metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.fencePasses, m.acquired, m.releasedVec, m.rtt}
}

// scrapeReplicas returns the claims the replicas recording into m hold,
// the largest watch lag among them at now, and the names registered on
// them whose owner is not known to register them. It visits every slot of
// those replicas: the cost of a scrape, not of a claim; and their names
// only while a member is not known to register them.
func (m *Metrics) scrapeReplicas(now time.Time) (held int, lag time.Duration, unconfirmed int) {
	m.mu.Lock()
	rs := make([]*Replica, 0, len(m.replicas))
	for r := range m.replicas {
		rs = append(rs, r)
	}
	m.mu.Unlock()
	for _, r := range rs {
		r.mu.Lock()
		for _, s := range r.slots {
			if s.state != acquiring && !s.stray {
				held++
			}
		}
		lag = max(lag, now.Sub(r.heard))
		if members := r.unconfirmedLocked(); members != nil {
			for name := range r.regs {
				if members[r.ownerLocked(name)] {
					unconfirmed++
				}
			}
		}
		r.mu.Unlock()
	}
	return held, lag, unconfirmed
}

// add and remove make r count in the scraped gauges, from Join until its
// loop ends.
func (m *Metrics) add(r *Replica) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.replicas[r] = struct{}{}
}

func (m *Metrics) remove(r *Replica) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.replicas, r)
}
