// Tests of the replicas' metrics: their names beside the core's, lint,
// and what each counts through joins, a removal, a partition and a leave.

package etcd

import (
	"slices"
	"testing"
	"time"

	"github.com/bgctl/controller"
	"github.com/bgctl/controller/ha"
	"github.com/bgctl/controller/ha/internal/place"
	"github.com/bgctl/controller/ha/internal/probe"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
)

// gathered returns the value of the metric name (a counter, a gauge, or
// a histogram's sample count) whose labels include labels, and whether
// reg has it.
func gathered(t *testing.T, reg prometheus.Gatherer, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue metrics
				}
			}
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				return m.GetCounter().GetValue(), true
			case dto.MetricType_GAUGE:
				return m.GetGauge().GetValue(), true
			case dto.MetricType_HISTOGRAM:
				return float64(m.GetHistogram().GetSampleCount()), true
			}
		}
	}
	return 0, false
}

// The replicas' metrics share the core's namespace and constant labels,
// sit in the same registry, and pass the linter.
func TestMetricsNamesAndLint(t *testing.T) {
	opts := controller.MetricsOpts{Namespace: "svc", ConstLabels: prometheus.Labels{"cluster": "c1"}}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(controller.NewMetrics(opts), ha.NewMetrics(opts))
	problems, err := testutil.GatherAndLint(reg)
	if err != nil || len(problems) != 0 {
		t.Fatalf("lint: %v %v", problems, err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, mf := range mfs {
		names = append(names, mf.GetName())
		for _, m := range mf.GetMetric() {
			if !slices.ContainsFunc(m.GetLabel(), func(lp *dto.LabelPair) bool { return lp.GetName() == "cluster" && lp.GetValue() == "c1" }) {
				t.Errorf("%s has no cluster=c1", mf.GetName())
			}
		}
	}
	for _, want := range []string{
		"svc_controllers_runs_total", // the core's, beside
		"svc_controllers_replica_fence_passes_total",
		"svc_controllers_replica_claims_held",
		"svc_controllers_replica_claims_acquired_total",
		"svc_controllers_replica_claims_released_total",
		"svc_controllers_replica_keepalive_rtt_seconds",
		"svc_controllers_replica_watch_lag_seconds",
		"svc_controllers_replica_names_owner_unconfirmed",
	} {
		if !slices.Contains(names, want) {
			t.Errorf("no %s among %v", want, names)
		}
	}
	for _, reason := range []string{"moved", "removed", "lost", "leave"} {
		if _, ok := gathered(t, reg, "svc_controllers_replica_claims_released_total", map[string]string{"reason": reason}); !ok {
			t.Errorf("no released counter for reason %s before any release", reason)
		}
	}
}

// What each metric counts: r0 alone takes every name; r1 joins and takes
// its share (moved from r0); r0 removes one name; r1 is cut off (its fence
// passes, its claims lost); r0 leaves. Keepalive round trips and the
// watch lag come with every replica. Each replica records into a Metrics
// of its own, so that the counts are told apart.
func TestMetricsCount(t *testing.T) {
	const names = 12
	c := newCluster(t, names, testOptions())
	m0, m1 := ha.NewMetrics(controller.MetricsOpts{}), ha.NewMetrics(controller.MetricsOpts{})
	reg0, reg1 := prometheus.NewPedanticRegistry(), prometheus.NewPedanticRegistry()
	reg0.MustRegister(m0)
	reg1.MustRegister(m1)
	value := func(reg prometheus.Gatherer, name string, labels ...string) float64 {
		t.Helper()
		l := map[string]string{}
		for i := 0; i+1 < len(labels); i += 2 {
			l[labels[i]] = labels[i+1]
		}
		v, ok := gathered(t, reg, "controllers_replica_"+name, l)
		if !ok {
			t.Fatalf("no %s %v", name, labels)
		}
		return v
	}
	expect := func(reg prometheus.Gatherer, name string, want float64, labels ...string) {
		t.Helper()
		if got := value(reg, name, labels...); got != want {
			t.Errorf("%s %v = %v, want %v", name, labels, got, want)
		}
	}

	c.opts.Metrics = m0
	r0 := c.join("r0")
	c.waitPlacement(c.expected([]string{"r0"}), 10*time.Second)
	expect(reg0, "claims_held", names)
	expect(reg0, "claims_acquired_total", names)
	waitFor(t, "an answered keepalive", func() bool { return value(reg0, "keepalive_rtt_seconds") > 0 })
	if lag := value(reg0, "watch_lag_seconds"); lag < 0 || lag > probe.Window(c.opts).Seconds() {
		t.Errorf("watch lag %vs, want within TTL − Margin", lag)
	}

	c.opts.Metrics = m1
	r1 := c.join("r1")
	both := c.expected([]string{"r0", "r1"})
	c.waitPlacement(both, 10*time.Second)
	moved := float64(len(place.On(both, "r1")))
	waitFor(t, "r0's released claims deleted", func() bool { return value(reg0, "claims_held") == names-moved })
	expect(reg0, "claims_released_total", moved, "reason", "moved")
	expect(reg1, "claims_acquired_total", moved)
	expect(reg1, "claims_held", moved)

	gone := place.On(both, "r0")[0]
	// Unregistered on every replica, as a service does: registered on r1
	// alone, it would run there.
	if err := r1.r.RemoveController(gone); err != nil {
		t.Fatal(err)
	}
	if err := r0.r.RemoveControllerAndWait(gone); err != nil {
		t.Fatal(err)
	}
	expect(reg0, "claims_released_total", 1, "reason", "removed")
	expect(reg0, "claims_held", names-moved-1)

	r1.proxy.cut()
	waitFor(t, "r1's fence to pass", func() bool { return value(reg1, "fence_passes_total") == 1 })
	expect(reg1, "claims_released_total", moved, "reason", "lost")
	expect(reg1, "claims_held", 0)
	expect(reg0, "fence_passes_total", 0)

	c.leave(r0) // r0 may have taken r1's names over meanwhile, its lease expired
	expect(reg0, "claims_held", 0)
	acquired := value(reg0, "claims_acquired_total")
	expect(reg0, "claims_released_total", acquired-moved-1, "reason", "leave") // acquired − released = held = 0
	expect(reg0, "claims_released_total", 0, "reason", "lost")
	c.rec.AssertNoOverlap(t)
}
