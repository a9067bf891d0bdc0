// Helpers shared by the tests: a Manager with its own logger and metrics,
// recording DoFuncs and HealthReporters, and the measurements the
// performance tests take.

package controller

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"
	"github.com/stretchr/testify/require"
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

// sinks are the log sinks the log tests run against, each test once per
// sink: what holds for logrus must hold for log/slog.
var sinks = []string{"logrus", "slog"}

// forEachSink runs test once per sink, as a subtest named after it.
func forEachSink(t *testing.T, test func(t *testing.T, sink string)) {
	for _, sink := range sinks {
		t.Run(sink, func(t *testing.T) { test(t, sink) })
	}
}

// newEnvOn is newEnv with the Manager logging to sink. With "slog" it logs
// to a slog.Logger whose handler (recordHandler) files every record in
// e.hook as a logrus entry with the same level, message and fields, so a
// test reads both sinks alike; e.logger's level is the level of both.
func newEnvOn(t *testing.T, sink string, opts ...MetricsOpts) *env {
	t.Helper()
	e := newEnv(t, opts...)
	if sink == "slog" {
		// Only the handler feeds the hook now: a line that went to
		// logrus instead would be missing from it.
		e.logger.ReplaceHooks(make(logrus.LevelHooks))
		WithSlog(slog.New(&recordHandler{hook: e.hook, levels: e.logger}))(e.m)
	}
	return e
}

// controllerKeys returns the keys under which an entry of a newEnvOn's
// hook names its controller on sink: Cilium's name and uuid on logrus; on
// slog the group controller, which recordHandler files as controller.name
// and controller.uuid.
func controllerKeys(sink string) (name, uuid string) {
	if sink == "slog" {
		return "controller.name", "controller.uuid"
	}
	return "name", "uuid"
}

// recordHandler is a slog.Handler that files each record in a logrus test
// hook: level, message, context, and every attribute (those added by
// WithAttrs included, group names as key prefixes: controller.name) as a
// field holding the attribute's value. Enabled follows the level of
// levels.
type recordHandler struct {
	hook   *test.Hook
	levels *logrus.Logger
	attrs  []slog.Attr
	prefix string // the groups opened by WithGroup, each followed by "."
}

var slogToLogrus = map[slog.Level]logrus.Level{
	slog.LevelDebug: logrus.DebugLevel,
	slog.LevelInfo:  logrus.InfoLevel,
	slog.LevelWarn:  logrus.WarnLevel,
	slog.LevelError: logrus.ErrorLevel,
}

func (h *recordHandler) Enabled(_ context.Context, level slog.Level) bool {
	return h.levels.IsLevelEnabled(slogToLogrus[level])
}

func (h *recordHandler) Handle(ctx context.Context, r slog.Record) error {
	data := logrus.Fields{}
	for _, a := range h.attrs {
		data[a.Key] = a.Value.Any()
	}
	r.Attrs(func(a slog.Attr) bool {
		flattenAttr(data, h.prefix, a)
		return true
	})
	return h.hook.Fire(&logrus.Entry{Level: slogToLogrus[r.Level], Message: r.Message, Data: data, Time: r.Time, Context: ctx})
}

func (h *recordHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	c := *h
	c.attrs = slices.Clone(h.attrs)
	data := logrus.Fields{}
	for _, a := range attrs {
		flattenAttr(data, h.prefix, a)
	}
	for k, v := range data {
		c.attrs = append(c.attrs, slog.Any(k, v))
	}
	return &c
}

// flattenAttr files a in data under prefix+its key, and the attributes of
// a group under the group's key and a dot, as a text handler writes them.
func flattenAttr(data logrus.Fields, prefix string, a slog.Attr) {
	if a.Value.Kind() == slog.KindGroup {
		for _, ga := range a.Value.Group() {
			flattenAttr(data, prefix+a.Key+".", ga)
		}
		return
	}
	data[prefix+a.Key] = a.Value.Any()
}

func (h *recordHandler) WithGroup(name string) slog.Handler {
	c := *h
	c.prefix += name + "."
	return &c
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

// blocker is a DoFunc that blocks until its context ends or it is released,
// and records how each call ended.
type blocker struct {
	mu        sync.Mutex
	started   int
	cancelled int
	release   chan struct{}
	params    []int // the "version" of the parameters of each call
}

func newBlocker() *blocker { return &blocker{release: make(chan struct{})} }

func (b *blocker) fn(version int) ControllerFunc {
	return func(ctx context.Context) error {
		b.mu.Lock()
		b.started++
		b.params = append(b.params, version)
		b.mu.Unlock()
		select {
		case <-ctx.Done():
			b.mu.Lock()
			b.cancelled++
			b.mu.Unlock()
			return ctx.Err()
		case <-b.release:
			return nil
		}
	}
}

func (b *blocker) counts() (started, cancelled int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.started, b.cancelled
}

// nopHealth is a HealthReporter that does nothing, for measuring the cost
// of calling one.
type nopHealth struct{}

func (nopHealth) OK(string)              {}
func (nopHealth) Degraded(string, error) {}

// benchManager is a Manager set up as a user's agent would set it up:
// metrics on (a Metrics registered in a registry) and logrus at Info,
// writing nowhere.
func benchManager(b testing.TB) *Manager {
	b.Helper()
	logger, _ := test.NewNullLogger()
	logger.SetLevel(logrus.InfoLevel)
	met := NewMetrics(MetricsOpts{})
	reg := prometheus.NewRegistry()
	reg.MustRegister(met)
	return NewManager(WithLogger(logger), WithMetrics(met))
}

// names returns n distinct controller names.
func names(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = "controller-" + strconv.Itoa(i)
	}
	return out
}

// installAll installs a controller under each name, all sharing one DoFunc
// (its closure is not the library's cost), and returns once every first
// run is done.
func installAll(m *Manager, names []string) {
	cd := newCountdown(len(names))
	do := ControllerFunc(cd.do)
	for _, name := range names {
		m.UpdateController(name, ControllerParams{DoFunc: do})
	}
	<-cd.done
}

// countdown is a DoFunc that closes done on its n-th call, counting all
// controllers sharing it.
type countdown struct {
	left atomic.Int64
	done chan struct{}
}

func newCountdown(n int) *countdown {
	c := &countdown{done: make(chan struct{})}
	c.left.Store(int64(n))
	return c
}

func (c *countdown) do(context.Context) error {
	if c.left.Add(-1) == 0 {
		close(c.done)
	}
	return nil
}

func (c *countdown) fail(context.Context) error {
	if c.left.Add(-1) == 0 {
		close(c.done)
	}
	return errBoom
}

// mallocs returns the number of heap objects the process has allocated.
func mallocs() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.Mallocs
}

// heapAndStack returns the bytes of live heap objects and of goroutine
// stacks, after a full collection.
func heapAndStack() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc + ms.StackInuse
}

// captureStderr points os.Stderr at a file until the test ends and returns
// a function that reads what was written to it.
func captureStderr(t *testing.T) func() string {
	f, err := os.CreateTemp(t.TempDir(), "stderr")
	require.NoError(t, err)
	saved := os.Stderr
	os.Stderr = f
	t.Cleanup(func() { os.Stderr = saved; f.Close() })
	return func() string {
		b, err := os.ReadFile(f.Name())
		require.NoError(t, err)
		return string(b)
	}
}

// runInChild runs the test named name again in a child process with
// BGCTL_HOSTILE_CHILD=1, and env, and fails if the child did not pass: the
// point of such a test is that the process survives, or that it holds
// under a setting the parent does not run with (a GODEBUG).
func runInChild(t *testing.T, name string, env ...string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+name+"$", "-test.count=1", "-test.v")
	cmd.Env = append(append(os.Environ(), "BGCTL_HOSTILE_CHILD=1"), env...)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "the child process did not survive:\n%s", out)
	require.Contains(t, string(out), "--- PASS: "+name, "%s", out)
}

// isClosed reports whether ch is closed, without blocking; a nil channel
// is not.
func isClosed(ch <-chan struct{}) bool {
	if ch == nil {
		return false
	}
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// terminationOf returns the channel closed when c has terminated, whether
// or not c is still installed (TerminationChannel only knows installed
// names).
func terminationOf(c *Controller) <-chan struct{} { return c.terminationChannel() }
