// The Recorder: every DoFunc and StopFunc call of a test's controllers,
// on every replica, and the check that no name ran on two at once.

package sim

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/bgctl/controller"
	"github.com/bgctl/controller/ha"
)

// Recorder notes every call of the DoFuncs and StopFuncs registered
// through it ([Recorder.Controllers]), on every replica, and finds every
// moment a name's call began while another call of that name was
// running, on any replica ([Recorder.Overlaps]): what package ha
// promises never happens. The zero value is ready to use; its methods
// are safe for concurrent use.
type Recorder struct {
	mu       sync.Mutex
	running  map[string][]string // guarded by mu: the replicas with a call of the name running now, by name
	runs     map[string][]Run    // guarded by mu: every call, by name, in the order they began
	overlaps []Overlap           // guarded by mu: in the order they happened
}

// Run is one call of a name's DoFunc or StopFunc.
type Run struct {
	Replica    string    // the replica it ran on
	Stop       bool      // a StopFunc call; else a DoFunc run
	Start, End time.Time // End is zero while it runs
}

// Overlap is a call of Name that began on Started while a call of it
// was running on Running (the same replica or another).
type Overlap struct {
	Name, Running, Started string
	At                     time.Time
}

// String says which name ran where twice at once.
func (o Overlap) String() string {
	return fmt.Sprintf("%s began on %s at %s while running on %s", o.Name, o.Started, o.At.Format(time.RFC3339Nano), o.Running)
}

// Controllers returns r's Controllers with every registration recorded:
// its UpdateController wraps the DoFunc and StopFunc it is given, so
// that each of their calls is noted as r's; every other method is r's.
// Register the service's controllers through it, with the code the
// service registers them with. It panics, saying so, given a nil
// replica: a mistake in the test, which would otherwise be a nil
// dereference with nothing to name it.
func (rec *Recorder) Controllers(r *ha.Replica) ha.Controllers {
	if r == nil {
		panic("sim: Recorder.Controllers(nil): a replica made by ha.New is needed")
	}
	return recorded{Controllers: r, rec: rec, replica: r.ID()}
}

// recorded is a replica's Controllers whose calls a Recorder notes.
type recorded struct {
	ha.Controllers
	rec     *Recorder // immutable
	replica string    // immutable
}

// UpdateController registers params with its funcs wrapped.
func (c recorded) UpdateController(name string, params controller.ControllerParams) error {
	params.DoFunc = c.rec.wrap(c.replica, name, false, params.DoFunc)
	params.StopFunc = c.rec.wrap(c.replica, name, true, params.StopFunc)
	return c.Controllers.UpdateController(name, params)
}

// wrap returns f with each of its calls recorded; nil stays nil.
func (rec *Recorder) wrap(replica, name string, stop bool, f controller.ControllerFunc) controller.ControllerFunc {
	if f == nil {
		return nil
	}
	return func(ctx context.Context) error {
		i := rec.begin(replica, name, stop)
		defer rec.finish(replica, name, i)
		return f(ctx)
	}
}

// begin notes a call of name's on replica, and any call of name it
// overlaps; it returns the run's index.
func (rec *Recorder) begin(replica, name string, stop bool) int {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.runs == nil {
		rec.runs, rec.running = map[string][]Run{}, map[string][]string{}
	}
	now := time.Now()
	for _, other := range rec.running[name] {
		rec.overlaps = append(rec.overlaps, Overlap{Name: name, Running: other, Started: replica, At: now})
	}
	rec.running[name] = append(rec.running[name], replica)
	rec.runs[name] = append(rec.runs[name], Run{Replica: replica, Stop: stop, Start: now})
	return len(rec.runs[name]) - 1
}

// finish notes the end of run i of name's, on replica.
func (rec *Recorder) finish(replica, name string, i int) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	rec.runs[name][i].End = time.Now()
	on := rec.running[name]
	for j, r := range on {
		if r == replica {
			rec.running[name] = append(on[:j:j], on[j+1:]...)
			break
		}
	}
}

// Overlaps returns every call that began while another call of its
// name was running, in the order they began: none, if no name ever ran
// twice at once.
func (rec *Recorder) Overlaps() []Overlap {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return append([]Overlap(nil), rec.overlaps...)
}

// Runs returns every call of name's so far, in the order they began.
func (rec *Recorder) Runs(name string) []Run {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return append([]Run(nil), rec.runs[name]...)
}
