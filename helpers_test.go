package controller

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"
)

// env is a Manager with its own logger hook and metrics, for one test.
type env struct {
	m       *Manager
	hook    *test.Hook
	logger  *logrus.Logger
	metrics *Metrics
	reg     *prometheus.Registry
}

func newEnv(t *testing.T, opts ...MetricsOpts) *env {
	t.Helper()
	logger, hook := test.NewNullLogger()
	var o MetricsOpts
	if len(opts) > 0 {
		o = opts[0]
	}
	met := NewMetrics(o)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(met)
	return &env{
		m:       NewManager(WithLogger(logger), WithMetrics(met)),
		hook:    hook,
		logger:  logger,
		metrics: met,
		reg:     reg,
	}
}

// logs returns the messages logged at level.
func (e *env) logs(level logrus.Level) []string {
	var out []string
	for _, en := range e.hook.AllEntries() {
		if en.Level == level {
			out = append(out, en.Message)
		}
	}
	return out
}

// recorder is a DoFunc that records when it ran (relative to the moment the
// recorder was made) and returns scripted results.
type recorder struct {
	mu      sync.Mutex
	start   time.Time
	runs    []time.Duration
	ctxs    []context.Context
	results []error // run i returns results[min(i, len-1)]; none: nil
	took    time.Duration
}

func newRecorder(results ...error) *recorder {
	return &recorder{start: time.Now(), results: results}
}

func (r *recorder) do(ctx context.Context) error {
	r.mu.Lock()
	i := len(r.runs)
	r.runs = append(r.runs, time.Since(r.start))
	r.ctxs = append(r.ctxs, ctx)
	took := r.took
	var err error
	if len(r.results) > 0 {
		err = r.results[min(i, len(r.results)-1)]
	}
	r.mu.Unlock()
	if took > 0 {
		time.Sleep(took)
	}
	return err
}

func (r *recorder) times() []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]time.Duration(nil), r.runs...)
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.runs)
}

func secs(ss ...float64) []time.Duration {
	out := make([]time.Duration, len(ss))
	for i, s := range ss {
		out[i] = time.Duration(s * float64(time.Second))
	}
	return out
}

var errBoom = errors.New("boom")

// healthLog is a HealthReporter that records what it was told.
type healthLog struct {
	mu     sync.Mutex
	events []string
}

func (h *healthLog) OK(name string) { h.add("ok " + name) }
func (h *healthLog) Degraded(name string, err error) {
	h.add("degraded " + name + ": " + err.Error())
}
func (h *healthLog) add(s string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.events = append(h.events, s)
}
func (h *healthLog) all() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.events...)
}

// quietLogger is a logger that discards everything.
func quietLogger() *logrus.Logger {
	l, _ := test.NewNullLogger()
	return l
}

// runsTotal returns controllers_runs_total for one status.
func (m *Metrics) runsTotal(status int) float64 {
	_, count, _ := m.runs[status].snapshot(m.upper)
	return float64(count + m.runs[status].noDurRun.Load())
}
