// The storm's operations: what a worker does to the Manager, one function
// per operation of its API.

package controller

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

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

// step issues one operation, drawn at random: on one of the worker's own
// names (it alone installs under them), or on any worker's name. The
// names are drawn before the operation, whichever it is, so a seed replays
// the same sequence.
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
		w.update(own)
	case opCreate:
		w.create(own)
	case opRemove:
		w.remove(own, false)
	case opRemoveAndWait:
		w.remove(own, true)
	case opRemoveOther:
		w.removeOther(anyName)
	case opTrigger:
		s.m.TriggerController(anyName)
	case opRemoveAll, opRemoveAllAndWait, opShutdown:
		w.removeAll(op)
	case opStatusModel:
		w.statusModel()
	case opGlobalStatus:
		w.globalStatus()
	case opHealth:
		w.health()
	case opLookup:
		w.lookup(anyName)
	case opCancelContext:
		w.cancelContext()
	}
}

// update installs new parameters under one of the worker's names.
func (w *stormWorker) update(own string) {
	s := w.s
	sub := w.newSubmission(own)
	closed := s.shutDone.Load()
	c := s.m.UpdateController(own, w.params(sub))
	after := s.seq.Add(1)
	switch {
	case c == nil && !s.shut.Load():
		s.errorf("UpdateController(%q) returned nil", own)
	case c == nil:
		s.decline(sub) // refused: a Shutdown was called
	case closed:
		s.errorf("UpdateController(%q) installed after a Shutdown returned", own)
	default:
		w.bind(sub, c, after)
	}
}

// create installs under one of the worker's names unless a controller of
// that name is installed, and fetches what it created, fenced from every
// removal.
func (w *stormWorker) create(own string) {
	s := w.s
	sub := w.newSubmission(own)
	closed := s.shutDone.Load()
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
		s.decline(sub)
		if w.cur[own] == nil && !s.shut.Load() {
			s.errorf("CreateController(%q) returned false, but no controller of that name was installed", own)
		}
	case closed:
		s.errorf("CreateController(%q) installed after a Shutdown returned", own)
	case c == nil || (w.cur[own] != nil && w.cur[own].c == c):
		s.errorf("CreateController(%q) returned true, but Lookup does not give a new controller", own)
	default:
		w.bind(sub, c, after)
	}
}

// decline records parameters an install did not use: a CreateController
// that found the name taken, or an install a Shutdown refused.
func (s *storm) decline(sub *submission) {
	s.mu.Lock()
	sub.declined = true
	s.declined = append(s.declined, sub)
	s.mu.Unlock()
}

// remove removes the controller under one of the worker's names, with
// RemoveControllerAndWait when wait is set, and records when it was
// removed (and waited for).
func (w *stormWorker) remove(own string, wait bool) {
	s := w.s
	var err error
	if wait {
		s.hold()
		err = s.m.RemoveControllerAndWait(own)
	} else {
		err = s.m.RemoveController(own)
	}
	after := s.seq.Add(1)
	if wait {
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
	if wait {
		in.waited = minSeq(in.waited, after)
	}
	s.mu.Unlock()
}

// removeOther removes a controller under any worker's name, fenced from
// that name's Create and Lookup.
func (w *stormWorker) removeOther(anyName string) {
	s := w.s
	s.nameLocks[anyName].Lock()
	err := s.m.RemoveController(anyName)
	s.nameLocks[anyName].Unlock()
	if err != nil {
		w.checkNotFound(err, anyName)
	}
}

// statusModel reads the Manager's status model: sorted by name, each name
// once, counters that never go down.
func (w *stormWorker) statusModel() {
	s := w.s
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
}

// globalStatus reads GetGlobalStatus: sorted by name and UUID, counters
// that never go down.
func (w *stormWorker) globalStatus() {
	st := GetGlobalStatus()
	if !slices.IsSortedFunc(st, compareStatus) {
		w.s.errorf("GetGlobalStatus is not sorted by name and UUID: %v", statusNames(st))
	}
	w.checkMonotone(st)
}

// health reads Health, which names the failing controllers sorted.
func (w *stormWorker) health() {
	s := w.s
	names := healthNames(s, s.m.Health())
	if !slices.IsSorted(names) {
		s.errorf("Health is not sorted by name: %v", names)
	}
}

// lookup looks a name up; what it finds carries that name.
func (w *stormWorker) lookup(anyName string) {
	if c := w.s.m.Lookup(anyName); c != nil {
		if c.Name() != anyName || c.GetStatusModel().Name != anyName {
			w.s.errorf("Lookup(%q) gave controller %q", anyName, c.Name())
		}
	}
}

// cancelContext ends one of the worker's live params.Contexts and puts a
// new one in its place.
func (w *stormWorker) cancelContext() {
	i := w.rng.IntN(len(w.live))
	w.cancels[i]()
	ctx, cancel := context.WithCancel(context.Background())
	w.live[i], w.cancels[i] = ctx, cancel
}

func (w *stormWorker) removeAll(op stormOp) {
	s := w.s
	s.allRemovals.Lock()
	defer s.allRemovals.Unlock()
	before := s.seq.Add(1)
	waited := false
	switch op {
	case opShutdown:
		if s.round%2 == 0 || !s.lateHalf {
			// Shutdown closes the Manager for good: it ends only the
			// second half of odd rounds, so that most of the storm runs
			// on a Manager that takes installs.
			s.m.RemoveAll()
			break
		}
		s.shut.Store(true)
		d := []time.Duration{0, 20 * time.Microsecond, 200 * time.Microsecond}[w.rng.IntN(3)]
		ctx, cancel := context.WithTimeout(context.Background(), d)
		err := s.m.Shutdown(ctx)
		cancel()
		s.shutDone.Store(true)
		if err != nil && (!errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "still running: ")) {
			s.errorf("Shutdown at its deadline returned %v, want one wrapping context.DeadlineExceeded and naming what still runs", err)
		}
		waited = err == nil
		if err != nil {
			s.mu.Lock()
			s.totals.shutdownErrs++
			s.mu.Unlock()
		}
	case opRemoveAll:
		s.m.RemoveAll()
	case opRemoveAllAndWait:
		s.hold()
		s.m.RemoveAllAndWait()
		s.letBlock()
		waited = true
	}
	after := s.seq.Add(1)
	s.mu.Lock()
	s.removals = append(s.removals, removalOp{before, after, waited})
	s.mu.Unlock()
	clear(w.cur)
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

// later reports whether seq x came after limit; a limit of 0 is unknown.
func later(x, limit uint64) bool { return limit != 0 && x > limit }

func minSeq(a, b uint64) uint64 {
	if a == 0 || b < a {
		return b
	}
	return a
}
