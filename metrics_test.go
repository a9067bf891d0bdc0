// Tests of the Prometheus metrics.

package controller

import (
	"context"
	"math"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The metrics, as Prometheus gathers them, with a namespace, constant
// labels and buckets of the user's: lint-clean and counting every run,
// failure, panic and duration by outcome and group.
func TestMetrics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, MetricsOpts{Namespace: "cilium", ConstLabels: prometheus.Labels{"cluster": "c1"}, DurationBuckets: []float64{0.5, 2}})
		r := newRecorder(errBoom, errBoom, nil)
		r.took = time.Second
		e.m.UpdateController("c", ControllerParams{DoFunc: r.do, Group: NewGroup("sync")})
		e.m.UpdateController("p", ControllerParams{DoFunc: func(context.Context) error { panic("x") }, NoErrorRetry: true})
		time.Sleep(7 * time.Second) // c: fails 0-1, 2-3, succeeds 5-6
		problems, err := testutil.GatherAndLint(e.reg)
		require.NoError(t, err)
		assert.Empty(t, problems)
		want := `
# HELP cilium_controllers_active Number of controllers installed and not yet terminated.
# TYPE cilium_controllers_active gauge
cilium_controllers_active{cluster="c1"} 2
# HELP cilium_controllers_failing Number of controllers whose consecutive failure count is above zero.
# TYPE cilium_controllers_failing gauge
cilium_controllers_failing{cluster="c1"} 1
# HELP cilium_controllers_group_runs_total Number of controller runs by group and outcome.
# TYPE cilium_controllers_group_runs_total counter
cilium_controllers_group_runs_total{cluster="c1",group_name="sync",status="failure"} 2
cilium_controllers_group_runs_total{cluster="c1",group_name="sync",status="success"} 1
# HELP cilium_controllers_longest_running_seconds How long the longest-running DoFunc, of an installed or a stopping controller, has run, in seconds; 0 when none runs.
# TYPE cilium_controllers_longest_running_seconds gauge
cilium_controllers_longest_running_seconds{cluster="c1"} 0
# HELP cilium_controllers_panics_total Number of panics recovered from controllers' DoFunc and StopFunc, by group.
# TYPE cilium_controllers_panics_total counter
cilium_controllers_panics_total{cluster="c1",group_name=""} 1
cilium_controllers_panics_total{cluster="c1",group_name="sync"} 0
# HELP cilium_controllers_run_timeouts_total Number of controller runs that lasted their RunTimeout, by group; each also counts as a failed run.
# TYPE cilium_controllers_run_timeouts_total counter
cilium_controllers_run_timeouts_total{cluster="c1",group_name=""} 0
cilium_controllers_run_timeouts_total{cluster="c1",group_name="sync"} 0
# HELP cilium_controllers_runs_duration_seconds Duration of controller runs (DoFunc calls) in seconds, by outcome.
# TYPE cilium_controllers_runs_duration_seconds histogram
cilium_controllers_runs_duration_seconds_bucket{cluster="c1",status="failure",le="0.5"} 1
cilium_controllers_runs_duration_seconds_bucket{cluster="c1",status="failure",le="2"} 3
cilium_controllers_runs_duration_seconds_bucket{cluster="c1",status="failure",le="+Inf"} 3
cilium_controllers_runs_duration_seconds_sum{cluster="c1",status="failure"} 2
cilium_controllers_runs_duration_seconds_count{cluster="c1",status="failure"} 3
cilium_controllers_runs_duration_seconds_bucket{cluster="c1",status="success",le="0.5"} 0
cilium_controllers_runs_duration_seconds_bucket{cluster="c1",status="success",le="2"} 1
cilium_controllers_runs_duration_seconds_bucket{cluster="c1",status="success",le="+Inf"} 1
cilium_controllers_runs_duration_seconds_sum{cluster="c1",status="success"} 1
cilium_controllers_runs_duration_seconds_count{cluster="c1",status="success"} 1
# HELP cilium_controllers_runs_total Number of controller runs (DoFunc calls, and failed StopFunc calls), by outcome.
# TYPE cilium_controllers_runs_total counter
cilium_controllers_runs_total{cluster="c1",status="failure"} 3
cilium_controllers_runs_total{cluster="c1",status="success"} 1
# HELP cilium_controllers_stopping Number of controllers removed whose DoFunc or StopFunc has not returned yet.
# TYPE cilium_controllers_stopping gauge
cilium_controllers_stopping{cluster="c1"} 0
# HELP cilium_controllers_unhealthy Number of installed controllers that are failing or stuck, the ones Health reports.
# TYPE cilium_controllers_unhealthy gauge
cilium_controllers_unhealthy{cluster="c1"} 1
`
		assert.NoError(t, testutil.GatherAndCompare(e.reg, strings.NewReader(want)))
		e.m.RemoveAllAndWait()
		assert.Equal(t, 0.0, testutil.ToFloat64(e.metrics.active))
		assert.Equal(t, 0.0, testutil.ToFloat64(e.metrics.failing))
	})
}

// MetricsOpts: group metrics can be turned off, bad buckets panic at
// NewMetrics with a message, and WithMetrics(nil) records nothing.
func TestMetricsOptions(t *testing.T) {
	t.Run("DisableGroupMetrics", func(t *testing.T) {
		m := NewMetrics(MetricsOpts{DisableGroupMetrics: true})
		reg := prometheus.NewPedanticRegistry()
		reg.MustRegister(m)
		mfs, err := reg.Gather()
		require.NoError(t, err)
		for _, mf := range mfs {
			assert.NotEqual(t, "controllers_group_runs_total", mf.GetName())
		}
	})
	t.Run("bad buckets", func(t *testing.T) {
		assert.PanicsWithValue(t, "controller: NewMetrics: MetricsOpts.DurationBuckets must be strictly increasing, got [1 1]",
			func() { NewMetrics(MetricsOpts{DurationBuckets: []float64{1, 1}}) })
	})
	t.Run("WithMetrics(nil) turns metrics off", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			before := DefaultMetrics.runsTotal(runFailure)
			m := NewManager(WithMetrics(nil), WithLogger(quietLogger()))
			m.UpdateController("c", ControllerParams{DoFunc: func(context.Context) error { panic("x") }})
			synctest.Wait()
			m.RemoveAllAndWait()
			assert.Equal(t, before, DefaultMetrics.runsTotal(runFailure))
		})
	})
}

// A Metrics shared by several Managers reports the sum of their gauges.
func TestMetricsSharedByManagers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		met := NewMetrics(MetricsOpts{})
		m1, m2 := NewManager(WithMetrics(met), WithLogger(quietLogger())), NewManager(WithMetrics(met), WithLogger(quietLogger()))
		m1.UpdateController("a", ControllerParams{DoFunc: func(context.Context) error { return errBoom }})
		m2.UpdateController("a", ControllerParams{DoFunc: func(context.Context) error { return errBoom }})
		m2.UpdateController("b", ControllerParams{DoFunc: NoopFunc})
		synctest.Wait()
		assert.Equal(t, 3.0, testutil.ToFloat64(met.active))
		assert.Equal(t, 2.0, testutil.ToFloat64(met.failing))
		m1.RemoveAllAndWait()
		assert.Equal(t, 2.0, testutil.ToFloat64(met.active))
		assert.Equal(t, 1.0, testutil.ToFloat64(met.failing))
		m2.RemoveAllAndWait()
	})
}

// The run duration sum stays exact across the point where its nanosecond
// counter is folded into seconds, and a single enormous duration does not
// overflow it.
func TestRunDurationSumFolds(t *testing.T) {
	m := NewMetrics(MetricsOpts{})
	s := &m.runs[runSuccess]
	s.observe(m, foldAt-time.Second)
	s.observe(m, 2*time.Second) // crosses foldAt: folded
	s.observe(m, time.Duration(math.MaxInt64))
	_, count, sum := s.snapshot(m.upper)
	assert.Equal(t, uint64(3), count)
	want := (foldAt + time.Second).Seconds() + time.Duration(math.MaxInt64).Seconds()
	assert.InEpsilon(t, want, sum, 1e-12)
	assert.Zero(t, s.sumNanos.Load(), "folded")
}

// The gauges computed at scrape time: controllers_longest_running_seconds
// follows the oldest running DoFunc, installed or removed and still
// running, of the Managers that record into the Metrics only;
// controllers_stopping counts the removed controllers that have not
// terminated, also past a Shutdown deadline.
func TestMetricsOfRunsInFlightAndStoppingControllers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		other := newEnv(t) // its own Metrics: not counted in e's
		gauges := func() (longest, stopping float64) {
			mfs, err := e.reg.Gather()
			require.NoError(t, err)
			for _, mf := range mfs {
				switch mf.GetName() {
				case "controllers_longest_running_seconds":
					longest = mf.GetMetric()[0].GetGauge().GetValue()
				case "controllers_stopping":
					stopping = mf.GetMetric()[0].GetGauge().GetValue()
				}
			}
			return longest, stopping
		}
		never := make(chan struct{})
		hang := func(context.Context) error { <-never; return nil }
		other.m.UpdateController("older", ControllerParams{DoFunc: hang})
		time.Sleep(time.Hour)
		e.m.UpdateController("hung", ControllerParams{DoFunc: hang})
		time.Sleep(90 * time.Second)
		e.m.UpdateController("young", ControllerParams{DoFunc: hang})
		e.m.UpdateController("idle", ControllerParams{DoFunc: NoopFunc})
		time.Sleep(30 * time.Second)
		longest, stopping := gauges()
		assert.Equal(t, 120.0, longest)
		assert.Equal(t, 0.0, stopping)

		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		assert.ErrorIs(t, e.m.Shutdown(ctx), context.DeadlineExceeded)
		time.Sleep(time.Minute)
		longest, stopping = gauges()
		assert.Equal(t, 181.0, longest, "a removed DoFunc that still runs counts")
		assert.Equal(t, 2.0, stopping)

		close(never)
		synctest.Wait()
		longest, stopping = gauges()
		assert.Equal(t, 0.0, longest)
		assert.Equal(t, 0.0, stopping)
		other.m.RemoveAllAndWait()
	})
}
