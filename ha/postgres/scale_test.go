// Scale: three replicas of many names. Their steady state writes a
// renewal per replica per renewal period whatever the number of names; a
// crashed replica's share moves in as many write transactions, of as
// many statements, for a hundred names as for ten thousand; every name
// runs on exactly one replica, and a crashed replica's third runs
// elsewhere within its TTL and five seconds. 100,000 names on demand
// (-pg.scale).

package postgres

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bgctl/controller"
	"github.com/bgctl/controller/ha"
	"github.com/jackc/pgx/v5/pgxpool"
)

// pgScale runs the scale test at 100,000 names.
var pgScale = flag.Bool("pg.scale", false, "run TestScale100kNames: 100,000 names over three replicas (under a minute)")

// tally counts the replicas that run each name, through the job it
// gives each.
type tally struct {
	runners  []atomic.Int32 // by the name's index: the replicas running it now
	placed   atomic.Int64   // the names running on exactly one replica
	overlaps atomic.Int64   // the times a name started while running elsewhere
}

func newTally(n int) *tally { return &tally{runners: make([]atomic.Int32, n)} }

// job is name i's DoFunc: it counts itself running until its context
// ends.
func (c *tally) job(i int) controller.ControllerFunc {
	return func(ctx context.Context) error {
		switch c.runners[i].Add(1) {
		case 1:
			c.placed.Add(1)
		case 2:
			c.placed.Add(-1)
			c.overlaps.Add(1)
		default:
			c.overlaps.Add(1)
		}
		<-ctx.Done()
		switch c.runners[i].Add(-1) {
		case 0:
			c.placed.Add(-1)
		case 1:
			c.placed.Add(1)
		}
		return nil
	}
}

// scaleReplica is one replica of a scale run, on a pool of its own whose
// statements its tracer counts.
type scaleReplica struct {
	r  *ha.Replica
	tr *writeTracer
}

// scaleRun is n names over three replicas of one group, each with TTL.
type scaleRun struct {
	t        *testing.T
	n        int
	ttl      time.Duration
	group    string
	admin    *pgxpool.Pool // the test's own reads
	names    []string
	tally    *tally
	replicas []scaleReplica // r0, r1, r2
}

// renewEvery is the replicas' renewal period: (TTL − Margin)/4, the
// Margin a quarter of the TTL by default.
func (s *scaleRun) renewEvery() time.Duration { return (s.ttl - s.ttl/4) / 4 }

// startScale joins three replicas of n names with ttl, and waits until
// every name runs on exactly one of them.
func startScale(t *testing.T, n int, ttl time.Duration) *scaleRun {
	t.Helper()
	s := &scaleRun{t: t, n: n, ttl: ttl, group: newGroup("scale"), names: jobNames(n, "job-%06d"), admin: newPool(t, 2), tally: newTally(n)}
	for i := range 3 {
		tr := newWriteTracer("")
		r, err := ha.New(Store(newTracedPool(t, testServer.DSN, 8, tr), StoreOptions{}), ha.Options{
			Prefix: s.group,
			ID:     fmt.Sprintf("r%d", i),
			TTL:    ttl,
			// A List of 100,000 holdings takes longer on a busy
			// two-core machine than the default, (TTL − Margin)/2.
			RequestTimeout: ttl,
			ManagerOptions: []controller.Option{controller.WithSlog(slog.New(slog.DiscardHandler))},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.Close() })
		for j, name := range s.names {
			if err := r.UpdateController(name, controller.ControllerParams{DoFunc: s.tally.job(j)}); err != nil {
				t.Fatal(err)
			}
		}
		s.replicas = append(s.replicas, scaleReplica{r: r, tr: tr})
	}
	// The three join at once, as a service's replicas start: one that
	// joined alone would claim every name, and hand two thirds over to
	// the others name by name as they join (a release each).
	start := time.Now()
	var joins sync.WaitGroup
	errs := make([]error, len(s.replicas))
	for i, sr := range s.replicas {
		joins.Go(func() { // joined below
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			errs[i] = sr.r.Join(ctx)
		})
	}
	joins.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("joining the three replicas: %v", err)
	}
	within := 30*time.Second + time.Duration(n)*time.Millisecond
	logged := time.Now()
	await(t, within, fmt.Sprintf("%d names each on one of three replicas", n), func() bool {
		if time.Since(logged) > 10*time.Second {
			logged = time.Now()
			t.Logf("%d names: %d placed after %v; sent %v", n, s.tally.placed.Load(), time.Since(start).Round(time.Second), s.counts(0, 1, 2))
		}
		return s.tally.placed.Load() == int64(n)
	})
	t.Logf("%d names: every one on one replica %v after the Joins began", n, time.Since(start).Round(10*time.Millisecond))
	s.checkOverlaps()
	return s
}

// checkOverlaps fails the test when a name ever ran on two replicas at
// once.
func (s *scaleRun) checkOverlaps() {
	s.t.Helper()
	if o := s.tally.overlaps.Load(); o > 0 {
		s.t.Errorf("%d names: a name started on a replica while running on another, %d times", s.n, o)
	}
}

// counts sums the counts of replicas ids.
func (s *scaleRun) counts(ids ...int) writeCounts {
	var c writeCounts
	for _, i := range ids {
		c = c.add(s.replicas[i].tr.counts())
	}
	return c
}

// position reads the group's position.
func (s *scaleRun) position() int64 {
	s.t.Helper()
	var pos int64
	if err := s.admin.QueryRow(context.Background(), `SELECT pos FROM bgctl_ha.groups WHERE grp = $1`, s.group).Scan(&pos); err != nil {
		s.t.Fatal(err)
	}
	return pos
}

// steady waits until the replicas' writes settled (a renewal period and
// more with no write transaction but renewals), then counts what the
// three send over window, and how far the group's position moved.
func (s *scaleRun) steady(window time.Duration) (c writeCounts, moved int64) {
	s.t.Helper()
	quiet := 2 * s.renewEvery()
	last := s.counts(0, 1, 2)
	await(s.t, 30*time.Second, "the replicas' writes settled", func() bool {
		time.Sleep(quiet)
		now := s.counts(0, 1, 2)
		settled := now.WriteTxs == last.WriteTxs
		last = now
		return settled
	})
	before, pos := s.counts(0, 1, 2), s.position()
	time.Sleep(window) // the window counted: nothing to await but time
	return s.counts(0, 1, 2).sub(before), s.position() - pos
}

// crash closes r1 without Leave, as a crash leaves it, and waits until
// every name runs on r0 or r2, for TTL and slack at most; it returns how many names r1 ran, how
// long their move took, and what r0 and r2 sent meanwhile.
func (s *scaleRun) crash(slack time.Duration) (share int, took time.Duration, sent writeCounts) {
	s.t.Helper()
	for _, name := range s.names {
		if s.replicas[1].r.Running(name) {
			share++
		}
	}
	before := s.counts(0, 2)
	crashed := time.Now()
	if err := s.replicas[1].r.Close(); err != nil {
		s.t.Logf("r1's Close: %v", err)
	}
	await(s.t, s.ttl+slack, fmt.Sprintf("r1's %d names running on r0 and r2 after its crash", share), func() bool { return s.tally.placed.Load() == int64(s.n) })
	took, sent = time.Since(crashed), s.counts(0, 2).sub(before)
	on := 0
	for _, name := range s.names {
		for _, i := range []int{0, 2} {
			if s.replicas[i].r.Running(name) {
				on++
			}
		}
	}
	if on != s.n {
		s.t.Errorf("%d names: r0 and r2 run %d after r1's crash, want every name once", s.n, on)
	}
	s.checkOverlaps()
	return share, took, sent
}

// scaleFigures are what a scale run measured.
type scaleFigures struct {
	steady   writeCounts // sent by the three over the steady window
	moved    int64       // the group's position over the steady window
	share    int         // r1's names
	takeover time.Duration
	sent     writeCounts // by r0 and r2 from r1's crash until they ran its names
}

// checkScale runs n names over three replicas with ttl and checks what
// a user relies on: every name runs on exactly one replica, never on two
// at once; over a steady window of eight renewal periods the position
// stays and the three send a renewal each per renewal period (between
// half and twice as many, with the write transactions and rows
// written), whatever n; r1's crash moves its names to the others within
// TTL and slack, in as many write transactions as the end of its
// session and a claim per StoreOptions.ClaimNames names take.
func checkScale(t *testing.T, n int, ttl, slack time.Duration) scaleFigures {
	t.Helper()
	s := startScale(t, n, ttl)
	defer s.close()
	var f scaleFigures
	window := 8 * s.renewEvery()
	f.steady, f.moved = s.steady(window)
	t.Logf("%d names, a steady %v: %v; the position moved %d", n, window, f.steady, f.moved)
	want := 3 * float64(window) / float64(s.renewEvery()) // renewals
	if f.moved != 0 {
		t.Errorf("%d names: the group's position moved %d in a steady %v: a write logged a change", n, f.moved, window)
	}
	if w := float64(f.steady.Renewals + f.steady.WriteTxs); w < want/2 || w > 2*want {
		t.Errorf("%d names: %v renewals and write transactions in a steady %v, want %.0f (a renewal per replica per %v), within a factor of two", n, w, window, want, s.renewEvery())
	}
	if r := float64(f.steady.Rows); r > 2*want {
		t.Errorf("%d names: %v rows written in a steady %v, want at most %.0f (a renewal's row per replica per %v, twice)", n, r, window, 2*want, s.renewEvery())
	}
	f.share, f.takeover, f.sent = s.crash(slack)
	t.Logf("%d names: r1's %d ran on r0 and r2 %v after its crash; they sent meanwhile %v", n, f.share, f.takeover.Round(10*time.Millisecond), f.sent)
	// The session's end, carried out by the first of the survivors'
	// feeds and readings to find it due (the others find nothing, or
	// wait behind it), and each survivor's claims, of ClaimNames
	// names at most, an extra one for a batch cut short.
	claims := (f.share + defaultClaimNames - 1) / defaultClaimNames
	maxTxs := int64(8 + 2*claims)
	if f.sent.WriteTxs > maxTxs || f.sent.InWrites > 10*maxTxs {
		t.Errorf("%d names: r1's %d moved in %d write transactions of %d statements, want at most %d of 10 statements each", n, f.share, f.sent.WriteTxs, f.sent.InWrites, maxTxs)
	}
	return f
}

// The steady state writes no more for 10,000 names than for 100, and a
// crashed replica's third moves in as few statements: every write is
// set-based. 100,000 names: TestScale100kNames.
func TestScaleWritesDoNotGrowWithTheNames(t *testing.T) {
	small := checkScale(t, 100, 2*time.Second, 5*time.Second)
	large := checkScale(t, 10000, 2*time.Second, 5*time.Second)
	if large.steady.Rows > 2*small.steady.Rows+6 {
		t.Errorf("a steady state writes %d rows for 10,000 names and %d for 100, in the same window", large.steady.Rows, small.steady.Rows)
	}
	if large.sent.WriteTxs > small.sent.WriteTxs+4 || large.sent.InWrites > small.sent.InWrites+40 {
		t.Errorf("a crashed replica's %d names moved in %d write transactions of %d statements, its %d in %d of %d",
			large.share, large.sent.WriteTxs, large.sent.InWrites, small.share, small.sent.WriteTxs, small.sent.InWrites)
	}
}

// 100,000 names over three replicas: the checks of
// TestScaleWritesDoNotGrowWithTheNames, on demand (-pg.scale; under a
// minute). The crashed replica's 33,000 names move in a claim per 5000
// names, each taking the group's row in turn, and run elsewhere within
// TTL + 5 s of the crash (TTL + 2.2 to 4.1 s on two cores; DESIGN.md,
// "Measured", has the runs of a machine loaded past its cores too).
func TestScale100kNames(t *testing.T) {
	if !*pgScale {
		t.Log("100,000 names, under a minute, off by default; run it with: go test -count=1 -run TestScale100kNames -pg.scale -v .")
		return
	}
	checkScale(t, 100000, 5*time.Second, 5*time.Second)
}

// close closes the three replicas, as a crash does.
func (s *scaleRun) close() {
	for _, r := range s.replicas {
		_ = r.r.Close()
	}
}
