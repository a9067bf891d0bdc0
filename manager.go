// manager.go: the Manager, which installs, updates, triggers and removes
// controllers by name.

package controller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"
)

// Manager owns a set of named controllers. An owner, such as a network
// endpoint, embeds a Manager by value, installs its controllers with
// [Manager.UpdateController], and removes them all with
// [Manager.RemoveAllAndWait] or [Manager.Shutdown] when it dies.
//
// The zero value is ready to use: it logs to logrus' standard logger and
// records into [DefaultMetrics]. [NewManager] takes options to change
// either. A Manager must not be copied after first use. Every method is safe
// for concurrent use.
type Manager struct {
	// The fields are grouped by how they are guarded, as Controller's
	// are.

	// Immutable after construction: fake is set by FakeManager; the
	// options are set by NewManager or by an Option applied before first
	// use, and only read after.
	fake       bool
	logrusLog  *logrus.Entry // WithLogger; nil: the default
	slogLog    *slog.Logger  // WithSlog; nil: logrus
	metrics    *Metrics
	metricsSet bool          // metrics came from WithMetrics, nil included
	jitter     *jitterSource // WithJitterSource; nil: math/rand/v2's global source (jitterSource has a lock of its own)
	stuckAfter time.Duration // WithStuckAfter; 0 (the default): off
	slowStop   time.Duration // WithSlowStopWarning; 0: the default, defaultSlowStop; < 0: off
	// middleware is what WithRunMiddleware gave, outermost first; nil:
	// none.
	middleware []RunMiddleware
	// debounce is WithTriggerDebounce's window; 0 (the default): off.
	debounce time.Duration

	// Atomic: stoppingN counts the controllers removed and not yet
	// terminated. Incremented under mu by a removal; decremented without
	// it by each terminating goroutine (release), and the one that brings
	// it to 0 then takes mu.
	stoppingN atomic.Int64

	// mu guards every field below. Exception: sink is written once, under
	// mu, by the first newController (sinkSet then true), and read
	// without mu by the controllers' goroutines, which start after it
	// (the go statement orders the two).
	mu          sync.Mutex
	controllers map[string]*Controller // installed, by name
	sorted      []*Controller          // controllers sorted by name; nil: to be rebuilt
	sortedUUIDs string                 // their UUIDs, 36 bytes each, built with sorted
	registered  bool                   // in the global registry (has controllers, not fake)
	closed      bool                   // Shutdown was called: installs are refused
	// stopping lists the removed controllers with their removal times,
	// terminated ones included until pruned. cohort is the open stop
	// cohort, which each removal joins. watch warns of those that stop
	// too slowly (stopping.go): made on the first removal, armed while
	// watchArmed.
	stopping []stoppingController
	// stoppingByName indexes stopping for TerminationChannel, which a
	// mass removal calls per name: the controller last removed under each
	// name, while stopping holds it. shadowed maps a removed controller to
	// the one removed before it under the same name, if that one was still
	// stopping then (rare: a name removed, installed and removed again
	// before its first controller stopped). Both are kept by
	// indexStoppingLocked and pruneStoppingLocked (stopping.go).
	stoppingByName map[string]*Controller
	shadowed       map[*Controller]*Controller
	cohort         *stopCohort
	watch          *time.Timer
	watchArmed     bool
	sink           logSink // where the controllers log, resolved from the options
	sinkSet        bool
}

// Option configures a Manager made by [NewManager]. An Option may also be
// applied to a Manager embedded by value, before its first use:
//
//	type Endpoint struct {
//		controller.Manager
//	}
//
//	ep := &Endpoint{}
//	controller.WithLogger(logger)(&ep.Manager)
//	controller.WithMetrics(metrics)(&ep.Manager)
type Option func(*Manager)

// NewManager returns a Manager configured by opts. Without options it is the
// same as the zero Manager.
func NewManager(opts ...Option) *Manager {
	m := &Manager{}
	for _, o := range opts {
		o(m)
	}
	return m
}

// WithLogger makes the Manager log to l, with the field subsys=controller
// added; each controller adds its name and UUID under Cilium's keys, name
// and uuid, so queries written for Cilium's logs keep matching (they
// replace fields of l's under the same keys: [WithSlog] keeps both). An
// entry about a run has the run's context as its Context, for hooks that
// read values such as a trace ID from it. Default (and for a nil l):
// logrus.StandardLogger(). It replaces a logger set by [WithSlog].
func WithLogger(l logrus.FieldLogger) Option {
	return func(m *Manager) {
		if l != nil {
			m.logrusLog, m.slogLog = l.WithField("subsys", "controller"), nil
		}
	}
}

// WithSlog makes the Manager log to l, a log/slog logger, instead of
// logrus: the same lines at the same levels, with the same attributes
// (subsys=controller; each controller adds a group controller holding its
// name and uuid, so that a logger made with With("name", …) keeps its own;
// then error, duration, outcome, stack and panic where they apply). A nil l
// changes nothing. It replaces a logger set by [WithLogger].
//
// The handler gets the run's context with every line about a run (the
// parameters' Context, or the StopFunc's, for the others), so values such
// as a trace ID reach it. With AddSource, a line logged inside a call of
// the program (an install refused after Shutdown) names that call; the
// lines of a controller's goroutine name no source, since no line of the
// program logged them: their controller group says which controller it
// was.
func WithSlog(l *slog.Logger) Option {
	return func(m *Manager) {
		if l != nil {
			m.slogLog, m.logrusLog = l.With("subsys", "controller"), nil
		}
	}
}

// WithMetrics makes the Manager record into met, which the caller registers.
// Default: [DefaultMetrics]. WithMetrics(nil) turns metrics off.
func WithMetrics(met *Metrics) Option {
	return func(m *Manager) { m.metrics, m.metricsSet = met, true }
}

// WithJitterSource makes the Manager draw the random part of its
// controllers' waits (Jitter) from src instead of math/rand/v2's global
// source, so that a test, in a testing/synctest bubble, sees the same
// waits on every run:
//
//	m := controller.NewManager(controller.WithJitterSource(rand.NewPCG(1, 2)))
//
// The Manager draws from src under a lock of its own, one draw per
// jittered wait, so src need not be safe for concurrent use; do not draw
// from it elsewhere while the Manager may. The draws of one controller
// come in the order of its waits; with several jittered controllers, the
// order in which they draw follows the order in which their runs end. A
// nil src changes nothing.
func WithJitterSource(src rand.Source) Option {
	return func(m *Manager) {
		if src != nil {
			m.jitter = &jitterSource{r: rand.New(src)}
		}
	}
}

// WithStuckAfter makes [Manager.Health] report a controller without a
// RunTimeout whose DoFunc has run longer than d; a controller with a
// RunTimeout is reported once its run outlasts that instead. Default (and
// for d ≤ 0): off, only controllers with a RunTimeout are reported stuck.
func WithStuckAfter(d time.Duration) Option {
	return func(m *Manager) { m.stuckAfter = max(d, 0) }
}

// jitterSource serialises the draws from a caller's source.
type jitterSource struct {
	mu sync.Mutex
	r  *rand.Rand // guarded by mu
}

// jitterN returns a random duration in [0, n), n > 0.
func (m *Manager) jitterN(n time.Duration) time.Duration {
	j := m.jitter
	if j == nil {
		return rand.N(n)
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	return time.Duration(j.r.Int64N(int64(n)))
}

// newSink returns the sink the options ask for.
func (m *Manager) newSink() logSink {
	switch {
	case m.slogLog != nil:
		return logSink{slog: m.slogLog}
	case m.logrusLog != nil:
		return logSink{entry: m.logrusLog}
	}
	return defaultSink
}

func (m *Manager) metricsOrDefault() *Metrics {
	if m.metricsSet {
		return m.metrics
	}
	return DefaultMetrics
}

// ErrManagerShutDown is the error logged when an install is refused
// because [Manager.Shutdown] was called, and the cause ([context.Cause]) of
// the run contexts Shutdown cancels, and of the StopFunc contexts its
// deadline cancels; check for it with errors.Is.
var ErrManagerShutDown = errors.New("manager was shut down")

// ErrControllerNotFound is wrapped by the error of a removal of a name that
// has no controller; check for it with errors.Is.
var ErrControllerNotFound = errors.New("controller not found")

// UpdateController installs a controller named name with params, or, when
// one is installed under that name already, updates it: the controller
// keeps its UUID and statistics, runs DoFunc at once with the new
// parameters, and restarts its retry backoff. It returns the controller.
//
// Invalid parameters (see [ControllerParams.Validate]) are installed all the
// same, so the mistake is visible: the controller records one failure whose
// message is the validation error, it is logged at Error, params.Health is
// told, and DoFunc is not called until an update brings valid parameters.
//
// An empty name installs nothing: it is logged at Error and
// UpdateController returns nil. Neither does a Manager that
// [Manager.Shutdown] was called on: the refusal is logged at Warn, naming
// the controller, and UpdateController returns nil.
func (m *Manager) UpdateController(name string, params ControllerParams) *Controller {
	c, _ := m.install(name, params, true)
	return c
}

// CreateController installs a controller named name with params, as
// [Manager.UpdateController] does, unless one is installed under that name
// already: then it changes nothing and returns false. It returns true when
// it installed a controller; false, too, when the Manager was shut down.
func (m *Manager) CreateController(name string, params ControllerParams) bool {
	_, created := m.install(name, params, false)
	return created
}

func (m *Manager) install(name string, params ControllerParams, update bool) (*Controller, bool) {
	if name == "" {
		sink := m.newSink()
		sink.write("", &logLine{level: levelError, msg: "refusing to install a controller without a name", err: errors.New("empty controller name"), pc: callerPC()})
		return nil, false
	}
	verr := params.Validate()
	group := m.metricsOrDefault().group(params.Group.Name)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		// Logged under m.mu, so that a Shutdown's installs are refused in
		// the order they came; a refused install is rare.
		sink := m.newSink()
		sink.write(name, &logLine{level: levelWarn, msg: fmt.Sprintf("refusing to install controller %q: the Manager was shut down", name), err: ErrManagerShutDown, pc: callerPC()})
		return nil, false
	}
	c, exists := m.controllers[name]
	switch {
	case exists && !update:
		return c, false
	case exists:
		c.update(params, verr, group)
		return c, false
	}
	c = newController(m, name, params, verr, group)
	if m.controllers == nil {
		m.controllers = make(map[string]*Controller)
	}
	m.controllers[name] = c
	m.sorted, m.sortedUUIDs = nil, ""
	if !m.registered && !m.fake {
		registry.add(m)
		m.registered = true
	}
	m.metricsOrDefault().addActive(1)
	go c.run() // joined through release; see Controller.run
	return c, true
}

// TriggerController makes the named controller run DoFunc at once, keeping
// its retry backoff; a trigger that arrives while DoFunc runs makes one more
// run after it. It returns false when there is no such controller.
func (m *Manager) TriggerController(name string) bool {
	m.mu.Lock()
	c, ok := m.controllers[name]
	m.mu.Unlock()
	if ok {
		c.trigger()
	}
	return ok
}

// Lookup returns the named controller, or nil when there is none.
func (m *Manager) Lookup(name string) *Controller {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.controllers[name]
}

// RemoveController removes the named controller without waiting for it to
// stop: its running DoFunc is cancelled, no DoFunc starts again, and its
// StopFunc runs in the background. The name can be installed again at once;
// the new controller may then start while the old StopFunc still runs (use
// [Manager.RemoveControllerAndWait] to serialise). The error wraps
// [ErrControllerNotFound] when there is no such controller.
func (m *Manager) RemoveController(name string) error {
	_, err := m.remove(name)
	return err
}

// RemoveControllerAndWait removes the named controller, as
// [Manager.RemoveController] does, and waits until its DoFunc and StopFunc
// have returned. The error wraps [ErrControllerNotFound] when there is no
// such controller.
func (m *Manager) RemoveControllerAndWait(name string) error {
	c, err := m.remove(name)
	if err == nil {
		<-c.terminationChannel()
	}
	return err
}

func (m *Manager) remove(name string) (*Controller, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	c, ok := m.controllers[name]
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrControllerNotFound, name)
	}
	m.removeLocked(c)
	m.unregisterIfEmptyLocked()
	return c, nil
}

func (m *Manager) removeLocked(c *Controller) {
	delete(m.controllers, c.name)
	m.sorted, m.sortedUUIDs = nil, ""
	m.stopLocked(c)
}

// stopLocked stops c, which the caller has taken out of m.controllers.
func (m *Manager) stopLocked(c *Controller) {
	if !c.fake {
		if len(m.stopping) == cap(m.stopping) || m.stoppingN.Load() == 0 {
			m.pruneStoppingLocked()
		}
		m.stopping = append(m.stopping, stoppingController{c: c, removed: time.Now().UnixNano()})
		m.indexStoppingLocked(c)
		m.stoppingN.Add(1)
		c.cohort = m.openCohortLocked()
		c.cohort.pending.Add(1)
		m.watchStoppingLocked()
	}
	c.remove(m.closed)
}

// unregisterIfEmptyLocked takes m out of the global registry once it has
// neither installed nor stopping controllers: the global statuses list
// both kinds.
func (m *Manager) unregisterIfEmptyLocked() {
	if m.registered && len(m.controllers) == 0 && m.stoppingN.Load() == 0 {
		registry.remove(m)
		m.registered = false
	}
}

// release is called by a controller's goroutine once it is done, as its
// last act.
func (m *Manager) release(c *Controller) {
	m.metricsOrDefault().addActive(-1)
	c.mu.Lock()
	c.markDoneLocked()
	c.mu.Unlock()
	if m.stoppingN.Add(-1) == 0 && !m.fake {
		// The last stopping controller: m may leave the registry, and
		// the slow-stop watch has nothing left to watch. Only the
		// goroutine that brings the count to 0 takes the lock.
		m.mu.Lock()
		m.unwatchIfIdleLocked()
		m.unregisterIfEmptyLocked()
		m.mu.Unlock()
	}
	c.cohort.release(1)
}

// pruneStoppingLocked drops terminated controllers from m.stopping, and
// from its index, so it does not keep them from the garbage collector.
// A list still more than half full after pruning doubles its capacity, so
// that the next prune, which stopLocked makes when the list is full, comes
// after as many removals as the list holds: pruning stays linear however
// the removals and terminations interleave.
func (m *Manager) pruneStoppingLocked() {
	if m.stoppingN.Load() == 0 {
		if cap(m.stopping) > 1024 {
			// Let a big list and its index go, after a big removal.
			m.stopping, m.stoppingByName, m.shadowed = nil, nil, nil
			return
		}
		clear(m.stopping)
		m.stopping = m.stopping[:0]
		clear(m.stoppingByName)
		clear(m.shadowed)
		return
	}
	reindex := len(m.shadowed) > 0 // a chain may pass through a pruned controller
	m.stopping = slices.DeleteFunc(m.stopping, func(s stoppingController) bool {
		if !s.c.done() {
			return false
		}
		if !reindex && m.stoppingByName[s.c.name] == s.c {
			delete(m.stoppingByName, s.c.name)
		}
		return true
	})
	if reindex {
		clear(m.stoppingByName)
		clear(m.shadowed)
		for _, s := range m.stopping {
			m.indexStoppingLocked(s.c)
		}
	}
	if len(m.stopping) > cap(m.stopping)/2 {
		m.stopping = slices.Grow(m.stopping, len(m.stopping))
	}
}

// RemoveAll removes every controller of the Manager without waiting, as
// [Manager.RemoveController] does for one.
func (m *Manager) RemoveAll() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.removeAllLocked()
}

// removeAllAndSeal removes every controller and seals the open stop cohort,
// in one critical section, closing the Manager first when close is set:
// the returned cohort (nil: nothing to wait for) drains once exactly the
// controllers removed so far have terminated.
func (m *Manager) removeAllAndSeal(close bool) *stopCohort {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = m.closed || close
	m.removeAllLocked()
	co := m.sealCohortLocked()
	if co == nil {
		// Nothing is stopping: let the list and its index go.
		m.stopping, m.stoppingByName, m.shadowed = nil, nil, nil
	}
	return co
}

func (m *Manager) removeAllLocked() {
	// Take the whole map rather than deleting its entries one by one.
	cs := m.controllers
	m.controllers, m.sorted, m.sortedUUIDs = nil, nil, ""
	m.pruneStoppingLocked()
	m.stopping = slices.Grow(m.stopping, len(cs))
	if m.stoppingByName == nil && !m.fake {
		m.stoppingByName = make(map[string]*Controller, len(cs))
	}
	if m.fake {
		for _, c := range cs {
			m.stopLocked(c) // its fake controllers are not counted as stopping
		}
	} else {
		// Counted once, not once per controller: the goroutines that
		// terminate meanwhile decrement the same counters from the other
		// cores.
		m.stoppingN.Add(int64(len(cs)))
		co := m.openCohortLocked()
		co.pending.Add(int64(len(cs)))
		now := time.Now().UnixNano()
		for _, c := range cs {
			m.stopping = append(m.stopping, stoppingController{c: c, removed: now})
			m.indexStoppingLocked(c)
			c.cohort = co
			c.remove(m.closed)
		}
		if len(cs) > 0 {
			m.watchStoppingLocked()
		}
	}
	m.unregisterIfEmptyLocked()
}

// RemoveAllAndWait removes every controller of the Manager and waits until
// all have stopped, those removed earlier and still stopping included.
// Controllers installed and removed while it waits are not waited for. A
// DoFunc or StopFunc that never returns makes it wait for ever; use
// [Manager.Shutdown] to bound the wait.
func (m *Manager) RemoveAllAndWait() {
	if co := m.removeAllAndSeal(false); co != nil {
		<-co.drained
	}
}

// Shutdown ends the Manager's life, as [net/http.Server.Shutdown] ends a
// server's: from the moment it is called the Manager refuses installs
// (logged at Warn; UpdateController returns nil, CreateController false),
// so a late event handler cannot install a controller into an owner that
// is going away. It removes every controller and waits until all have
// stopped, those removed earlier and still stopping included, or until ctx
// ends. When ctx ends first, it cancels the contexts of the StopFuncs still
// running (or yet to run) of the controllers it waited for and returns an
// error that wraps ctx.Err() and names them; they stay in
// [Manager.GetStoppingStatus] until they terminate. A second Shutdown
// waits again for whatever is still stopping.
//
// To empty a Manager and keep using it, as Cilium's RemoveAllAndWait
// does, call [Manager.RemoveAllAndWait].
func (m *Manager) Shutdown(ctx context.Context) error {
	ctx = contextOrBackground(ctx)
	co := m.removeAllAndSeal(true)
	if co == nil {
		return nil
	}
	select {
	case <-co.drained:
		return nil
	case <-ctx.Done():
	}
	m.mu.Lock()
	var running []*Controller
	for _, s := range m.stopping {
		if c := s.c; c.cohort.seq <= co.seq && !c.done() {
			running = append(running, c)
		}
	}
	m.mu.Unlock()
	names := make([]string, 0, len(running))
	for _, c := range running {
		c.expireStop()
		names = append(names, c.name)
	}
	if len(names) == 0 {
		return nil // all terminated as the deadline passed
	}
	slices.Sort(names)
	return fmt.Errorf("controller: shutdown: %w; still running: %s", ctx.Err(), strings.Join(names, ", "))
}

// TerminationChannel returns a channel that is closed when the named
// controller has stopped after its removal, its StopFunc included. The
// controller installed under name wins: when the name was installed again
// after a removal, the channel is the new controller's, closed only once
// that one is removed and stopped (keep the old controller's channel,
// taken before the new install, to wait for the old one). When none is
// installed, it is the one last removed under name that is still stopping
// (see [Manager.GetStoppingStatus]), so "remove, then wait on
// TerminationChannel" waits for the StopFunc. For a name with neither it
// returns a closed channel. Do not close the channel.
func (m *Manager) TerminationChannel(name string) chan struct{} {
	m.mu.Lock()
	c, ok := m.controllers[name]
	if !ok {
		c = m.lastStoppingLocked(name)
		ok = c != nil
	}
	m.mu.Unlock()
	if ok {
		return c.terminationChannel()
	}
	ch := make(chan struct{})
	close(ch)
	return ch
}

// GetStatusModel returns the status of every controller of the Manager,
// sorted by name.
func (m *Manager) GetStatusModel() ControllerStatuses {
	m.mu.Lock()
	if m.sorted == nil && len(m.controllers) > 0 {
		// Rebuilt only after controllers came or went: a status poll of
		// an unchanged Manager neither sorts nor formats a UUID, and its
		// statuses share one UUID string.
		m.sorted = m.installedLocked(make([]*Controller, 0, len(m.controllers)))
		slices.SortFunc(m.sorted, func(a, b *Controller) int { return strings.Compare(a.name, b.name) })
		m.sortedUUIDs = formatUUIDs(m.sorted)
	}
	cs, uuids := m.sorted, m.sortedUUIDs
	m.mu.Unlock()
	return statusesOf(cs, uuids, time.Now().UnixNano())
}
