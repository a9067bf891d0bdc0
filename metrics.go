// metrics.go: the Prometheus metrics, and the run statistics collector
// behind them.

package controller

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
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
//	controllers_unhealthy                            gauge      controllers failing or stuck: those Health reports
//	controllers_active                               gauge      controllers installed and not yet terminated
//	controllers_stopping                             gauge      controllers removed whose DoFunc or StopFunc has not returned
//	controllers_longest_running_seconds              gauge      how long the longest-running DoFunc has run (0: none runs)
//	controllers_panics_total{group_name}             counter    recovered panics of DoFunc and StopFunc
//	controllers_run_timeouts_total{group_name}       counter    runs that lasted their RunTimeout (also counted as failures)
//
// status is "success" or "failure". When several Managers share a Metrics,
// each gauge is their sum (the longest-running one, their maximum).
// controllers_stopping, controllers_unhealthy and
// controllers_longest_running_seconds are computed when scraped, visiting every controller of the Managers that
// record into the Metrics; controllers_active counts installed and
// stopping controllers, controllers_stopping the latter alone. A nil *Metrics records nothing.
type Metrics struct {
	// Run counts and durations are kept in runStats rather than in a
	// prometheus.HistogramVec and CounterVec: one run then costs one
	// bucket increment and one add to the sum, and the collector derives
	// controllers_runs_total from the bucket counts when scraped.
	runs        [2]runStats // by runStatus
	runsDesc    *prometheus.Desc
	runDuration *prometheus.Desc
	// Gauges computed when scraped, from the Managers in the registry
	// that record here: a run costs nothing for them.
	stoppingDesc  *prometheus.Desc
	longestDesc   *prometheus.Desc
	unhealthyDesc *prometheus.Desc
	upperNanos    []int64   // bucket upper bounds in nanoseconds, rounded down
	upper         []float64 // the same in seconds, as given

	groupRuns *prometheus.CounterVec // nil when DisableGroupMetrics
	failing   prometheus.Gauge
	active    prometheus.Gauge
	panics    *prometheus.CounterVec
	timeouts  *prometheus.CounterVec

	groupsMu sync.Mutex
	groups   map[string]*groupHandles
}

// runStats are the runs of one status: a count per duration bucket (the
// last one unbounded), the sum of the durations, and failed StopFuncs,
// which count as runs without a duration.
type runStats struct {
	buckets  []atomic.Uint64
	noDurRun atomic.Uint64

	// The sum of the durations: recent ones in nanoseconds, one atomic
	// add each, folded into folded (seconds) once they pass foldAt. A
	// duration that large alone (18 years) goes to folded directly, so
	// the integer cannot overflow.
	sumNanos atomic.Int64
	foldMu   sync.Mutex
	folded   float64
}

const foldAt = 1 << 59 // nanoseconds, about 18 years

func (s *runStats) observe(m *Metrics, took time.Duration) {
	i := 0
	for i < len(m.upperNanos) && int64(took) > m.upperNanos[i] {
		i++
	}
	s.buckets[i].Add(1)
	if took >= foldAt {
		s.foldMu.Lock()
		s.folded += took.Seconds()
		s.foldMu.Unlock()
	} else if s.sumNanos.Add(int64(took)) >= foldAt {
		s.foldMu.Lock()
		s.folded += float64(s.sumNanos.Swap(0)) / 1e9
		s.foldMu.Unlock()
	}
}

// snapshot returns the cumulative bucket counts, their total and the sum.
func (s *runStats) snapshot(upper []float64) (cumulative map[float64]uint64, count uint64, sum float64) {
	cumulative = make(map[float64]uint64, len(upper))
	for i := range s.buckets {
		count += s.buckets[i].Load()
		if i < len(upper) {
			cumulative[upper[i]] = count
		}
	}
	s.foldMu.Lock()
	sum = s.folded + float64(s.sumNanos.Load())/1e9
	s.foldMu.Unlock()
	return cumulative, count, sum
}

// Index of runStats by status.
const (
	runSuccess = 0
	runFailure = 1
)

var runStatusNames = [2]string{runSuccess: success, runFailure: failure}

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
	for i := range buckets {
		if i > 0 && !(buckets[i] > buckets[i-1]) || math.IsNaN(buckets[i]) {
			panic(fmt.Sprintf("controller: NewMetrics: MetricsOpts.DurationBuckets must be strictly increasing, got %v", buckets))
		}
	}
	if n := len(buckets); n > 0 && math.IsInf(buckets[n-1], +1) {
		buckets = buckets[:n-1] // +Inf is always there
	}
	ns, cl := opts.Namespace, opts.ConstLabels
	m := &Metrics{
		upper:      slices.Clone(buckets),
		upperNanos: make([]int64, len(buckets)),
		runsDesc: prometheus.NewDesc(prometheus.BuildFQName(ns, "", "controllers_runs_total"),
			"Number of controller runs (DoFunc calls, and failed StopFunc calls), by outcome.",
			[]string{labelStatus}, cl),
		runDuration: prometheus.NewDesc(prometheus.BuildFQName(ns, "", "controllers_runs_duration_seconds"),
			"Duration of controller runs (DoFunc calls) in seconds, by outcome.",
			[]string{labelStatus}, cl),
		stoppingDesc: prometheus.NewDesc(prometheus.BuildFQName(ns, "", "controllers_stopping"),
			"Number of controllers removed whose DoFunc or StopFunc has not returned yet.",
			nil, cl),
		unhealthyDesc: prometheus.NewDesc(prometheus.BuildFQName(ns, "", "controllers_unhealthy"),
			"Number of installed controllers that are failing or stuck, the ones Health reports.",
			nil, cl),
		longestDesc: prometheus.NewDesc(prometheus.BuildFQName(ns, "", "controllers_longest_running_seconds"),
			"How long the longest-running DoFunc, of an installed or a stopping controller, has run, in seconds; 0 when none runs.",
			nil, cl),
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
		timeouts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, ConstLabels: cl,
			Name: "controllers_run_timeouts_total",
			Help: "Number of controller runs that lasted their RunTimeout, by group; each also counts as a failed run.",
		}, []string{labelGroup}),
	}
	for i, b := range buckets {
		m.upperNanos[i] = durationFloor(b)
	}
	for i := range m.runs {
		m.runs[i].buckets = make([]atomic.Uint64, len(buckets)+1)
	}
	if !opts.DisableGroupMetrics {
		m.groupRuns = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, ConstLabels: cl,
			Name: "controllers_group_runs_total",
			Help: "Number of controller runs by group and outcome.",
		}, []string{labelGroup, labelStatus})
	}
	return m
}

// durationFloor returns the largest duration in nanoseconds that is not
// above the bound of s seconds, saturating at the ends of int64.
func durationFloor(s float64) int64 {
	ns := math.Floor(s * 1e9)
	switch {
	case ns >= math.MaxInt64:
		return math.MaxInt64
	case ns <= math.MinInt64:
		return math.MinInt64
	}
	return int64(ns)
}

// Describe implements [prometheus.Collector].
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.runsDesc
	ch <- m.runDuration
	ch <- m.stoppingDesc
	ch <- m.longestDesc
	ch <- m.unhealthyDesc
	for _, c := range m.collectors() {
		c.Describe(ch)
	}
}

// Collect implements [prometheus.Collector].
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	for i := range m.runs {
		buckets, count, sum := m.runs[i].snapshot(m.upper)
		ch <- prometheus.MustNewConstMetric(m.runsDesc, prometheus.CounterValue,
			float64(count+m.runs[i].noDurRun.Load()), runStatusNames[i])
		ch <- prometheus.MustNewConstHistogram(m.runDuration, count, sum, buckets, runStatusNames[i])
	}
	stopping, unhealthy, longest := m.scrapeManagers(time.Now())
	ch <- prometheus.MustNewConstMetric(m.stoppingDesc, prometheus.GaugeValue, float64(stopping))
	ch <- prometheus.MustNewConstMetric(m.unhealthyDesc, prometheus.GaugeValue, float64(unhealthy))
	ch <- prometheus.MustNewConstMetric(m.longestDesc, prometheus.GaugeValue, longest.Seconds())
	for _, c := range m.collectors() {
		c.Collect(ch)
	}
}

// scrapeManagers returns, over the Managers recording into m, the number of
// controllers stopping, the number of installed ones that are not healthy,
// and how long the longest-running DoFunc has run at now. It visits every
// controller of those Managers: the cost of a scrape, not of a run.
func (m *Metrics) scrapeManagers(now time.Time) (stopping, unhealthy int64, longest time.Duration) {
	oldest := now.UnixNano()
	for _, mgr := range registry.snapshot() {
		if mgr.metricsOrDefault() != m {
			continue
		}
		mgr.mu.Lock()
		stopping += mgr.stoppingN.Load()
		for _, c := range mgr.controllers {
			c.mu.Lock()
			s := c.runningSinceLocked()
			stuck, _, _, _ := c.stuckLocked(now.UnixNano())
			if c.failingLocked() || stuck {
				unhealthy++
			}
			c.mu.Unlock()
			if s != 0 && s < oldest {
				oldest = s
			}
		}
		for _, s := range mgr.stopping {
			if s := s.c.runningSince(); s != 0 && s < oldest {
				oldest = s
			}
		}
		mgr.mu.Unlock()
	}
	return stopping, unhealthy, now.Sub(time.Unix(0, oldest))
}

func (m *Metrics) collectors() []prometheus.Collector {
	cs := []prometheus.Collector{m.failing, m.active, m.panics, m.timeouts}
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
	timeouts         prometheus.Counter // nil: metrics off
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
	// A name that is not UTF-8 makes the parameters invalid, but they
	// are installed all the same, and the label library panics on it.
	label := strings.ToValidUTF8(name, "\uFFFD")
	g := &groupHandles{panics: m.panics.WithLabelValues(label), timeouts: m.timeouts.WithLabelValues(label)}
	if m.groupRuns != nil && name != "" {
		g.success = m.groupRuns.WithLabelValues(label, success)
		g.failure = m.groupRuns.WithLabelValues(label, failure)
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
		m.runs[runFailure].observe(m, took)
		if g.failure != nil {
			g.failure.Inc()
		}
		return
	}
	m.runs[runSuccess].observe(m, took)
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
	m.runs[runFailure].noDurRun.Add(1)
	if g.failure != nil {
		g.failure.Inc()
	}
}

func (m *Metrics) countPanic(g *groupHandles) {
	if m != nil {
		g.panics.Inc()
	}
}

func (m *Metrics) countTimeout(g *groupHandles) {
	if m != nil {
		g.timeouts.Inc()
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
