package controller

import (
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// MetricsOpts configures [NewMetrics]. The zero value gives the metric names
// of the table in [Metrics], default histogram buckets and per-group metrics.
type MetricsOpts struct {
	// Namespace prefixes every metric name: "cilium" gives
	// cilium_controllers_runs_total and so on, the names of Cilium's
	// dashboards. Empty: no prefix.
	Namespace string

	// ConstLabels are added to every metric, e.g. a cluster id. Nil: none.
	ConstLabels prometheus.Labels

	// DurationBuckets are the upper bounds, in seconds and strictly
	// increasing, of controllers_runs_duration_seconds. Nil:
	// prometheus.DefBuckets.
	DurationBuckets []float64

	// DisableGroupMetrics, when true, leaves out
	// controllers_group_runs_total. False (the default): it is collected.
	DisableGroupMetrics bool
}

// Metrics holds the Prometheus metrics of one or more [Manager]s and
// implements [prometheus.Collector]; register it to export them:
//
//	m := controller.NewMetrics(controller.MetricsOpts{Namespace: "agent"})
//	registry.MustRegister(m)
//	mgr := controller.NewManager(controller.WithMetrics(m))
//
// The metrics, with an empty Namespace:
//
//	controllers_runs_total{status}                   counter    one per DoFunc run; a failed StopFunc counts as failure
//	controllers_runs_duration_seconds{status}        histogram  duration of each DoFunc run
//	controllers_group_runs_total{group_name,status}  counter    the same per group (not for the zero Group)
//	controllers_failing                              gauge      controllers whose consecutive failure count is > 0
//	controllers_active                               gauge      controllers installed and not yet terminated
//	controllers_panics_total{group_name}             counter    recovered panics of DoFunc and StopFunc
//
// status is "success" or "failure". When several Managers share a Metrics,
// each gauge is their sum. A nil *Metrics records nothing.
type Metrics struct {
	runs        *prometheus.CounterVec
	runDuration *prometheus.HistogramVec
	groupRuns   *prometheus.CounterVec // nil when DisableGroupMetrics
	failing     prometheus.Gauge
	active      prometheus.Gauge
	panics      *prometheus.CounterVec

	// The children the run loop touches on every run, resolved once so a
	// run does not hash label values.
	runsSuccess, runsFailure prometheus.Counter
	durSuccess, durFailure   prometheus.Observer

	groupsMu sync.Mutex
	groups   map[string]*groupHandles
}

// DefaultMetrics is used by every [Manager] created without [WithMetrics],
// the zero Manager included. Nothing is registered until the program
// registers it:
//
//	prometheus.MustRegister(controller.DefaultMetrics)
var DefaultMetrics = NewMetrics(MetricsOpts{})

const (
	labelStatus = "status"
	labelGroup  = "group_name"
	success     = "success"
	failure     = "failure"
)

// NewMetrics returns a new, unregistered set of metrics. It panics, naming
// the field, when opts.DurationBuckets are not strictly increasing: that is
// a programming error, like an invalid regular expression in
// regexp.MustCompile.
func NewMetrics(opts MetricsOpts) *Metrics {
	buckets := opts.DurationBuckets
	if buckets == nil {
		buckets = prometheus.DefBuckets
	}
	for i := 1; i < len(buckets); i++ {
		if !(buckets[i] > buckets[i-1]) {
			panic(fmt.Sprintf("controller: NewMetrics: MetricsOpts.DurationBuckets must be strictly increasing, got %v", buckets))
		}
	}
	ns, cl := opts.Namespace, opts.ConstLabels
	m := &Metrics{
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, ConstLabels: cl,
			Name: "controllers_runs_total",
			Help: "Number of controller runs (DoFunc calls, and failed StopFunc calls), by outcome.",
		}, []string{labelStatus}),
		runDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, ConstLabels: cl,
			Name:    "controllers_runs_duration_seconds",
			Help:    "Duration of controller runs (DoFunc calls) in seconds, by outcome.",
			Buckets: buckets,
		}, []string{labelStatus}),
		failing: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, ConstLabels: cl,
			Name: "controllers_failing",
			Help: "Number of controllers whose consecutive failure count is above zero.",
		}),
		active: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, ConstLabels: cl,
			Name: "controllers_active",
			Help: "Number of controllers installed and not yet terminated.",
		}),
		panics: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, ConstLabels: cl,
			Name: "controllers_panics_total",
			Help: "Number of panics recovered from controllers' DoFunc and StopFunc, by group.",
		}, []string{labelGroup}),
	}
	if !opts.DisableGroupMetrics {
		m.groupRuns = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, ConstLabels: cl,
			Name: "controllers_group_runs_total",
			Help: "Number of controller runs by group and outcome.",
		}, []string{labelGroup, labelStatus})
	}
	m.runsSuccess = m.runs.WithLabelValues(success)
	m.runsFailure = m.runs.WithLabelValues(failure)
	m.durSuccess = m.runDuration.WithLabelValues(success)
	m.durFailure = m.runDuration.WithLabelValues(failure)
	return m
}

// Describe implements [prometheus.Collector].
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.collectors() {
		c.Describe(ch)
	}
}

// Collect implements [prometheus.Collector].
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.collectors() {
		c.Collect(ch)
	}
}

func (m *Metrics) collectors() []prometheus.Collector {
	cs := []prometheus.Collector{m.runs, m.runDuration, m.failing, m.active, m.panics}
	if m.groupRuns != nil {
		cs = append(cs, m.groupRuns)
	}
	return cs
}

// groupHandles are the metrics children of one group, shared by every
// controller of that group and resolved when a controller's parameters
// change, so that a run does not hash label values.
type groupHandles struct {
	success, failure prometheus.Counter // nil: no per-group counting
	panics           prometheus.Counter // nil: metrics off
}

// noMetrics are the handles of a Manager whose metrics are off.
var noMetrics = &groupHandles{}

// group returns the handles of the named group.
func (m *Metrics) group(name string) *groupHandles {
	if m == nil {
		return noMetrics
	}
	m.groupsMu.Lock()
	defer m.groupsMu.Unlock()
	if g, ok := m.groups[name]; ok {
		return g
	}
	g := &groupHandles{panics: m.panics.WithLabelValues(name)}
	if m.groupRuns != nil && name != "" {
		g.success = m.groupRuns.WithLabelValues(name, success)
		g.failure = m.groupRuns.WithLabelValues(name, failure)
	}
	if m.groups == nil {
		m.groups = make(map[string]*groupHandles)
	}
	m.groups[name] = g
	return g
}

// observeRun records one DoFunc run.
func (m *Metrics) observeRun(g *groupHandles, failed bool, took time.Duration) {
	if m == nil {
		return
	}
	if failed {
		m.runsFailure.Inc()
		m.durFailure.Observe(took.Seconds())
		if g.failure != nil {
			g.failure.Inc()
		}
		return
	}
	m.runsSuccess.Inc()
	m.durSuccess.Observe(took.Seconds())
	if g.success != nil {
		g.success.Inc()
	}
}

// countStopFailure records a failed StopFunc: a failure in the run counters,
// no duration.
func (m *Metrics) countStopFailure(g *groupHandles) {
	if m == nil {
		return
	}
	m.runsFailure.Inc()
	if g.failure != nil {
		g.failure.Inc()
	}
}

func (m *Metrics) countPanic(g *groupHandles) {
	if m != nil {
		g.panics.Inc()
	}
}

func (m *Metrics) addFailing(d float64) {
	if m != nil {
		m.failing.Add(d)
	}
}

func (m *Metrics) addActive(d float64) {
	if m != nil {
		m.active.Add(d)
	}
}
