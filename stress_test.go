package controller

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
		s.phase(perWorkerRound / 2)
		s.pause()
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

// storm is the state of one TestStorm run. Fields below mu are guarded by
// it; mu's cond wakes the checker when a call arrives, parks or finishes.
type storm struct {
	t        *testing.T
	seed     uint64
	m        *Manager
	met      *Metrics
	reg      *prometheus.Registry
	seq      atomic.Uint64
	round    int
	workers  []*stormWorker
	errCount atomic.Int32

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
	s := &storm{
		t: t, seed: seed,
		m:         NewManager(WithLogger(logger), WithMetrics(met)),
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

// --- the calls the library makes ---------------------------------------

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

// --- the workers --------------------------------------------------------

type stormWorker struct {
	s     *storm
	id    int
	rng   *rand.Rand
	names []string
	cur   map[string]*instance // the newest instance this worker installed under each name
	ops   int
	// params.Context choices: two live contexts (cancelled and replaced by
	// an operation) and one that is already cancelled.
	live    [2]context.Context
	cancels []context.CancelFunc
	dead    context.Context
	// seen: the counters of each UUID at this worker's last read, which
	// must never go down.
	seen     map[string][2]int64
	opCounts [numStormOps]int
}

type stormOp uint8

const (
	opUpdate stormOp = iota
	opCreate
	opRemove
	opRemoveOther
	opRemoveAndWait
	opTrigger
	opRemoveAll
	opRemoveAllAndWait
	opShutdown
	opStatusModel
	opGlobalStatus
	opHealth
	opLookup
	opCancelContext
	numStormOps
)

var stormOpNames = [numStormOps]string{"Update", "Create", "Remove", "RemoveOthers", "RemoveAndWait", "Trigger",
	"RemoveAll", "RemoveAllAndWait", "Shutdown", "GetStatusModel", "GetGlobalStatus", "Health", "Lookup", "CancelContext"}

// stormOpWeights is the mix of operations, out of their sum.
var stormOpWeights = [numStormOps]int{
	opUpdate: 300, opCreate: 80, opRemove: 25, opRemoveOther: 8, opRemoveAndWait: 10, opTrigger: 150,
	opRemoveAll: 1, opRemoveAllAndWait: 1, opShutdown: 2,
	opStatusModel: 80, opGlobalStatus: 30, opHealth: 80, opLookup: 40, opCancelContext: 20,
}

func (s *storm) opCounts() string {
	var b strings.Builder
	for op := range numStormOps {
		n := 0
		for _, w := range s.workers {
			n += w.opCounts[op]
		}
		fmt.Fprintf(&b, "%s=%d ", stormOpNames[op], n)
	}
	return strings.TrimSpace(b.String())
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

func (w *stormWorker) pickOp() stormOp {
	total := 0
	for _, x := range stormOpWeights {
		total += x
	}
	r := w.rng.IntN(total)
	for op, x := range stormOpWeights {
		if r < x {
			return stormOp(op)
		}
		r -= x
	}
	panic("unreachable")
}

func (w *stormWorker) step() {
	s := w.s
	op := w.pickOp()
	w.ops++
	w.opCounts[op]++
	own := w.names[w.rng.IntN(len(w.names))]
	other := s.workers[w.rng.IntN(len(s.workers))]
	anyName := other.names[w.rng.IntN(len(other.names))]
	switch op {
	case opUpdate:
		sub := w.newSubmission(own)
		c := s.m.UpdateController(own, w.params(sub))
		after := s.seq.Add(1)
		if c == nil {
			s.errorf("UpdateController(%q) returned nil", own)
			return
		}
		w.bind(sub, c, after)
	case opCreate:
		sub := w.newSubmission(own)
		s.allRemovals.RLock()
		s.nameLocks[own].Lock()
		created := s.m.CreateController(own, w.params(sub))
		var c *Controller
		if created {
			c = s.m.Lookup(own)
		}
		s.nameLocks[own].Unlock()
		s.allRemovals.RUnlock()
		after := s.seq.Add(1)
		switch {
		case !created:
			s.mu.Lock()
			sub.declined = true
			s.declined = append(s.declined, sub)
			s.mu.Unlock()
			if w.cur[own] == nil {
				s.errorf("CreateController(%q) returned false, but no controller of that name was installed", own)
			}
		case c == nil || (w.cur[own] != nil && w.cur[own].c == c):
			s.errorf("CreateController(%q) returned true, but Lookup does not give a new controller", own)
		default:
			w.bind(sub, c, after)
		}
	case opRemove, opRemoveAndWait:
		if op == opRemoveAndWait {
			s.hold()
		}
		var err error
		if op == opRemove {
			err = s.m.RemoveController(own)
		} else {
			err = s.m.RemoveControllerAndWait(own)
		}
		after := s.seq.Add(1)
		if op == opRemoveAndWait {
			s.letBlock()
		}
		in := w.cur[own]
		delete(w.cur, own)
		if err != nil {
			w.checkNotFound(err, own)
			return
		}
		if in == nil {
			s.errorf("removing %q succeeded, but no controller of that name was installed", own)
			return
		}
		s.mu.Lock()
		in.removed = minSeq(in.removed, after)
		if op == opRemoveAndWait {
			in.waited = minSeq(in.waited, after)
		}
		s.mu.Unlock()
	case opRemoveOther:
		s.nameLocks[anyName].Lock()
		err := s.m.RemoveController(anyName)
		s.nameLocks[anyName].Unlock()
		if err != nil {
			w.checkNotFound(err, anyName)
		}
	case opTrigger:
		s.m.TriggerController(anyName)
	case opRemoveAll, opRemoveAllAndWait, opShutdown:
		w.removeAll(op)
	case opStatusModel:
		st := s.m.GetStatusModel()
		if !slices.IsSortedFunc(st, func(a, b *ControllerStatus) int { return strings.Compare(a.Name, b.Name) }) {
			s.errorf("GetStatusModel is not sorted by name: %v", statusNames(st))
		}
		for i := 1; i < len(st); i++ {
			if st[i].Name == st[i-1].Name {
				s.errorf("GetStatusModel lists %q twice", st[i].Name)
			}
		}
		w.checkMonotone(st)
	case opGlobalStatus:
		st := GetGlobalStatus()
		if !slices.IsSortedFunc(st, compareStatus) {
			s.errorf("GetGlobalStatus is not sorted by name and UUID: %v", statusNames(st))
		}
		w.checkMonotone(st)
	case opHealth:
		names := healthNames(s, s.m.Health())
		if !slices.IsSorted(names) {
			s.errorf("Health is not sorted by name: %v", names)
		}
	case opLookup:
		if c := s.m.Lookup(anyName); c != nil {
			if c.Name() != anyName || c.GetStatusModel().Name != anyName {
				s.errorf("Lookup(%q) gave controller %q", anyName, c.Name())
			}
		}
	case opCancelContext:
		i := w.rng.IntN(len(w.live))
		w.cancels[i]()
		ctx, cancel := context.WithCancel(context.Background())
		w.live[i], w.cancels[i] = ctx, cancel
	}
}

func (w *stormWorker) removeAll(op stormOp) {
	s := w.s
	s.allRemovals.Lock()
	defer s.allRemovals.Unlock()
	before := s.seq.Add(1)
	waited := false
	switch op {
	case opRemoveAll:
		s.m.RemoveAll()
	case opRemoveAllAndWait:
		s.hold()
		s.m.RemoveAllAndWait()
		s.letBlock()
		waited = true
	case opShutdown:
		d := []time.Duration{0, 20 * time.Microsecond, 200 * time.Microsecond}[w.rng.IntN(3)]
		ctx, cancel := context.WithTimeout(context.Background(), d)
		err := s.m.Shutdown(ctx)
		cancel()
		if err != nil && (!errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "still running: ")) {
			s.errorf("Shutdown at its deadline returned %v, want one wrapping context.DeadlineExceeded and naming what still runs", err)
		}
		waited = err == nil
		if err != nil {
			s.mu.Lock()
			s.totals.shutdownErrs++
			s.mu.Unlock()
		}
	}
	after := s.seq.Add(1)
	s.mu.Lock()
	s.removals = append(s.removals, removalOp{before, after, waited})
	s.mu.Unlock()
	clear(w.cur)
}

func (w *stormWorker) checkNotFound(err error, name string) {
	if !errors.Is(err, ErrControllerNotFound) || !strings.Contains(err.Error(), name) {
		w.s.errorf("removing %q: %v, want an error wrapping ErrControllerNotFound naming it", name, err)
	}
}

func (w *stormWorker) checkMonotone(st ControllerStatuses) {
	for _, c := range st {
		now := [2]int64{c.Status.SuccessCount, c.Status.FailureCount}
		if was, ok := w.seen[c.UUID]; ok && (now[0] < was[0] || now[1] < was[1]) {
			w.s.errorf("counters of %s (%s) went down: success %d → %d, failure %d → %d", c.Name, c.UUID, was[0], now[0], was[1], now[1])
		}
		w.seen[c.UUID] = now
	}
}

func statusNames(st ControllerStatuses) []string {
	var out []string
	for _, c := range st {
		out = append(out, c.Name)
	}
	return out
}

// healthNames returns the controllers Health names, in its order.
func healthNames(s *storm, err error) []string {
	if err == nil {
		return nil
	}
	var errs []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	} else {
		errs = []error{err}
	}
	var names []string
	for _, e := range errs {
		_, rest, ok := strings.Cut(e.Error(), `controller "`)
		name, _, ok2 := strings.Cut(rest, `"`)
		if !ok || !ok2 {
			s.errorf("Health error %q does not name its controller", e)
			continue
		}
		names = append(names, name)
	}
	return names
}

func (w *stormWorker) newContexts() {
	for _, cancel := range w.cancels {
		cancel()
	}
	w.cancels = w.cancels[:0]
	for i := range w.live {
		ctx, cancel := context.WithCancel(context.Background())
		w.live[i] = ctx
		w.cancels = append(w.cancels, cancel)
	}
	dead, cancel := context.WithCancel(context.Background())
	cancel()
	w.dead = dead
}

func (w *stormWorker) newSubmission(name string) *submission {
	s := w.s
	n := 1 + w.rng.IntN(3)
	script := make([]doKind, n)
	total := 0
	for _, x := range doKindWeights {
		total += x.w
	}
	for i := range script {
		r := w.rng.IntN(total)
		for _, x := range doKindWeights {
			if r < x.w {
				script[i] = x.k
				break
			}
			r -= x.w
		}
	}
	s.mu.Lock()
	s.subIDs++
	id := s.subIDs
	s.mu.Unlock()
	sub := &submission{s: s, id: id, name: name, script: script,
		stop:  stopKind(w.rng.IntN(int(stopStubborn) + 1)),
		group: []string{"", "g1", "g2"}[w.rng.IntN(3)]}
	switch w.rng.IntN(6) {
	case 0:
	case 1:
		sub.ctx = context.Background()
	case 2, 3:
		sub.ctx = w.live[0]
	case 4:
		sub.ctx = w.live[1]
	case 5:
		sub.ctx = w.dead
	}
	return sub
}

// params draws the parameters of sub: tiny durations so that retries and
// intervals fire often, and every flag the issue names flipped at random.
func (w *stormWorker) params(sub *submission) ControllerParams {
	us := time.Microsecond
	pick := func(ds ...time.Duration) time.Duration { return ds[w.rng.IntN(len(ds))] }
	return ControllerParams{
		Group:                  NewGroup(sub.group),
		DoFunc:                 sub.do,
		StopFunc:               sub.stopFn,
		Health:                 sub,
		Context:                sub.ctx,
		RunInterval:            pick(0, 0, 0, 200*us, 2000*us),
		ErrorRetryBaseDuration: pick(us, 20*us, 200*us),
		MaxRetryInterval:       pick(0, 0, 1000*us),
		NoErrorRetry:           w.rng.IntN(4) == 0,
		MaxRetries:             w.rng.IntN(4),
		Jitter:                 pick(0, 0, 50*us),
		CancelDoFuncOnUpdate:   w.rng.IntN(2) == 0,
	}
}

// bind records that the install of sub returned controller c.
func (w *stormWorker) bind(sub *submission, c *Controller, after uint64) {
	s := w.s
	s.mu.Lock()
	defer s.mu.Unlock()
	in := w.cur[sub.name]
	if in == nil || in.c != c {
		if known := s.byUUID[c.UUID()]; known != nil {
			s.errorf("an install of %q returned the controller %s installed earlier and since removed", sub.name, c.UUID())
			return
		}
		in = &instance{c: c, name: sub.name, created: after}
		s.instances = append(s.instances, in)
		s.byUUID[c.UUID()] = in
		w.cur[sub.name] = in
	}
	if c.Name() != sub.name {
		s.errorf("install of %q returned a controller named %q", sub.name, c.Name())
	}
	sub.inst = in
	in.subs = append(in.subs, sub)
}

// terminationOf returns the channel closed when c has terminated, whether
// or not c is still installed (TerminationChannel only knows installed
// names).
func terminationOf(c *Controller) <-chan struct{} { return c.terminationChannel() }

// later reports whether seq x came after limit; a limit of 0 is unknown.
func later(x, limit uint64) bool { return limit != 0 && x > limit }

func minSeq(a, b uint64) uint64 {
	if a == 0 || b < a {
		return b
	}
	return a
}

// --- the checks at quiescent points -------------------------------------

// pause stops the storm between two half rounds and checks what must hold
// while nothing moves.
func (s *storm) pause() {
	s.mu.Lock()
	s.paused = true
	s.waitQuiet()
	// Lost updates: the newest parameters of an installed controller with
	// a live context must run (rule 5), unless a DoFunc of older ones still
	// runs. Wait for each to arrive at its gate, or for a call of older
	// parameters that the library started before the update but that had
	// not reached the test yet.
	for _, w := range s.workers {
		for _, name := range w.names {
			in := w.cur[name]
			if in == nil || s.m.Lookup(name) != in.c {
				continue
			}
			q := in.subs[len(in.subs)-1]
			if q.ctx != nil && q.ctx.Err() != nil || in.running() {
				continue
			}
			for len(q.calls) == 0 && !in.running() {
				s.totals.updateWaits++
				s.waitingFor = in.describe(s.m)
				s.cond.Wait()
			}
			s.waitingFor = ""
		}
	}
	s.waitQuiet()
	// A StopFunc that returned leaves its controller a few steps from
	// terminating; take those steps out of the picture.
	var stopped []*instance
	for _, in := range s.instances {
		for _, sub := range in.subs {
			if len(sub.stops) > 0 && sub.stops[0].exit != 0 {
				stopped = append(stopped, in)
			}
		}
	}
	s.mu.Unlock()
	for _, in := range stopped {
		<-terminationOf(in.c)
	}

	st := s.m.GetStatusModel()
	health := healthNames(s, s.m.Health())
	failing := testutil.ToFloat64(s.met.failing)
	active := testutil.ToFloat64(s.met.active)
	var buf bytes.Buffer
	if err := FormatStatus(&buf, st, false); err != nil {
		s.errorf("FormatStatus: %v", err)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	var stFailing []string
	for _, c := range st {
		in := s.byUUID[c.UUID]
		if in == nil || in.name != c.Name {
			s.errorf("GetStatusModel lists %s (%s), which no install returned", c.Name, c.UUID)
		}
		if c.Status.ConsecutiveFailureCount > 0 {
			stFailing = append(stFailing, c.Name)
		}
	}
	if !slices.Equal(stFailing, health) || failing != float64(len(health)) {
		s.errorf("controllers_failing = %v, Health names %v, the status model has %v failing", failing, health, stFailing)
	}
	if want := fmt.Sprintf("Controller Status: %d/%d healthy\n", len(st)-len(stFailing), len(st)); !strings.HasPrefix(buf.String(), want) {
		s.errorf("FormatStatus begins %q, want %q", strings.SplitAfter(buf.String(), "\n")[0], want)
	}
	alive := 0
	for _, in := range s.instances {
		if !isClosed(terminationOf(in.c)) {
			alive++
		}
		s.checkCountersGrow(in)
	}
	if active != float64(alive) {
		s.errorf("controllers_active = %v, but %d controllers are installed or stopping", active, alive)
	}
	s.totals.pauses++
	s.paused = false
	s.cond.Broadcast()
}

// waitQuiet waits, with s.mu held, until no call is busy and no parked call
// can wake up.
func (s *storm) waitQuiet() {
	defer func() { s.waitingFor = "" }()
	for {
		s.waitingFor = fmt.Sprintf("quiescence: %d calls busy, %d parked", s.busy, len(s.blocked))
		quiet := s.busy == 0
		for p := range s.blocked {
			if p.canWake() {
				quiet = false
				break
			}
		}
		if quiet {
			return
		}
		s.cond.Wait()
	}
}

// running reports whether a DoFunc of the instance has not returned.
func (in *instance) running() bool {
	for _, sub := range in.subs {
		for _, c := range sub.calls {
			if c.exit == 0 {
				return true
			}
		}
	}
	return false
}

func (s *storm) checkCountersGrow(in *instance) {
	succ, fail := in.c.GetSuccessCount(), in.c.GetFailureCount()
	if succ < in.lastSuccess || fail < in.lastFailure {
		s.errorf("counters of %s (%s) went down: success %d → %d, failure %d → %d", in.name, in.c.UUID(), in.lastSuccess, succ, in.lastFailure, fail)
	}
	in.lastSuccess, in.lastFailure = succ, fail
}

// endRound releases everything, removes and waits for every controller,
// then checks every instance of the round call by call.
func (s *storm) endRound() {
	s.hold()
	before := s.seq.Add(1)
	if s.round%2 == 0 {
		s.m.RemoveAllAndWait()
	} else if err := s.m.Shutdown(context.Background()); err != nil {
		s.errorf("Shutdown without a deadline: %v", err)
	}
	after := s.seq.Add(1)
	s.letBlock()

	if st := s.m.GetStatusModel(); len(st) != 0 {
		s.errorf("controllers left after the round: %v", statusNames(st))
	}
	if err := s.m.Health(); err != nil {
		s.errorf("Health with no controller: %v", err)
	}
	if v := testutil.ToFloat64(s.met.active); v != 0 {
		s.errorf("controllers_active = %v with every controller terminated", v)
	}
	if v := testutil.ToFloat64(s.met.failing); v != 0 {
		s.errorf("controllers_failing = %v with no controller installed", v)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	s.removals = append(s.removals, removalOp{before, after, true})
	if s.busy != 0 || len(s.blocked) != 0 {
		s.errorf("%d calls busy and %d parked after every controller terminated", s.busy, len(s.blocked))
	}
	for _, in := range s.instances {
		s.checkInstance(in)
	}
	for _, sub := range s.declined {
		if len(sub.calls)+len(sub.stops)+sub.reports+sub.stopReports > 0 {
			s.errorf("the parameters of a CreateController that returned false were used on %q", sub.name)
		}
	}
	s.checkMetrics()

	s.totals.instances += len(s.instances)
	s.instances, s.declined, s.removals = nil, nil, nil
	clear(s.byUUID)
	for _, w := range s.workers {
		clear(w.cur)
		w.newContexts()
	}
}

// call is a stormCall with the position of its submission in the
// instance's list.
type boundCall struct {
	stormCall
	sub int
}

func (s *storm) checkInstance(in *instance) {
	id := fmt.Sprintf("%s (%s)", in.name, in.c.UUID())
	if !isClosed(terminationOf(in.c)) {
		s.errorf("%s did not terminate", id)
		return
	}
	var calls, stops []boundCall
	for i, sub := range in.subs {
		for _, c := range sub.calls {
			calls = append(calls, boundCall{c, i})
		}
		for _, c := range sub.stops {
			stops = append(stops, boundCall{c, i})
		}
	}
	slices.SortFunc(calls, func(a, b boundCall) int { return cmp.Compare(a.entry, b.entry) })
	s.totals.calls += len(calls)
	s.totals.stops += len(stops)

	// Rule 1: DoFunc runs at once, even when the controller was removed
	// first; rule 7: then StopFunc exactly once, the newest one.
	if len(calls) == 0 {
		s.errorf("%s: DoFunc never ran", id)
		return
	}
	if len(stops) != 1 {
		s.errorf("%s: StopFunc ran %d times after DoFunc ran %d times, want once", id, len(stops), len(calls))
		return
	}
	stop := stops[0]
	if stop.sub != len(in.subs)-1 {
		s.errorf("%s: the StopFunc of parameters %d of %d ran, want that of the newest", id, stop.sub+1, len(in.subs))
	}
	// Rule 6: no overlap, DoFunc after DoFunc, then StopFunc.
	for i, c := range calls {
		if c.exit == 0 {
			s.errorf("%s: DoFunc call %d never returned", id, i)
			return
		}
		if i > 0 && c.entry < calls[i-1].exit {
			s.errorf("%s: DoFunc call %d started before call %d returned", id, i, i-1)
		}
		if i > 0 && c.sub < calls[i-1].sub {
			s.errorf("%s: DoFunc call %d ran parameters %d after parameters %d had run (stale parameters)", id, i, c.sub+1, calls[i-1].sub+1)
		}
	}
	if last := calls[len(calls)-1]; stop.entry < last.exit || stop.exit == 0 {
		s.errorf("%s: StopFunc overlapped DoFunc", id)
	}
	// No DoFunc starts after its removal returned. One call may be seen
	// entering after it: the one the library had already started (or, for
	// a controller removed before its first run, the first run, rule 1);
	// either has a cancelled context.
	removed, waited := in.removed, in.waited
	for _, r := range s.removals {
		if r.before > in.created {
			removed = minSeq(removed, r.after)
			if r.waited {
				waited = minSeq(waited, r.after)
			}
		}
	}
	late := 0
	for i, c := range calls {
		s.totals.byKind[c.kind]++
		if c.ctxDone {
			s.totals.cancelledAtEntry++
		}
		if later(c.entry, removed) {
			s.totals.late++
			late++
			if late > 1 {
				s.errorf("%s: DoFunc call %d of %d started after the removal returned", id, i+1, len(calls))
			}
			if !c.ctxDone {
				s.errorf("%s: DoFunc call %d of %d, entered after the removal returned, has a live context", id, i+1, len(calls))
			}
		}
		if later(c.exit, waited) {
			s.errorf("%s: DoFunc call %d was still running after a wait for the controller's termination returned", id, i+1)
		}
	}
	if later(stop.exit, waited) {
		s.errorf("%s: StopFunc was still running after a wait for the controller's termination returned", id)
	}

	// Rule 3 and 7: the counters agree with the calls.
	sure, either, stopFailures, panics := 0, 0, 0, 0
	for _, c := range calls {
		switch c.verdict {
		case sureSuccess:
			sure++
		case eitherOutcome:
			either++
		}
		if c.panics {
			panics++
		}
	}
	if stop.failed {
		stopFailures++
	}
	if stop.panics {
		panics++
	}
	succ, fail := in.c.GetSuccessCount(), in.c.GetFailureCount()
	if succ+fail != len(calls)+stopFailures || succ < sure || succ > sure+either {
		s.errorf("%s: success %d, failure %d after %d DoFunc calls (%d sure successes, %d either way) and %d StopFunc failures",
			id, succ, fail, len(calls), sure, either, stopFailures)
	}
	s.checkCountersGrow(in)
	for i, sub := range in.subs {
		if sub.reports != len(sub.calls) {
			s.errorf("%s: HealthReporter told %d outcomes of %d DoFunc calls", id, sub.reports, len(sub.calls))
		}
		want := 0
		if i == len(in.subs)-1 {
			want = stopFailures
		}
		if sub.stopReports != want {
			s.errorf("%s: HealthReporter told %d StopFunc failures, want %d", id, sub.stopReports, want)
		}
	}

	s.totals.success += succ
	s.totals.failure += fail
	s.totals.stopFailures += stopFailures
	s.totals.panics += panics
	for _, c := range calls {
		s.totals.groupCalls[in.subs[c.sub].group]++
	}
	if stopFailures > 0 {
		// Which group a StopFunc failure counts in is the library's
		// choice (the group of the last run or of the newest params);
		// allow either.
		g1, g2 := in.subs[calls[len(calls)-1].sub].group, in.subs[len(in.subs)-1].group
		s.totals.groupStopMax[g1]++
		if g2 != g1 {
			s.totals.groupStopMax[g2]++
		} else {
			s.totals.groupStopMin[g1]++
		}
	}
}

// checkMetrics compares the metrics with the totals of every round so far.
func (s *storm) checkMetrics() {
	mfs, err := s.reg.Gather()
	if err != nil {
		s.errorf("gather: %v", err)
		return
	}
	runs := map[string]float64{}
	var durations, panics float64
	groupRuns := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			switch mf.GetName() {
			case "controllers_runs_total":
				runs[labels["status"]] = m.GetCounter().GetValue()
			case "controllers_runs_duration_seconds":
				durations += float64(m.GetHistogram().GetSampleCount())
			case "controllers_panics_total":
				panics += m.GetCounter().GetValue()
			case "controllers_group_runs_total":
				groupRuns[labels["group_name"]] += m.GetCounter().GetValue()
			}
		}
	}
	for status, v := range runs {
		if v < s.totals.lastRuns[status] {
			s.errorf("controllers_runs_total{status=%q} went down: %v → %v", status, s.totals.lastRuns[status], v)
		}
		s.totals.lastRuns[status] = v
	}
	if runs["success"] != float64(s.totals.success) || runs["failure"] != float64(s.totals.failure) {
		s.errorf("controllers_runs_total: success %v, failure %v; the controllers counted %d and %d", runs["success"], runs["failure"], s.totals.success, s.totals.failure)
	}
	if durations != float64(s.totals.calls) {
		s.errorf("controllers_runs_duration_seconds has %v samples for %d DoFunc calls", durations, s.totals.calls)
	}
	if panics != float64(s.totals.panics) {
		s.errorf("controllers_panics_total = %v for %d panics", panics, s.totals.panics)
	}
	if _, ok := groupRuns[""]; ok {
		s.errorf("controllers_group_runs_total has runs of the empty group")
	}
	for _, g := range []string{"g1", "g2"} {
		lo := float64(s.totals.groupCalls[g] + s.totals.groupStopMin[g])
		hi := float64(s.totals.groupCalls[g] + s.totals.groupStopMax[g])
		if groupRuns[g] < lo || groupRuns[g] > hi {
			s.errorf("controllers_group_runs_total{group_name=%q} = %v, want %v..%v", g, groupRuns[g], lo, hi)
		}
	}
}

// RemoveAllAndWait and Shutdown wait for every controller removed before
// they were called, until it has terminated and left controllers_active.
// The storm found them returning early: a terminating controller left the
// Manager's list of stopping controllers first, and only then left
// controllers_active and closed its termination channel; a wait that came
// in between did not wait for it. Here the controller is held in between by
// a gauge that blocks on its decrement.
func TestWaitsCoverAControllerThatIsTerminating(t *testing.T) {
	for _, wait := range []string{"RemoveAllAndWait", "Shutdown"} {
		t.Run(wait, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				met := NewMetrics(MetricsOpts{})
				leave := make(chan struct{})
				met.active = &heldGauge{Gauge: met.active, leave: leave}
				m := NewManager(WithLogger(quietLogger()), WithMetrics(met))
				c := m.UpdateController("c", ControllerParams{DoFunc: NoopFunc})
				require.NoError(t, m.RemoveController("c"))
				synctest.Wait() // c is terminating, held in its gauge decrement

				returned := make(chan error, 1)
				go func() {
					if wait == "Shutdown" {
						ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
						defer cancel()
						returned <- m.Shutdown(ctx)
						return
					}
					m.RemoveAllAndWait()
					returned <- nil
				}()
				synctest.Wait()
				if wait == "Shutdown" {
					err := <-returned // at its deadline
					assert.ErrorIs(t, err, context.DeadlineExceeded)
					assert.ErrorContains(t, err, "still running: c")
				} else {
					assert.False(t, isClosed(terminationOf(c)))
					assert.Empty(t, returned, "RemoveAllAndWait returned while c was terminating")
				}
				close(leave)
				if wait != "Shutdown" {
					require.NoError(t, <-returned)
				}
				<-terminationOf(c)
				m.RemoveAllAndWait()
				assert.Equal(t, 0.0, testutil.ToFloat64(met.active))
			})
		})
	}
}

// heldGauge is a Gauge whose decrements wait until leave is closed.
type heldGauge struct {
	prometheus.Gauge
	leave chan struct{}
}

func (g *heldGauge) Add(v float64) {
	if v < 0 {
		<-g.leave
	}
	g.Gauge.Add(v)
}
