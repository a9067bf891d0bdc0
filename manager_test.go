package controller

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestValidateNamesTheFieldAndValue(t *testing.T) {
	cases := []struct {
		name string
		p    ControllerParams
		want string
	}{
		{"nil DoFunc", ControllerParams{}, "DoFunc must not be nil"},
		{"RunInterval", ControllerParams{DoFunc: NoopFunc, RunInterval: -time.Second}, "RunInterval must not be negative, got -1s"},
		{"ErrorRetryBaseDuration", ControllerParams{DoFunc: NoopFunc, ErrorRetryBaseDuration: -2 * time.Millisecond}, "ErrorRetryBaseDuration must not be negative, got -2ms"},
		{"MaxRetryInterval", ControllerParams{DoFunc: NoopFunc, MaxRetryInterval: -3 * time.Second}, "MaxRetryInterval must not be negative, got -3s"},
		{"Jitter", ControllerParams{DoFunc: NoopFunc, Jitter: -time.Nanosecond}, "Jitter must not be negative, got -1ns"},
		{"MaxRetries", ControllerParams{DoFunc: NoopFunc, MaxRetries: -4}, "MaxRetries must not be negative, got -4"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.p.Validate()
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrInvalidParams)
			assert.EqualError(t, err, "invalid controller parameters: "+tc.want)
		})
	}
	t.Run("every problem is named", func(t *testing.T) {
		err := ControllerParams{RunInterval: -1, Jitter: -1}.Validate()
		assert.ErrorContains(t, err, "DoFunc")
		assert.ErrorContains(t, err, "RunInterval")
		assert.ErrorContains(t, err, "Jitter")
	})
	t.Run("the zero value of every other field is valid", func(t *testing.T) {
		assert.NoError(t, ControllerParams{DoFunc: NoopFunc}.Validate())
		assert.NoError(t, ControllerParams{DoFunc: NoopFunc, RunInterval: math.MaxInt64, MaxRetries: math.MaxInt}.Validate())
	})
}

// Invalid parameters install a visible, parked controller: one failure with
// the validation error, one Error log, Health.Degraded, counted as failing,
// no run; an update with valid parameters runs it.
func TestInvalidParamsInstallAParkedController(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		h := &healthLog{}
		r := newRecorder()
		c := e.m.UpdateController("c", ControllerParams{DoFunc: r.do, Health: h, RunInterval: -time.Second})
		require.NotNil(t, c)
		st := c.GetStatusModel().Status // recorded before UpdateController returns
		assert.Equal(t, int64(1), st.FailureCount)
		assert.Equal(t, int64(1), st.ConsecutiveFailureCount)
		assert.Equal(t, "invalid controller parameters: RunInterval must not be negative, got -1s", st.LastFailureMsg)
		assert.ErrorIs(t, c.GetLastError(), ErrInvalidParams)
		synctest.Wait() // the log and the HealthReporter come from the controller's goroutine
		assert.Equal(t, []string{"invalid controller parameters; DoFunc will not run until an update brings valid ones"}, e.logs(logrus.ErrorLevel))
		assert.Equal(t, []string{"degraded c: invalid controller parameters: RunInterval must not be negative, got -1s"}, h.all())
		assert.Equal(t, 1.0, testutil.ToFloat64(e.metrics.failing))
		assert.Equal(t, 1.0, testutil.ToFloat64(e.metrics.active))
		assert.ErrorContains(t, e.m.Health(), `controller "c": 1 consecutive failures: invalid controller parameters`)

		time.Sleep(time.Hour)
		assert.True(t, e.m.TriggerController("c"))
		synctest.Wait()
		assert.Zero(t, r.count(), "no run, no retry, no busy loop")
		assert.Equal(t, 0.0, e.metrics.runsTotal(runSuccess)+e.metrics.runsTotal(runFailure), "no run counted")

		e.m.UpdateController("c", ControllerParams{DoFunc: r.do, Health: h})
		synctest.Wait()
		assert.Equal(t, 1, r.count())
		assert.Equal(t, 0, c.GetConsecutiveFailureCount())
		assert.Equal(t, 0.0, testutil.ToFloat64(e.metrics.failing))
		assert.NoError(t, e.m.Health())

		e.m.UpdateController("c", ControllerParams{})
		time.Sleep(time.Hour)
		assert.Equal(t, 1, r.count(), "an invalid update parks it again")
		assert.Equal(t, 2, c.GetFailureCount())
		e.m.RemoveAllAndWait()
		assert.Equal(t, 0.0, testutil.ToFloat64(e.metrics.failing))
		assert.Equal(t, 0.0, testutil.ToFloat64(e.metrics.active))
	})
}

func TestEmptyNameIsRejected(t *testing.T) {
	e := newEnv(t)
	assert.Nil(t, e.m.UpdateController("", ControllerParams{DoFunc: NoopFunc}))
	assert.False(t, e.m.CreateController("", ControllerParams{DoFunc: NoopFunc}))
	assert.Empty(t, e.m.GetStatusModel())
	assert.Equal(t, []string{"refusing to install a controller without a name", "refusing to install a controller without a name"}, e.logs(logrus.ErrorLevel))
	assert.Equal(t, 0.0, testutil.ToFloat64(e.metrics.active))
}

func TestUnknownNames(t *testing.T) {
	e := newEnv(t)
	err := e.m.RemoveController("ghost")
	assert.ErrorIs(t, err, ErrControllerNotFound)
	assert.EqualError(t, err, `controller not found: "ghost"`)
	err = e.m.RemoveControllerAndWait("ghost")
	assert.ErrorIs(t, err, ErrControllerNotFound)
	assert.ErrorContains(t, err, "ghost")
	assert.False(t, e.m.TriggerController("ghost"))
	assert.Nil(t, e.m.Lookup("ghost"))
	select {
	case <-e.m.TerminationChannel("ghost"):
	default:
		t.Fatal("TerminationChannel of an unknown name is not closed")
	}
}

func TestCreateControllerDoesNotReplace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		r1, r2 := newRecorder(), newRecorder()
		assert.True(t, e.m.CreateController("c", ControllerParams{DoFunc: r1.do}))
		assert.False(t, e.m.CreateController("c", ControllerParams{DoFunc: r2.do}))
		synctest.Wait()
		assert.Equal(t, 1, r1.count())
		assert.Equal(t, 0, r2.count(), "neither updated nor triggered")
		e.m.RemoveAllAndWait()
	})
}

// A removed name can be installed again at once; the new controller may run
// while the old StopFunc still runs.
func TestReinstallWhileOldStopFuncRuns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		release := make(chan struct{})
		old := e.m.UpdateController("c", ControllerParams{DoFunc: NoopFunc, StopFunc: func(context.Context) error {
			<-release
			return nil
		}})
		synctest.Wait()
		oldTerm := e.m.TerminationChannel("c")
		require.NoError(t, e.m.RemoveController("c"))
		r := newRecorder()
		c := e.m.UpdateController("c", ControllerParams{DoFunc: r.do})
		synctest.Wait()
		assert.Equal(t, 1, r.count(), "the new controller runs while the old one stops")
		assert.NotEqual(t, old.UUID(), c.UUID())
		assert.Equal(t, 2.0, testutil.ToFloat64(e.metrics.active), "a stopping controller is still active")
		select {
		case <-oldTerm:
			t.Fatal("old controller terminated before its StopFunc returned")
		default:
		}
		close(release)
		<-oldTerm
		assert.Equal(t, 1.0, testutil.ToFloat64(e.metrics.active))
		e.m.RemoveAllAndWait()
	})
}

// RemoveAllAndWait and Shutdown also wait for controllers removed earlier
// and still stopping.
func TestWaitsIncludeEarlierRemovals(t *testing.T) {
	for _, name := range []string{"RemoveAllAndWait", "Shutdown"} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newEnv(t)
				stopped := false
				e.m.UpdateController("a", ControllerParams{DoFunc: NoopFunc, StopFunc: func(context.Context) error {
					time.Sleep(time.Minute)
					stopped = true
					return nil
				}})
				synctest.Wait()
				require.NoError(t, e.m.RemoveController("a"))
				start := time.Now()
				if name == "Shutdown" {
					require.NoError(t, e.m.Shutdown(context.Background()))
				} else {
					e.m.RemoveAllAndWait()
				}
				assert.True(t, stopped)
				assert.Equal(t, time.Minute, time.Since(start))
			})
		})
	}
}

// Shutdown bounds the wait: at its deadline it cancels the StopFunc contexts
// and returns an error wrapping ctx.Err() that names what still runs; the
// Manager stays usable.
func TestShutdownDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		stuck := make(chan struct{})
		var stopErr error
		// "stubborn" ignores its context until released; "slow" has a
		// StopFunc that waits for its context.
		e.m.UpdateController("stubborn", ControllerParams{DoFunc: func(context.Context) error { <-stuck; return nil }})
		e.m.UpdateController("slow", ControllerParams{DoFunc: NoopFunc, StopFunc: func(ctx context.Context) error {
			<-ctx.Done()
			stopErr = ctx.Err()
			return nil
		}})
		e.m.UpdateController("quick", ControllerParams{DoFunc: NoopFunc})
		synctest.Wait()

		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		start := time.Now()
		err := e.m.Shutdown(ctx)
		assert.Equal(t, 5*time.Second, time.Since(start))
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.EqualError(t, err, "controller: shutdown: context deadline exceeded; still running: slow, stubborn")
		synctest.Wait()
		assert.ErrorIs(t, stopErr, context.Canceled, "the StopFunc context was cancelled at the deadline")
		assert.Empty(t, e.m.GetStatusModel())

		r := newRecorder()
		e.m.UpdateController("again", ControllerParams{DoFunc: r.do})
		synctest.Wait()
		assert.Equal(t, 1, r.count(), "the Manager stays usable")
		close(stuck)
		require.NoError(t, e.m.Shutdown(context.Background()))
		assert.Equal(t, 0.0, testutil.ToFloat64(e.metrics.active))
	})
}

// A DoFunc that ignores its context: removal returns at once and nothing
// else blocks.
func TestRemoveDoesNotWaitForAStuckDoFunc(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		stuck := make(chan struct{})
		e.m.UpdateController("stuck", ControllerParams{DoFunc: func(context.Context) error { <-stuck; return nil }})
		synctest.Wait()
		require.NoError(t, e.m.RemoveController("stuck"))
		e.m.UpdateController("other", ControllerParams{DoFunc: NoopFunc})
		assert.Len(t, e.m.GetStatusModel(), 1)
		assert.NoError(t, e.m.Health())
		close(stuck)
		e.m.RemoveAllAndWait()
	})
}

// The zero Manager works, with DefaultMetrics and the standard logger.
func TestZeroManager(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var m Manager
		before := testutil.ToFloat64(DefaultMetrics.active)
		r := newRecorder()
		m.UpdateController("zero", ControllerParams{DoFunc: r.do})
		synctest.Wait()
		assert.Equal(t, 1, r.count())
		assert.Equal(t, before+1, testutil.ToFloat64(DefaultMetrics.active))
		m.RemoveAllAndWait()
		assert.Equal(t, before, testutil.ToFloat64(DefaultMetrics.active))
	})
}

func TestStatusJSON(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		r := newRecorder(errBoom, nil)
		r.took = 1500 * time.Millisecond
		c := e.m.UpdateController("sync", ControllerParams{DoFunc: r.do, RunInterval: time.Minute, Group: NewGroup("g")})
		time.Sleep(3 * time.Second) // fails at 0-1.5s, succeeds at 2.5-4s
		b, err := json.Marshal(e.m.GetStatusModel())
		require.NoError(t, err)
		want := `[{"name":"sync","uuid":"` + c.UUID() + `",` +
			`"configuration":{"error-retry":true,"error-retry-base":"1s","interval":"1m0s","group":"g"},` +
			`"status":{"success-count":0,"failure-count":1,"consecutive-failure-count":1,` +
			`"last-failure-msg":"boom","last-failure-timestamp":"2000-01-01T00:00:01.5Z","last-run-duration":"1.5s"}}]`
		assert.JSONEq(t, want, string(b))

		time.Sleep(2 * time.Second)
		st := c.GetStatusModel()
		b, err = json.Marshal(st)
		require.NoError(t, err)
		var back ControllerStatus
		require.NoError(t, json.Unmarshal(b, &back))
		assert.Equal(t, st, &back, "JSON round-trips losslessly")
		assert.Contains(t, string(b), `"last-success-timestamp":"2000-01-01T00:00:04Z"`)
		e.m.RemoveAllAndWait()
	})
}

func TestStatusJSONFieldsOfCiliumAndExtras(t *testing.T) {
	st := &ControllerStatus{Name: "n", UUID: "u",
		Configuration: &ControllerStatusConfiguration{ErrorRetry: false, ErrorRetryBase: Duration(time.Second), Interval: 0,
			MaxRetryInterval: Duration(time.Minute), MaxRetries: 5, Jitter: Duration(time.Second)},
		Status: &ControllerStatusStatus{}}
	b, err := json.Marshal(st)
	require.NoError(t, err)
	assert.JSONEq(t, `{"name":"n","uuid":"u","configuration":{"error-retry":false,"error-retry-base":"1s","interval":"0s",
		"max-retry-interval":"1m0s","max-retries":5,"jitter":"1s"},
		"status":{"success-count":0,"failure-count":0,"consecutive-failure-count":0,"last-failure-msg":""}}`, string(b))

	var d Duration
	require.NoError(t, json.Unmarshal([]byte(`1500000000`), &d), "nanoseconds are accepted")
	assert.Equal(t, Duration(1500*time.Millisecond), d)
	assert.ErrorContains(t, json.Unmarshal([]byte(`"soon"`), &d), "controller.Duration")
	assert.ErrorContains(t, json.Unmarshal([]byte(`true`), &d), "want a duration string or nanoseconds")
	var sts ControllerStatuses
	assert.Error(t, json.Unmarshal([]byte(`[{"name":`), &sts))
}

func TestFormatStatus(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		e.m.UpdateController("zeta-ok", ControllerParams{DoFunc: NoopFunc})
		e.m.UpdateController("alpha-failing", ControllerParams{DoFunc: func(context.Context) error {
			return errors.New("connection refused")
		}})
		e.m.UpdateController("mid-done", ControllerParams{DoFunc: func(context.Context) error {
			return NewExitReason("annotation applied")
		}})
		time.Sleep(65 * time.Second)

		var all bytes.Buffer
		require.NoError(t, FormatStatus(&all, e.m.GetStatusModel(), true))
		assert.Equal(t, strings.Join([]string{
			"Controller Status: 2/3 healthy",
			"Name            Last success   Last error   Count   Message",
			"alpha-failing   never          10s ago      11      connection refused",
			"mid-done        1m5s ago       never        0       annotation applied",
			"zeta-ok         1m5s ago       never        0       no error",
			""}, "\n"), all.String())

		var failing bytes.Buffer
		require.NoError(t, FormatStatus(&failing, e.m.GetStatusModel(), false))
		assert.Equal(t, strings.Join([]string{
			"Controller Status: 2/3 healthy",
			"Name            Last success   Last error   Count   Message",
			"alpha-failing   never          10s ago      11      connection refused",
			""}, "\n"), failing.String())
		e.m.RemoveAllAndWait()

		var none bytes.Buffer
		require.NoError(t, FormatStatus(&none, ControllerStatuses{{Name: "bare"}, nil}, false))
		assert.Equal(t, "Controller Status: 1/1 healthy\n", none.String())
		require.NoError(t, FormatStatus(&none, ControllerStatuses{{Name: "bare"}}, true), "nil parts read as zero")
		assert.Contains(t, none.String(), "bare   never          never        0       no error")
		assert.Error(t, FormatStatus(failingWriter{}, nil, true))
	})
}

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

// Health names each failing controller, sorted, and wraps its last error;
// it agrees with controllers_failing and FormatStatus.
func TestHealthAgreesWithMetricsAndFormatStatus(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		refused := errors.New("connection refused")
		e.m.UpdateController("b", ControllerParams{DoFunc: func(context.Context) error { return refused }})
		e.m.UpdateController("a", ControllerParams{DoFunc: func(context.Context) error { return errBoom }})
		e.m.UpdateController("ok", ControllerParams{DoFunc: NoopFunc})
		time.Sleep(3*time.Second + time.Millisecond)
		err := e.m.Health()
		assert.EqualError(t, err, "controller \"a\": 3 consecutive failures: boom\ncontroller \"b\": 3 consecutive failures: connection refused")
		assert.ErrorIs(t, err, refused)
		assert.Equal(t, 2.0, testutil.ToFloat64(e.metrics.failing))
		var buf bytes.Buffer
		require.NoError(t, FormatStatus(&buf, e.m.GetStatusModel(), false))
		assert.True(t, strings.HasPrefix(buf.String(), "Controller Status: 1/3 healthy\n"))

		require.NoError(t, e.m.RemoveControllerAndWait("a"))
		assert.Equal(t, 1.0, testutil.ToFloat64(e.metrics.failing), "a removed controller leaves the gauge")
		assert.EqualError(t, e.m.Health(), "controller \"b\": 3 consecutive failures: connection refused")
		e.m.RemoveAllAndWait()
		assert.NoError(t, e.m.Health())
	})
}

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
# HELP cilium_controllers_panics_total Number of panics recovered from controllers' DoFunc and StopFunc, by group.
# TYPE cilium_controllers_panics_total counter
cilium_controllers_panics_total{cluster="c1",group_name=""} 1
cilium_controllers_panics_total{cluster="c1",group_name="sync"} 0
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
`
		assert.NoError(t, testutil.GatherAndCompare(e.reg, strings.NewReader(want)))
		e.m.RemoveAllAndWait()
		assert.Equal(t, 0.0, testutil.ToFloat64(e.metrics.active))
		assert.Equal(t, 0.0, testutil.ToFloat64(e.metrics.failing))
	})
}

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

func TestGetGlobalStatus(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m1, m2 := NewManager(WithMetrics(nil)), NewManager(WithMetrics(nil))
		a2 := m2.UpdateController("global-a", ControllerParams{DoFunc: NoopFunc})
		a1 := m1.UpdateController("global-a", ControllerParams{DoFunc: NoopFunc})
		m1.UpdateController("global-b", ControllerParams{DoFunc: NoopFunc})
		fake := FakeManager(1)
		var names []string
		for _, s := range GetGlobalStatus() {
			if strings.HasPrefix(s.Name, "global-") || strings.HasPrefix(s.Name, "controller-") {
				names = append(names, s.Name+"/"+s.UUID)
			}
		}
		first, second := a1.UUID(), a2.UUID()
		if second < first {
			first, second = second, first
		}
		assert.Equal(t, []string{"global-a/" + first, "global-a/" + second, "global-b/" + m1.Lookup("global-b").UUID()}, names)
		m1.RemoveAllAndWait()
		m2.RemoveAllAndWait()
		fake.RemoveAllAndWait()
		for _, s := range GetGlobalStatus() {
			assert.False(t, strings.HasPrefix(s.Name, "global-"))
		}
		registry.mu.Lock()
		_, held := registry.managers[m1]
		registry.mu.Unlock()
		assert.False(t, held, "an emptied Manager leaves the registry")
	})
}

func TestFakeManager(t *testing.T) {
	m := FakeManager(2)
	sts := m.GetStatusModel()
	require.Len(t, sts, 2)
	assert.Equal(t, "controller-0", sts[0].Name)
	assert.Equal(t, "00000000-0000-4000-8000-000000000001", sts[1].UUID)
	assert.Equal(t, "controller failed", sts[0].Status.LastFailureMsg)
	assert.Equal(t, int64(1), sts[1].Status.ConsecutiveFailureCount)
	assert.ErrorContains(t, m.Health(), `controller "controller-1": 1 consecutive failures: controller failed`)
	assert.True(t, m.TriggerController("controller-0"))
	term := m.TerminationChannel("controller-0")
	require.NoError(t, m.RemoveController("controller-0"))
	select {
	case <-term:
	default:
		t.Fatal("removal did not close the termination channel")
	}
	m.RemoveAllAndWait()
	assert.Empty(t, m.GetStatusModel())
}

func TestStatusModelIsSortedByName(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		for _, n := range []string{"m", "b", "z", "a"} {
			e.m.UpdateController(n, ControllerParams{DoFunc: NoopFunc})
		}
		var names []string
		for _, s := range e.m.GetStatusModel() {
			names = append(names, s.Name)
		}
		assert.Equal(t, []string{"a", "b", "m", "z"}, names)
		e.m.RemoveAll()
		e.m.RemoveAllAndWait()
	})
}

// A Manager does not keep terminated controllers reachable, however often
// it removes them without waiting for them.
func TestRemovedControllersAreReleased(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		for range 50 {
			for i := range 10 {
				e.m.UpdateController(fmt.Sprintf("c%d", i), ControllerParams{DoFunc: NoopFunc})
			}
			synctest.Wait()
			e.m.RemoveAll()
			synctest.Wait()
		}
		e.m.mu.Lock()
		held := len(e.m.stopping)
		e.m.mu.Unlock()
		assert.LessOrEqual(t, held, 10, "terminated controllers still referenced")
		e.m.RemoveAllAndWait()
		assert.Nil(t, e.m.stopping)
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
