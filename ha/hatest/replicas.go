// The case of whole replicas on the store: what a service's replicas do
// on it, spread, an early end, a Leave and a crash, with every DoFunc and StopFunc
// recorded and none allowed to overlap another of its name.

package hatest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/bgctl/controller"
	"github.com/bgctl/controller/ha"
	"github.com/bgctl/controller/ha/sim"
	"github.com/sirupsen/logrus"
)

// replicaNames is how many names the whole replicas share.
const replicaNames = 12

// quiet is the whole replicas' logger: Warn and above, to the test's
// standard error, where go test shows it when the test fails.
var quiet = func() logrus.FieldLogger {
	l := logrus.New()
	l.SetLevel(logrus.WarnLevel)
	return l
}()

// Three replicas on the store spread the group's names, each running on
// one of them; a session ended early (EndEarly, when the Group offers
// it) has every name of its replica run again, once the fence stopped
// the ended session's runs, and the replica join again and get its
// share back; a Leave hands the leaver's names to the other two; a
// crash (Close without Leave: its session left to end as a crashed
// process's does) has its names run on the last one once that session
// ended; and no name's DoFunc or StopFunc ever begins while another call
// of that name runs, on any replica.
func conformWholeReplicas(t *testing.T, st Group) {
	if st.NewReplica == nil {
		t.Skip("the Group offers no NewReplica: whole replicas on the store are not tested")
	}
	ctx := context.Background()
	var rec sim.Recorder
	names := make([]string, replicaNames)
	for i := range names {
		names[i] = fmt.Sprintf("whole-%02d", i)
	}
	rs := map[string]*ha.Replica{}
	defer func() {
		for _, r := range rs {
			_ = r.Close()
		}
		for _, o := range rec.Overlaps() {
			t.Errorf("ran twice at once: %v", o)
		}
	}()
	for _, id := range []string{"r0", "r1", "r2"} {
		r, err := st.NewReplica(id, ha.Options{TTL: TTL, Margin: TTL / 4, Settle: TTL / 4, Logger: quiet})
		if err != nil {
			t.Fatalf("the replica %s: %v", id, err)
		}
		c := rec.Controllers(r)
		for _, n := range names {
			err := c.UpdateController(n, controller.ControllerParams{
				DoFunc:   func(ctx context.Context) error { <-ctx.Done(); return nil },
				StopFunc: func(context.Context) error { return nil },
			})
			if err != nil {
				t.Fatal(err)
			}
		}
		if err := r.Join(ctx); err != nil {
			t.Fatalf("Join(%s): %v", id, err)
		}
		rs[id] = r
	}
	placed := func(what string, on ...string) {
		t.Helper()
		deadline := time.Now().Add(10 * TTL)
		for {
			where, misplaced := map[string][]string{}, 0
			for _, n := range names {
				for _, id := range on {
					if rs[id].Running(n) {
						where[n] = append(where[n], id)
					}
				}
				if len(where[n]) != 1 {
					misplaced++
				}
			}
			if misplaced == 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: after %v, %d of %d names do not run on exactly one of %v: %v", what, 10*TTL, misplaced, len(names), on, where)
			}
			time.Sleep(TTL / 20)
		}
	}
	placed("three replicas joined", "r0", "r1", "r2")
	if st.EndEarly != nil {
		// Its fence stops its names; they run elsewhere only once its
		// own code has returned, and it joins again and gets them back.
		var held []string
		for _, n := range names {
			if rs["r2"].Running(n) {
				held = append(held, n)
			}
		}
		ended := time.Now()
		st.EndEarly("r2")
		// Each of its names ran again, here or elsewhere, after the end:
		// the fence stopped the run of the ended session (the Recorder
		// fails the case if the new one began first).
		for deadline := time.Now().Add(5 * TTL); ; time.Sleep(TTL / 20) {
			again := 0
			for _, n := range held {
				for _, run := range rec.Runs(n) {
					if !run.Stop && !run.Start.Before(ended) {
						again++
						break
					}
				}
			}
			if again == len(held) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d of r2's %d names did not run again in the %v after its session ended early", len(held)-again, len(held), 5*TTL)
			}
		}
		placed("r2's session ended early, and r2 joined again", "r0", "r1", "r2")
	}
	lctx, cancel := context.WithTimeout(ctx, 5*TTL)
	defer cancel()
	if err := rs["r0"].Leave(lctx); err != nil {
		t.Fatalf("Leave(r0): %v", err)
	}
	delete(rs, "r0")
	placed("r0 left", "r1", "r2")
	_ = rs["r1"].Close() // a crash, to the store: its session is left to end
	delete(rs, "r1")
	placed("r1 crashed", "r2")
}
