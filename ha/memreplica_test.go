// Whole replicas on the in-memory store (package sim), inside
// testing/synctest bubbles: the shared part reaches its store through the
// backend alone, and keeps its promises there on a clock that is exact.

package ha_test

import (
	"context"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/bgctl/controller/ha"
	"github.com/bgctl/controller/ha/internal/place"
	"github.com/bgctl/controller/ha/internal/runlog"
	"github.com/bgctl/controller/ha/sim"
	"github.com/sirupsen/logrus"
)

// memGroup is replicas of one group on one sim.Store, in one bubble,
// sharing a recorder. Used by the test's goroutine alone.
type memGroup struct {
	t     *testing.T
	st    *sim.Store
	rec   *runlog.Recorder
	opts  ha.Options
	names []string
	rs    map[string]*ha.Replica // the replicas not stopped yet, by ID
	store ha.Store               // the replicas' store: st, unless set before the first replica
}

// newMemGroup makes a group of names names ("n-0" …) on a new store, with
// a TTL of 2s, a Margin of 500ms, and no replica yet.
func newMemGroup(t *testing.T, names int) *memGroup {
	opts := ha.Options{TTL: 2 * time.Second, Margin: 500 * time.Millisecond, Logger: discardLogger()}
	opts.Prefix, opts.ID = "/mem", "r"
	opts, err := ha.Normalize(opts) // for the defaults the bounds use
	if err != nil {
		t.Fatal(err)
	}
	st := &sim.Store{}
	return &memGroup{t: t, st: st, rec: runlog.New(), opts: opts, names: runlog.Names("n", names), rs: map[string]*ha.Replica{}, store: st}
}

// runMemGroup runs f in a synctest bubble, on a new group of names names
// (newMemGroup); then, whether f passed or failed, it closes every
// replica left and checks that no name ever ran on two replicas at once.
func runMemGroup(t *testing.T, names int, f func(t *testing.T, g *memGroup)) {
	synctest.Test(t, func(t *testing.T) {
		g := newMemGroup(t, names)
		defer g.rec.AssertNoOverlap(t)
		defer g.closeAll()
		f(t, g)
	})
}

// newReplica makes replica id on the store, with every name registered,
// and does not join it.
func (g *memGroup) newReplica(id string) *ha.Replica {
	opts := g.opts
	opts.ID = id
	r, err := ha.New(g.store, opts)
	if err != nil {
		g.t.Errorf("newReplica(%s): %v", id, err)
		return nil
	}
	for _, name := range g.names {
		if err := r.UpdateController(name, g.rec.Params(id, name)); err != nil {
			g.t.Errorf("UpdateController(%s, %s): %v", id, name, err)
		}
	}
	return r
}

// join makes replica id, as newReplica does, and joins it.
func (g *memGroup) join(id string) *ha.Replica {
	g.t.Helper()
	r := g.newReplica(id)
	if r == nil {
		g.t.FailNow()
	}
	if err := r.Join(context.Background()); err != nil {
		g.t.Fatalf("Join(%s): %v", id, err)
	}
	g.rs[id] = r
	return r
}

// joinThree joins r0, r1 and r2, one after the other, waits until every
// name runs where Spread puts it over them, and returns that placement
// and how long it took.
func (g *memGroup) joinThree() (map[string]string, time.Duration) {
	g.t.Helper()
	for _, id := range []string{"r0", "r1", "r2"} {
		g.join(id)
	}
	want := g.want("r0", "r1", "r2")
	return want, g.waitPlacement(want, 10*time.Second)
}

// want returns where Spread puts every name over members.
func (g *memGroup) want(members ...string) map[string]string {
	regs := map[string][]string{}
	for _, id := range members {
		regs[id] = g.names
	}
	return place.Expected(regs)
}

// waitPlacement waits until every name runs where want says, on the
// bubble's clock, and returns how long that took; it fails the test
// after limit.
func (g *memGroup) waitPlacement(want map[string]string, limit time.Duration) time.Duration {
	g.t.Helper()
	start := time.Now()
	for g.rec.Misplaced(want) != 0 {
		if time.Since(start) > limit {
			g.t.Fatalf("after %v, %d of %d names do not run where expected", limit, g.rec.Misplaced(want), len(want))
		}
		time.Sleep(time.Millisecond)
	}
	return time.Since(start)
}

// closeAll closes every replica left, so that the bubble's goroutines
// end.
func (g *memGroup) closeAll() {
	for id, r := range g.rs {
		if err := r.Close(); err != nil {
			g.t.Errorf("Close(%s): %v", id, err)
		}
		delete(g.rs, id)
	}
}

// expiry returns when the session of member id runs out unless renewed,
// as the store has it, since the recorder's base; it fails the test when
// the member has no record or its session has ended.
func (g *memGroup) expiry(id string) time.Duration {
	g.t.Helper()
	at, ok := g.st.Expires(id)
	if !ok {
		g.t.Fatalf("%s has no member record, or its session has ended", id)
	}
	return at.Sub(g.rec.Base())
}

// ended checks the sessions the store has ended, in order, against want
// ("<member> <session> expired|ended").
func (g *memGroup) ended(want ...string) {
	g.t.Helper()
	var ended []string
	for _, e := range g.st.Ended() {
		ended = append(ended, e.String())
	}
	if !slices.Equal(ended, want) {
		g.t.Errorf("the store ended sessions %q, want %q", ended, want)
	}
}

// handedOver checks the handover of names from replica to the others
// after since: that replica's last run ended by notAfter, and that the
// first run elsewhere began no earlier than from and no later than to.
func (g *memGroup) handedOver(replica string, names []string, since, notAfter, from, to time.Duration) {
	g.t.Helper()
	lastEnd, firstOther := g.rec.Handover(replica, names, since)
	g.t.Logf("%s: last run here ended at %v (bound %v), first elsewhere began at %v (within [%v, %v])", replica, lastEnd, notAfter, firstOther, from, to)
	if lastEnd > notAfter {
		g.t.Errorf("%s's names ran there until %v, past %v", replica, lastEnd, notAfter)
	}
	if firstOther < from || firstOther > to {
		g.t.Errorf("%s's names first ran elsewhere at %v, outside [%v, %v]", replica, firstOther, from, to)
	}
}

// prompt bounds, on the bubble's clock, what the replicas do at once: a
// StopFunc, a claim, a few renewals' worth of calls.
const prompt = 50 * time.Millisecond

// TestMemReplicasSpreadCrashAndLeave runs three replicas on the memory
// store: every name runs on the replica Spread puts it on, and on no
// other, once the first epoch settled; a replica closed without leaving
// (a crash, to the store: its session is left to expire) stops its names
// at once, and the others run them once its session ran out, not before,
// and within a renewal period after; a Leave hands its names over at
// once; and no name ever runs on two replicas at once.
func TestMemReplicasSpreadCrashAndLeave(t *testing.T) {
	runMemGroup(t, 30, func(t *testing.T, g *memGroup) {
		three, took := g.joinThree()
		if took > g.opts.Settle+prompt {
			t.Errorf("spread over three in %v, past Settle %v and %v", took, g.opts.Settle, prompt)
		}

		moved := place.On(three, "r1")
		crashed := g.rec.Now()
		if err := g.rs["r1"].Close(); err != nil {
			t.Fatalf("Close(r1): %v", err)
		}
		delete(g.rs, "r1")
		expires := g.expiry("r1")
		g.waitPlacement(g.want("r0", "r2"), 10*time.Second)
		g.handedOver("r1", moved, crashed, crashed+prompt, expires, expires+ha.KeepAliveEvery(g.opts)+prompt)

		moved = place.On(g.want("r0", "r2"), "r0")
		left := g.rec.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := g.rs["r0"].Leave(ctx); err != nil {
			t.Fatalf("Leave(r0): %v", err)
		}
		delete(g.rs, "r0")
		g.waitPlacement(g.want("r2"), 10*time.Second)
		g.handedOver("r0", moved, left, left+prompt, left, left+prompt)
		g.ended("r1 2 expired", "r0 1 ended")
	})
}

// TestMemReplicaRestartedUnderItsIDWaitsForItsEarlierSession crashes one
// of three replicas (closed without leaving: its session is left to
// expire) and starts it again under its ID at once, as a container
// restarted in its pod would be: Join waits for the earlier run's session
// to run out, then joins, within a poll of it, and the restarted replica
// gets its share back; no name ever runs on two replicas at once.
func TestMemReplicaRestartedUnderItsIDWaitsForItsEarlierSession(t *testing.T) {
	runMemGroup(t, 30, func(t *testing.T, g *memGroup) {
		three, _ := g.joinThree()
		expires := g.expiry("r1")
		if err := g.rs["r1"].Close(); err != nil {
			t.Fatalf("Close(r1): %v", err)
		}
		delete(g.rs, "r1")
		g.join("r1") // the restart: the same ID, at once
		joined := g.rec.Now()
		t.Logf("the earlier run's session ran out at %v; the restarted r1 joined at %v", expires, joined)
		if joined < expires || joined > expires+ha.RestartPoll+prompt {
			t.Errorf("the restarted r1 joined at %v; want once the earlier run's session ran out, at %v, within a poll (%v)", joined, expires, ha.RestartPoll)
		}
		g.waitPlacement(three, 10*time.Second)
		g.ended("r1 2 expired")
	})
}

// TestMemReplicaPartitioned cuts one of three replicas off from the
// store while its controllers run: its fence stops them before its
// session expires, the others run its names only once it has, and when
// the cut heals it joins again and gets its share back, within a pause
// between attempts and a request timeout (an attempt in flight at the
// heal was dropped, and waits for its timeout); no name ever runs on two
// replicas at once.
func TestMemReplicaPartitioned(t *testing.T) {
	runMemGroup(t, 30, func(t *testing.T, g *memGroup) {
		three, _ := g.joinThree()

		moved := place.On(three, "r1")
		cut := g.rec.Now()
		g.st.Partition("r1")
		expires := g.expiry("r1")
		g.waitPlacement(g.want("r0", "r2"), 10*time.Second)
		g.handedOver("r1", moved, cut, expires-g.opts.Margin, expires, expires+ha.KeepAliveEvery(g.opts)+prompt)

		g.ended("r1 2 expired")

		g.st.Heal("r1")
		pause := ha.RejoinWait(time.Hour, nil, g.opts.TTL) // the longest between r1's attempts to join again
		if took, bound := g.waitPlacement(three, 10*time.Second), pause+g.opts.RequestTimeout+prompt; took > bound {
			t.Errorf("healed: r1 had its share again after %v, past %v", took, bound)
		}
	})
}

// TestMemReplicasJoinTogetherUnsettled joins three replicas at the same
// moment without settling, in several rounds, each on a new store: each
// replica claims what its first view gives it, the first alone every
// name, so their claims meet in the store, which lets one hold each name
// (in about half the rounds, as the bubble orders the joins); the names
// then move to the replica Spread puts them on, and none ever runs on two
// replicas at once.
func TestMemReplicasJoinTogetherUnsettled(t *testing.T) {
	const rounds = 8
	for round := range rounds {
		runMemGroup(t, 300, func(t *testing.T, g *memGroup) {
			g.opts.Settle = -1
			ids := []string{"r0", "r1", "r2"}
			rs := make([]*ha.Replica, len(ids))
			var wg sync.WaitGroup
			for i, id := range ids {
				wg.Add(1)
				go func() { // joined below
					defer wg.Done()
					rs[i] = g.newReplica(id)
					if rs[i] == nil {
						return
					}
					if err := rs[i].Join(context.Background()); err != nil {
						t.Errorf("Join(%s): %v", id, err)
					}
				}()
			}
			wg.Wait()
			for i, id := range ids {
				if rs[i] != nil {
					g.rs[id] = rs[i]
				}
			}
			if t.Failed() {
				return
			}
			took := g.waitPlacement(g.want(ids...), 10*time.Second)
			if took > prompt {
				t.Errorf("round %d: spread over three in %v, past %v", round, took, prompt)
			}
		})
	}
}

// A replica sends the names it finds to claim in Claims as large as its
// backend takes: on a store whose Claim costs a write per bucket touched
// (Kubernetes), a Claim sent for each few names as they are found would
// cost as many writes as a full one each.
func TestMemReplicaClaimsInBatchesAsLargeAsTheBackendTakes(t *testing.T) {
	runMemGroup(t, 2000, func(t *testing.T, g *memGroup) {
		g.st.ClaimLimit = 1000
		g.join("r0")
		g.waitPlacement(g.want("r0"), 10*time.Second)
		if calls := g.st.Requests(sim.OpClaim); calls != 2 {
			t.Errorf("2000 names claimed in %d Claims of at most 1000 names; want 2", calls)
		}
	})
}

// A store that takes fewer names in one Claim than its backend declares
// refuses the first batches; the replica halves them until they pass, and
// every name queued while the loop's step filled the batches is claimed,
// the step's last, short batch included.
func TestMemReplicaClaimsEveryNameWhenTheStoreTakesFewerThanDeclared(t *testing.T) {
	runMemGroup(t, 2003, func(t *testing.T, g *memGroup) {
		g.st.ClaimLimit, g.st.RefuseAbove = 1000, 300
		g.join("r0")
		g.waitPlacement(g.want("r0"), 10*time.Second)
		g.join("r1")
		g.waitPlacement(g.want("r0", "r1"), 10*time.Second)
	})
}

// discardLogger returns a logger that writes nothing.
func discardLogger() logrus.FieldLogger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}

// TestNamesNoStoreCanHoldAreRefused registers, beside a group's names,
// names no store keeps as text (invalid UTF-8, a NUL byte): each is
// refused by UpdateController, naming it, where the mistake is made, and
// the group's names run as before, none held up by a claim its store
// refused.
func TestNamesNoStoreCanHoldAreRefused(t *testing.T) {
	runMemGroup(t, 6, func(t *testing.T, g *memGroup) {
		r := g.join("r0")
		for _, bad := range []string{"bad-\xff", "a\x00b"} {
			err := r.UpdateController(bad, g.rec.Params("r0", bad))
			if err == nil || !strings.Contains(err.Error(), strconv.Quote(bad)) {
				t.Errorf("UpdateController(%q) = %v; want an error naming it", bad, err)
			}
		}
		g.waitPlacement(g.want("r0"), 10*time.Second)
	})
}
