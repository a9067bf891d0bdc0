// TestStorm: many workers hammer one Manager at random, and the test
// checks the package doc's rules at quiescent points. This file holds the
// driver and the DoFuncs, StopFuncs and HealthReporters it installs;
// storm_ops_test.go the operations, storm_checks_test.go the checks.

package controller

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"
	"go.uber.org/goleak"
)

// The storm: 8 workers hammer one Manager with every operation of its API
// while the controllers' DoFuncs and StopFuncs succeed, fail, panic, exit,
// block on their context or ignore it. The test records every DoFunc and
// StopFunc call against the controller instance it ran on, and at two kinds
// of quiescent points checks the package doc's rules exactly:
//
//   - a pause (mid-round): the workers are done with their half round and
//     every DoFunc and StopFunc either has been fully accounted for or is
//     parked in the test (at its entry gate, or blocked on a context or a
//     release channel that nobody can close during the pause). Nothing can
//     change the counters or gauges then, so controllers_failing must equal
//     the failing controllers of Health() and controllers_active the
//     controllers not yet terminated.
//   - the end of a round: everything is released and removed and has
//     terminated; every call of every instance is checked (no overlap, one
//     StopFunc iff DoFunc ran, no DoFunc after removal, no stale parameters,
//     counters agree with the calls and with the metrics).
//
// "No DoFunc after removal" is checked as precisely as the outside can see
// it: a call enters the test a moment after the library started it, so one
// call may enter after the removal returned (the one in flight, or the
// first run of a controller removed before its goroutine ran, rule 1), and
// it must see a cancelled context; a second one is a violation.
//
// Ordering is observed through one atomic sequence number: an operation or a
// call takes a number before and after, so "A returned before B started" is
// exact when A's number is below B's.
//
// Names are owned: only the worker that owns a name installs controllers
// under it (any worker triggers or removes it), so the instance an install
// returns is known without guessing. A Create and the Lookup that fetches
// the instance it created are fenced from removals by locks; nothing else is.

var (
	stormSeed = flag.Uint64("storm.seed", 0, "seed of TestStorm's operations; 0 picks one from the clock")
	stormOps  = flag.Int("storm.ops", 200_000, "operations TestStorm issues in total, in rounds of about 10,000")
	// stormWatchdog turns a hang (a lost wake-up in the library, or a wait
	// in this test that can never end) into a crash that prints the seed.
	stormWatchdog = flag.Duration("storm.watchdog", 4*time.Minute, "TestStorm crashes, printing every goroutine and its seed, when it runs longer")
)

const (
	stormWorkers        = 8
	stormNamesPerWorker = 4
	// stormMaxErrors stops reporting after this many violations.
	stormMaxErrors = 30
)

// TestStorm: whatever a program does with a Manager, from any number of
// goroutines at once, the rules of the package doc hold. Its log names
// the seed; -storm.seed replays it and -storm.ops sets its length.
func TestStorm(t *testing.T) {
	seed := *stormSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("storm seed %d (replay with -storm.seed=%d)", seed, seed)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("storm failed; replay with: go test -race -run TestStorm -storm.seed=%d .", seed)
		}
	})
	wd := time.AfterFunc(*stormWatchdog, func() {
		buf := make([]byte, 16<<20)
		buf = buf[:runtime.Stack(buf, true)]
		fmt.Fprintf(os.Stderr, "%s\n", buf)
		s := currentStorm.Load()
		s.mu.Lock()
		fmt.Fprintf(os.Stderr, "storm waiting for: %s\n", s.waitingFor)
		s.mu.Unlock()
		panic(fmt.Sprintf("TestStorm stuck for %v (seed %d): a wait that must end did not; replay with -storm.seed=%d", *stormWatchdog, seed, seed))
	})
	defer wd.Stop()

	s := newStorm(t, seed)
	currentStorm.Store(s)
	rounds := min(max(*stormOps/10_000, 10), 1000)
	perWorkerRound := max(2, (*stormOps+stormWorkers*rounds-1)/(stormWorkers*rounds))
	for round := range rounds {
		s.round = round
		s.lateHalf = false
		s.phase(perWorkerRound / 2)
		s.pause()
		s.lateHalf = true
		s.phase(perWorkerRound - perWorkerRound/2)
		s.endRound()
		if s.errCount.Load() > 0 {
			break
		}
	}

	ops := 0
	for _, w := range s.workers {
		ops += w.ops
	}
	t.Logf("storm: %d operations, %d controller instances, %d DoFunc calls, %d StopFunc calls, %d pauses checked",
		ops, s.totals.instances, s.totals.calls, s.totals.stops, s.totals.pauses)
	t.Logf("storm: operations by kind: %s", s.opCounts())
	t.Logf("storm: DoFunc calls by behaviour (succeed, fail, panic, exit, block, stubborn): %v; %d with a context cancelled at entry, %d entered after their removal returned; %d pause waits for an update's run; %d Shutdowns hit their deadline",
		s.totals.byKind, s.totals.cancelledAtEntry, s.totals.late, s.totals.updateWaits, s.totals.shutdownErrs)
	if s.errCount.Load() == 0 && ops < *stormOps {
		t.Errorf("seed %d: only %d operations, want at least %d", seed, ops, *stormOps)
	}
	goleak.VerifyNone(t)
}

// phase runs n operations on each worker, all workers at once.
func (s *storm) phase(n int) {
	var wg sync.WaitGroup
	for _, w := range s.workers {
		wg.Go(func() {
			for range n {
				w.step()
			}
		})
	}
	wg.Wait()
}

// storm is the state of one TestStorm run. Fields below mu are guarded by
// it; mu's cond wakes the checker when a call arrives, parks or finishes.
type storm struct {
	t        *testing.T
	seed     uint64
	m        *Manager // replaced by newManager between rounds once shut down
	newMgr   func() *Manager
	round    int
	lateHalf bool // the round's second phase: a Shutdown may close m
	// shut is set when a Shutdown of m is called, shutDone once one
	// returned: from shut on an install may be refused, from shutDone on
	// it must be.
	shut, shutDone atomic.Bool
	met            *Metrics
	reg            *prometheus.Registry
	seq            atomic.Uint64
	workers        []*stormWorker
	errCount       atomic.Int32

	// allRemovals excludes RemoveAll, RemoveAllAndWait and Shutdown (write
	// lock) from a Create and its Lookup (read lock); nameLocks do the same
	// for a RemoveController of another worker's name.
	allRemovals sync.RWMutex
	nameLocks   map[string]*sync.Mutex

	mu   sync.Mutex
	cond *sync.Cond
	// paused makes DoFunc and StopFunc calls wait at their entry gate.
	paused bool
	// busy counts calls past their gate that are not parked: a DoFunc until
	// its HealthReporter was told the outcome (the library has recorded
	// it by then), a StopFunc until it returns.
	busy int
	// blocked holds the calls parked on a context or a release channel.
	blocked map[*parkedCall]struct{}
	// release is closed to release the calls that ignore their context;
	// while holders > 0 it stays closed and such calls do not block.
	release chan struct{}
	holders int

	waitingFor string // what pause waits for, for the watchdog

	instances []*instance // of this round
	byUUID    map[string]*instance
	declined  []*submission // Creates that returned false
	removals  []removalOp   // RemoveAll, RemoveAllAndWait, Shutdown of this round
	subIDs    int

	totals struct {
		instances, calls, stops, pauses                   int
		late, cancelledAtEntry, updateWaits, shutdownErrs int
		byKind                                            [doStubborn + 1]int
		success, failure                                  int // instances' counters, summed
		stopFailures, panics                              int
		groupCalls                                        map[string]int     // DoFunc calls by group
		groupStopMin, groupStopMax                        map[string]int     // StopFunc failures that may count in a group
		lastRuns                                          map[string]float64 // controllers_runs_total at the last check
	}
}

// removalOp is a RemoveAll, RemoveAllAndWait or Shutdown: it removed every
// instance created before it started (seq below before) by the time it
// returned (after); when waited, every such instance had terminated too.
type removalOp struct {
	before, after uint64
	waited        bool
}

type parkedCall struct {
	done    <-chan struct{} // a context's Done, or nil
	release chan struct{}   // the storm's release channel, or nil
}

func (b *parkedCall) canWake() bool { return isClosed(b.done) || isClosed(b.release) }

// instance is one controller instance (one UUID) as the test saw it.
type instance struct {
	c       *Controller
	name    string
	created uint64        // seq after the install that created it returned
	subs    []*submission // parameters bound to it, in the order of the installs
	// removed: seq after a removal known to have removed it returned;
	// waited: after a wait for its termination returned. 0: not known.
	removed, waited uint64
	// The counters at the last check, which must never go down.
	lastSuccess, lastFailure int
}

// submission is one ControllerParams handed to UpdateController or
// CreateController; its DoFunc, StopFunc and HealthReporter record into it.
type submission struct {
	s        *storm
	id       int
	name     string
	script   []doKind // call i behaves as script[i%len(script)]
	stop     stopKind
	group    string
	ctx      context.Context // params.Context
	inst     *instance       // nil until bound, and for a declined Create
	declined bool

	calls       []stormCall
	stops       []stormCall
	reports     int // OK or Degraded after a DoFunc run
	stopReports int // Degraded after a StopFunc failure
}

type stormCall struct {
	entry, exit uint64 // exit 0: not returned (yet)
	ctxDone     bool   // the context was done at entry
	kind        doKind
	// For a DoFunc: how the library must count it, as far as the test
	// knows: sureSuccess, sureFailure, or either (an error returned while
	// the context was live may meet a cancellation before the library
	// looks). For a StopFunc: failed.
	verdict verdict
	panics  bool
	failed  bool
}

type verdict uint8

const (
	sureSuccess verdict = iota
	sureFailure
	eitherOutcome
)

type doKind uint8

const (
	doSucceed  doKind = iota
	doFail            // returns an error
	doPanic           // panics
	doExit            // returns a wrapped ExitReason
	doBlock           // blocks until its context ends
	doStubborn        // ignores its context: blocks until the storm releases it
)

var doKindWeights = []struct {
	k doKind
	w int
}{{doSucceed, 4}, {doFail, 4}, {doPanic, 1}, {doExit, 1}, {doBlock, 2}, {doStubborn, 1}}

type stopKind uint8

const (
	stopSucceed  stopKind = iota
	stopFail              // returns a stopError
	stopPanic             // panics with a stopError
	stopBlock             // blocks until its context ends (a Shutdown deadline) or the release
	stopStubborn          // ignores its context until released
)

// stopError marks what a StopFunc returns or panics with, so its
// HealthReporter can tell a StopFunc failure from a DoFunc outcome.
type stopError struct{ msg string }

func (e stopError) Error() string { return e.msg }

var (
	errStormFail     = []error{errors.New("storm failure a"), errors.New("storm failure b")}
	errStormStubborn = errors.New("stubborn DoFunc finally returned")
)

func newStorm(t *testing.T, seed uint64) *storm {
	logger := logrus.New()
	logger.SetOutput(io.Discard) // Warn and Error lines are formatted, then dropped
	met := NewMetrics(MetricsOpts{})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(met)
	made := 0
	newMgr := func() *Manager {
		// Every other Manager holds the runs updates and triggers ask
		// for, for a moment (WithTriggerDebounce), so that the hold races
		// every operation too.
		made++
		if made%2 == 0 {
			return NewManager(WithLogger(logger), WithMetrics(met), WithTriggerDebounce(50*time.Microsecond))
		}
		return NewManager(WithLogger(logger), WithMetrics(met))
	}
	s := &storm{
		t: t, seed: seed,
		m:         newMgr(),
		newMgr:    newMgr,
		met:       met,
		reg:       reg,
		nameLocks: map[string]*sync.Mutex{},
		blocked:   map[*parkedCall]struct{}{},
		release:   make(chan struct{}),
		byUUID:    map[string]*instance{},
	}
	s.cond = sync.NewCond(&s.mu)
	s.totals.groupCalls = map[string]int{}
	s.totals.groupStopMin = map[string]int{}
	s.totals.groupStopMax = map[string]int{}
	s.totals.lastRuns = map[string]float64{}
	for i := range stormWorkers {
		w := &stormWorker{s: s, id: i, rng: rand.New(rand.NewPCG(seed, uint64(i))), cur: map[string]*instance{}, seen: map[string][2]int64{}}
		for j := range stormNamesPerWorker {
			name := fmt.Sprintf("w%d-c%d", i, j)
			w.names = append(w.names, name)
			s.nameLocks[name] = &sync.Mutex{}
		}
		w.newContexts()
		s.workers = append(s.workers, w)
	}
	return s
}

// currentStorm is the running storm, for the watchdog.
var currentStorm atomic.Pointer[storm]

// describe tells the history of the instance, for a stuck wait.
func (in *instance) describe(m *Manager) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s (%s) created at %d, removed %d, waited %d\n", in.name, in.c.UUID(), in.created, in.removed, in.waited)
	for i, sub := range in.subs {
		fmt.Fprintf(&b, "  params %d (sub %d): script %v stop %v ctx %v ctxErr %v\n", i, sub.id, sub.script, sub.stop, sub.ctx != nil, sub.ctx != nil && sub.ctx.Err() != nil)
		for _, c := range sub.calls {
			fmt.Fprintf(&b, "    call %+v\n", c)
		}
	}
	fmt.Fprintf(&b, "  installed %v, success %d, failure %d, terminated %v\n",
		m.Lookup(in.name) == in.c, in.c.GetSuccessCount(), in.c.GetFailureCount(), isClosed(terminationOf(in.c)))
	return b.String()
}

func (s *storm) errorf(format string, args ...any) {
	if n := s.errCount.Add(1); n <= stormMaxErrors {
		s.t.Errorf("seed %d, round %d: "+format, append([]any{s.seed, s.round}, args...)...)
	}
}

// gate records a call's entry, then holds it while the storm is paused.
// It returns the index of the call in its list.
func (s *storm) gate(list *[]stormCall, c stormCall) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := len(*list)
	*list = append(*list, c)
	s.cond.Broadcast() // an arrival may be what the checker waits for
	for s.paused {
		s.cond.Wait()
	}
	s.busy++
	return i
}

// park blocks a busy call until done is closed or, when releasable, until
// the storm releases the calls that ignore their context. Parked calls are
// not busy.
func (s *storm) park(done <-chan struct{}, releasable bool) {
	s.mu.Lock()
	if releasable && s.holders > 0 {
		s.mu.Unlock()
		return
	}
	p := &parkedCall{done: done}
	if releasable {
		p.release = s.release
	}
	s.blocked[p] = struct{}{}
	s.busy--
	s.cond.Broadcast()
	s.mu.Unlock()
	select {
	case <-p.done:
	case <-p.release:
	}
	s.mu.Lock()
	delete(s.blocked, p)
	s.busy++
	s.mu.Unlock()
}

func (s *storm) notBusy() {
	s.busy--
	if s.busy < 0 {
		s.errorf("more outcomes reported than DoFunc and StopFunc calls made")
	}
	s.cond.Broadcast()
}

func (sub *submission) do(ctx context.Context) error {
	s := sub.s
	entry := s.seq.Add(1)
	ctxDone := ctx.Err() != nil
	s.mu.Lock()
	kind := sub.script[len(sub.calls)%len(sub.script)]
	s.mu.Unlock()
	i := s.gate(&sub.calls, stormCall{entry: entry, ctxDone: ctxDone, kind: kind})

	var err error
	v := sureSuccess
	switch kind {
	case doSucceed:
	case doFail:
		err = errStormFail[i%len(errStormFail)]
	case doPanic:
		v = sureFailure
	case doExit:
		err = fmt.Errorf("storm: %w", NewExitReason("nothing left to do"))
	case doBlock:
		s.park(ctx.Done(), false)
		err = ctx.Err()
	case doStubborn:
		s.park(nil, true)
		err = errStormStubborn
	}
	if err != nil && (kind == doFail || kind == doStubborn) && ctx.Err() == nil {
		// The library decides after we return; a cancellation may come
		// in between and turn this failure into an exit.
		v = eitherOutcome
	}
	exit := s.seq.Add(1)
	s.mu.Lock()
	sub.calls[i].exit, sub.calls[i].verdict, sub.calls[i].panics = exit, v, kind == doPanic
	s.mu.Unlock()
	if kind == doPanic {
		if i%2 == 0 {
			panic("storm DoFunc panics")
		}
		panic(errors.New("storm DoFunc panics with an error"))
	}
	return err
}

func (sub *submission) stopFn(ctx context.Context) error {
	s := sub.s
	entry := s.seq.Add(1)
	i := s.gate(&sub.stops, stormCall{entry: entry, ctxDone: ctx.Err() != nil})
	var err error
	switch sub.stop {
	case stopFail:
		err = stopError{"storm StopFunc failed"}
	case stopBlock:
		s.park(ctx.Done(), true)
		if ctx.Err() != nil {
			err = stopError{"storm StopFunc: " + ctx.Err().Error()}
		}
	case stopStubborn:
		s.park(nil, true)
	}
	exit := s.seq.Add(1)
	s.mu.Lock()
	c := &sub.stops[i]
	c.exit, c.panics, c.failed = exit, sub.stop == stopPanic, err != nil || sub.stop == stopPanic
	s.notBusy()
	s.mu.Unlock()
	if sub.stop == stopPanic {
		panic(stopError{"storm StopFunc panics"})
	}
	return err
}

// OK and Degraded make the submission its controller's HealthReporter.
func (sub *submission) OK(name string) { sub.reported(name, nil) }

func (sub *submission) Degraded(name string, err error) { sub.reported(name, err) }

func (sub *submission) reported(name string, err error) {
	s := sub.s
	if name != sub.name {
		s.errorf("HealthReporter of %q told about %q", sub.name, name)
	}
	var se stopError
	s.mu.Lock()
	defer s.mu.Unlock()
	if errors.As(err, &se) {
		sub.stopReports++
		return
	}
	sub.reports++
	s.notBusy()
}

// hold keeps the calls that ignore their context from blocking (and
// releases those blocked), for an operation that waits for controllers to
// terminate; letBlock ends that.
func (s *storm) hold() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.holders == 0 {
		close(s.release)
	}
	s.holders++
}

func (s *storm) letBlock() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.holders--
	if s.holders == 0 {
		s.release = make(chan struct{})
	}
}
