// A seeded random schedule of crashes, partitions, heals, joins and
// leaves of whole replicas on the Kubernetes store, against the real
// kube-apiserver, with user code that takes all the time the contract
// gives it: never two runs of a name at once, every Close and Leave
// within its bound.

package kube

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	controller "github.com/bgctl/controller"
	"github.com/bgctl/controller/ha"
)

var (
	kubeScheduleFor  = flag.Duration("kube.schedule", 25*time.Second, "how long TestRandomScheduleOnKubernetes pauses between its operations in all")
	kubeScheduleSeed = flag.Uint64("kube.seed", 0, "the seed of TestRandomScheduleOnKubernetes; 0: from the clock. The log names it.")
)

// replicaMargin is the replicas' Margin: Options' default, TTL/4.
const replicaMargin = replicaTTL / 4

// leaveLimit is the context a schedule's Leave gets: its bound.
const leaveLimit = 10 * time.Second

// The schedule picks each operation and pause from the seed, so a seed
// replays the same sequence of operations (their timing against the API
// server varies). A crash is a cut and a Close, which must return within
// TTL; a partition cuts a replica off until a heal; a Leave must return
// within its context. The log names the seed.
func TestRandomScheduleOnKubernetes(t *testing.T) {
	t.Parallel() // each in a group of its own; their waits overlap
	seed := *kubeScheduleSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (replay: go test -race -run TestRandomScheduleOnKubernetes -kube.seed=%d -kube.schedule=%v)", seed, seed, *kubeScheduleFor)
	rng := rand.New(rand.NewPCG(seed, 0x4b75))
	g := newKubeReplicas(t, 40)
	g.params = g.hostileParams
	for _, id := range []string{"r0", "r1", "r2"} {
		g.join(id)
	}
	partitioned := map[string]bool{}
	live := func(pred func(id string) bool) []string {
		var ids []string
		for id := range g.rs {
			if pred(id) {
				ids = append(ids, id)
			}
		}
		slices.Sort(ids)
		return ids
	}
	everyone := func(string) bool { return true }
	reachable := func(id string) bool { return !partitioned[id] }
	cutOff := func(id string) bool { return partitioned[id] }
	pick := func(ids []string) string { return ids[rng.IntN(len(ids))] }
	var slowest time.Duration
	took := func(what, id string, start time.Time, bound time.Duration) {
		d := time.Since(start)
		slowest = max(slowest, d)
		if d > bound+time.Second {
			t.Errorf("%s(%s) took %v, past its bound %v", what, id, d, bound)
		}
	}
	ops := map[string]int{}
	next := 3
	// The pauses alone add up to the schedule's duration, so the number of
	// steps depends on the seed only; the operations take time on top.
	for paused := time.Duration(0); paused < *kubeScheduleFor; {
		op := rng.IntN(5)
		if len(g.rs) < 2 {
			op = 3 // keep two replicas or more, so the end has names to spread
		}
		switch {
		case op == 0 && len(g.rs) >= 2:
			id := pick(live(everyone))
			delete(partitioned, id)
			g.cuts[id].off.Store(true)
			start := time.Now()
			if err := g.rs[id].Close(); err != nil {
				t.Logf("Close(%s) cut off: %v", id, err)
			}
			took("Close", id, start, replicaTTL)
			delete(g.rs, id)
			ops["crash"]++
		case op == 1 && len(live(reachable)) >= 2:
			id := pick(live(reachable))
			g.cuts[id].off.Store(true)
			partitioned[id] = true
			ops["partition"]++
		case op == 2 && len(live(cutOff)) > 0:
			id := pick(live(cutOff))
			g.cuts[id].off.Store(false)
			delete(partitioned, id)
			ops["heal"]++
		case op == 3 && len(g.rs) < 4:
			g.join(fmt.Sprintf("j%d", next))
			next++
			ops["join"]++
		case op == 4 && len(live(reachable)) >= 2:
			id := pick(live(reachable))
			ctx, cancel := context.WithTimeout(context.Background(), leaveLimit)
			start := time.Now()
			if err := g.rs[id].Leave(ctx); err != nil {
				t.Errorf("Leave(%s): %v", id, err)
			}
			cancel()
			took("Leave", id, start, leaveLimit)
			delete(g.rs, id)
			ops["leave"]++
		default:
			ops["pause"]++
		}
		pause := time.Duration(100+rng.IntN(1400)) * time.Millisecond
		time.Sleep(pause)
		paused += pause
	}
	for _, id := range live(cutOff) {
		g.cuts[id].off.Store(false)
	}
	for len(g.rs) < 3 { // the final check spreads names over three or more
		g.join(fmt.Sprintf("j%d", next))
		next++
	}
	ids := live(everyone)
	// Every replica left is a working member again (a lease, itself in
	// its view), then every name runs on one of them: names placed alone
	// can be a moment's state, while a replica cut off to the end still
	// runs the DoFuncs that go on past their cancellation.
	healed := time.Now()
	member := func(id string) bool {
		st := g.rs[id].Status()
		return st.Lease != "" && slices.ContainsFunc(st.Members, func(m ha.MemberStatus) bool { return m.ID == id })
	}
	for _, id := range ids {
		waitFor(t, replicaTTL+20*time.Second-time.Since(healed), id+" a working member after the last heal", func() bool { return member(id) })
	}
	g.waitPlaced("after the schedule", replicaTTL+20*time.Second, ids...)
	converged := time.Since(healed)
	t.Logf("schedule of %v (seed %d): %v; every name on one of %v %v after the last heal; slowest Close or Leave %v",
		*kubeScheduleFor, seed, ops, ids, converged, slowest)
	for _, id := range ids {
		st := g.rs[id].Status()
		if st.Lease == "" || !slices.ContainsFunc(st.Members, func(m ha.MemberStatus) bool { return m.ID == id }) {
			t.Errorf("%s ends the schedule with lease %q and members %v", id, st.Lease, st.Members)
		}
	}
}

// hostileParams are the schedule's controllers: most names are the
// recorder's; every fourth from the second has a DoFunc that goes on for
// 0.9 × Margin after its cancellation and a StopFunc that works as long;
// every fourth from the third has a DoFunc that looks at its context only
// every 0.9 × Margin; every fourth from the fourth has a DoFunc that, each
// time it starts, waits in RemoveControllerAndWait for the name after it
// and then registers that name again.
func (g *kubeReplicas) hostileParams(r *ha.Replica, id, name string) controller.ControllerParams {
	p := g.runs.params(id, name)
	linger := replicaMargin * 9 / 10
	switch slices.Index(g.names, name) % 4 {
	case 1:
		p = g.lingeringParams(id, name, linger) // all the time a StopFunc has
	case 2:
		p.DoFunc = func(ctx context.Context) error {
			g.runs.begin(id, name)
			for ctx.Err() == nil {
				time.Sleep(linger) // work that does not look at ctx meanwhile
			}
			g.runs.finish(name)
			return nil
		}
	case 3:
		other := g.names[(slices.Index(g.names, name)+1)%len(g.names)]
		p.DoFunc = func(ctx context.Context) error {
			g.runs.begin(id, name)
			if err := r.RemoveControllerAndWait(other); err == nil {
				_ = r.UpdateController(other, g.hostileParams(r, id, other))
			}
			<-ctx.Done()
			g.runs.finish(name)
			return nil
		}
	}
	return p
}

// lingeringParams are the recorder's controller of name on replica id,
// but its DoFunc goes on for 0.9 × Margin after its cancellation, and its
// StopFunc works for stopFor whatever its context says.
func (g *kubeReplicas) lingeringParams(id, name string, stopFor time.Duration) controller.ControllerParams {
	p := g.runs.params(id, name)
	p.DoFunc = func(ctx context.Context) error {
		g.runs.begin(id, name)
		<-ctx.Done()
		time.Sleep(replicaMargin * 9 / 10) // work past the cancellation, within the contract
		g.runs.finish(name)
		return nil
	}
	p.StopFunc = func(context.Context) error {
		g.runs.begin(id, name)
		time.Sleep(stopFor)
		g.runs.finish(name)
		return nil
	}
	return p
}
