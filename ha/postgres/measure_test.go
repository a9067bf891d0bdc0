// Measured beside what users run today, on demand (-pg.measure): how
// long a replica's names take to run elsewhere after its process is
// killed, partitioned from the server, frozen, or leaves, on this store
// and on pg_try_advisory_lock(hashtext(name)) per name, at TTL 5 s and
// 15 s; and what this store writes per second at 1,000 and 100,000
// names. DESIGN.md's "Measured" quotes the table it prints.

package postgres

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/bgctl/controller"
	"github.com/bgctl/controller/ha"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// pgMeasure runs TestMeasureBesideAdvisoryLocks.
var pgMeasure = flag.Bool("pg.measure", false, "run TestMeasureBesideAdvisoryLocks: takeovers and writes, this store beside advisory locks (about seven minutes; four with -parallel 16)")

// The measured child's settings, in its environment: the test binary
// runs as a holder of measureNames (runMeasureChild) when measureKind is
// set.
const (
	measureKind  = "HA_POSTGRES_MEASURE_KIND" // "store" or "advisory"
	measureDSN   = "HA_POSTGRES_MEASURE_DSN"
	measureGroup = "HA_POSTGRES_MEASURE_GROUP"
	measureTTL   = "HA_POSTGRES_MEASURE_TTL"
)

// measureNames are the names the child holds when an event hits it.
var measureNames = jobNames(10, "job-%02d")

// measureWait is how long a takeover is waited for before it is
// reported as not seen.
const measureWait = 60 * time.Second

// advisoryPoll is how often the advisory-lock holders try the names they
// lack: the store's renewal period at the same TTL, so that both send a
// request as often.
func advisoryPoll(ttl time.Duration) time.Duration { return (ttl - ttl/4) / 4 }

// runMeasureChild is the child: it holds measureNames by the kind its
// environment names, printing "running <name>" as each starts, until
// SIGTERM, on which it leaves (Leave; or closes its connection, which
// unlocks its advisory locks), prints "left" and exits.
func runMeasureChild() int {
	ttl, err := time.ParseDuration(os.Getenv(measureTTL))
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	var mu sync.Mutex // serializes the lines
	say := func(line string) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Println(line)
	}
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	ctx := context.Background()
	if os.Getenv(measureKind) == "advisory" {
		conn, err := pgx.Connect(ctx, os.Getenv(measureDSN))
		if err != nil {
			fmt.Println("error", err)
			return 1
		}
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() { // joined below, by <-done
			defer close(done)
			advisoryLoop(conn, os.Getenv(measureGroup), advisoryPoll(ttl), func(name string, _ time.Time) { say("running " + name) }, func() {}, stop)
		}()
		<-term
		close(stop)
		<-done
		_ = conn.Close(ctx) // the server unlocks every lock of the connection
		say("left")
		return 0
	}
	pool, err := pgxpool.New(ctx, os.Getenv(measureDSN))
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	r, err := ha.New(Store(pool, StoreOptions{}), leaderOptions(os.Getenv(measureGroup), "child", ttl))
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	for _, name := range measureNames {
		_ = r.UpdateController(name, controller.ControllerParams{DoFunc: func(ctx context.Context) error {
			say("running " + name)
			<-ctx.Done()
			return nil
		}})
	}
	if err := r.Join(ctx); err != nil {
		fmt.Println("error", err)
		return 1
	}
	<-term
	if err := r.Leave(ctx); err != nil {
		fmt.Println("error", err)
		return 1
	}
	say("left")
	return 0
}

// advisoryLoop is the pattern users write by hand: every poll, on its
// one connection, it tries pg_try_advisory_lock(hashtext(name)) for each
// name it lacks (the name prefixed by group/, so that the tests' groups
// never share a lock), and reports each it got to started (the job runs
// while the connection holds the lock), and each round done to round;
// until stop is closed. A request that fails is tried at the next poll.
func advisoryLoop(conn *pgx.Conn, group string, poll time.Duration, started func(name string, at time.Time), round func(), stop <-chan struct{}) {
	held := map[string]bool{}
	for {
		for _, name := range measureNames {
			if held[name] {
				continue
			}
			var got bool
			ctx, cancel := context.WithTimeout(context.Background(), poll)
			err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock(hashtext($1))`, group+"/"+name).Scan(&got)
			cancel()
			if err == nil && got {
				held[name] = true
				started(name, time.Now())
			}
		}
		round()
		select {
		case <-time.After(poll):
		case <-stop:
			return
		}
	}
}

// firstRuns records when each name first started on the replica that
// waits.
type firstRuns struct {
	mu     sync.Mutex
	first  map[string]time.Time // guarded by mu
	rounds int                  // guarded by mu: the advisory waiter's rounds of tries done
}

// round counts a round of the advisory waiter's tries.
func (f *firstRuns) round() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rounds++
}

func (f *firstRuns) start(name string, at time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.first[name]; !ok {
		f.first[name] = at
	}
}

// all returns how long after event the last of the names started, once
// every one has; false until then.
func (f *firstRuns) all(event time.Time) (time.Duration, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.first) < len(measureNames) {
		return 0, false
	}
	var last time.Duration
	for _, at := range f.first {
		last = max(last, at.Sub(event))
	}
	return last, true
}

// count returns how many names started.
func (f *firstRuns) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.first)
}

// waiter starts the replica that waits for the child's names, of kind,
// connected straight to the server, and returns once it is watching:
// joined, and seeing the child as a member (the store), or done with a
// first round of tries (advisory locks). The test's cleanup stops it.
func waiter(t *testing.T, kind, group string, ttl time.Duration) *firstRuns {
	t.Helper()
	runs := &firstRuns{first: map[string]time.Time{}}
	if kind == "advisory" {
		conn, err := pgx.Connect(context.Background(), testServer.DSN)
		if err != nil {
			t.Fatal(err)
		}
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() { // joined by the cleanup, by <-done
			defer close(done)
			advisoryLoop(conn, group, advisoryPoll(ttl), runs.start, runs.round, stop)
		}()
		t.Cleanup(func() {
			close(stop)
			<-done
			_ = conn.Close(context.Background())
		})
		await(t, 10*time.Second, "the waiter's first round of tries", func() bool {
			runs.mu.Lock()
			defer runs.mu.Unlock()
			return runs.rounds > 0
		})
		return runs
	}
	r, err := ha.New(Store(newPool(t, 4), StoreOptions{}), leaderOptions(group, "waiter", ttl))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	for _, name := range measureNames {
		_ = r.UpdateController(name, controller.ControllerParams{DoFunc: func(ctx context.Context) error {
			runs.start(name, time.Now())
			<-ctx.Done()
			return nil
		}})
	}
	if err := r.Join(context.Background()); err != nil {
		t.Fatal(err)
	}
	await(t, 10*time.Second, "the waiter seeing the child", func() bool {
		return slices.ContainsFunc(r.Status().Members, func(m ha.MemberStatus) bool { return m.ID == "child" })
	})
	return runs
}

// takeover is one measured takeover: the event, and how long after it
// the waiter ran every name, or seen false when not within measureWait.
type takeover struct {
	kind, event string
	ttl         time.Duration
	took        time.Duration
	seen        bool
}

// measureTakeover starts a child of kind holding measureNames through a
// black hole (proxy_test.go), a waiter, hits the child with event, and times the
// waiter's taking every name over.
func measureTakeover(t *testing.T, kind, event string, ttl time.Duration) takeover {
	t.Helper()
	group := newGroup("measure-" + kind + "-" + event)
	proxy := newBlackHole(t, "127.0.0.1:"+strconv.Itoa(testServer.Port))
	dsn := proxy.dsn()
	child := startChild(t, measureKind+"="+kind, measureDSN+"="+dsn, measureGroup+"="+group, measureTTL+"="+ttl.String())
	running := map[string]bool{}
	timeout := time.After(30 * time.Second)
	for len(running) < len(measureNames) {
		select {
		case l := <-child.lines:
			if name, ok := strings.CutPrefix(l, "running "); ok {
				running[name] = true
			} else {
				t.Logf("child: %s", l)
			}
		case <-timeout:
			t.Fatalf("%s: the child ran %d of %d names in 30s", kind, len(running), len(measureNames))
		}
	}
	runs := waiter(t, kind, group, ttl)
	if n := runs.count(); n > 0 {
		t.Fatalf("%s: the waiter ran %d names while the child held them", kind, n)
	}
	at := time.Now()
	var err error
	switch event {
	case "SIGKILL":
		err = child.cmd.Process.Kill()
	case "partition":
		proxy.cut()
	case "SIGSTOP":
		err = child.cmd.Process.Signal(syscall.SIGSTOP)
	case "leave":
		err = child.cmd.Process.Signal(syscall.SIGTERM)
	}
	if err != nil {
		t.Fatal(err)
	}
	m := takeover{kind: kind, event: event, ttl: ttl}
	deadline := at.Add(measureWait)
	for time.Now().Before(deadline) && !m.seen {
		m.took, m.seen = runs.all(at)
		time.Sleep(10 * time.Millisecond)
	}
	if event == "SIGSTOP" {
		_ = child.cmd.Process.Signal(syscall.SIGCONT) // killed by the cleanup
	}
	return m
}

// String is the takeover's cell: the time, that it was not seen, or "–"
// when it was not run (a -run filter).
func (m takeover) String() string {
	switch {
	case m.kind == "":
		return "–"
	case !m.seen:
		return fmt.Sprintf("not within %v", measureWait)
	}
	return m.took.Round(10 * time.Millisecond).String()
}

// TestMeasureBesideAdvisoryLocks prints the table of DESIGN.md's
// "Measured": this store's takeovers beside pg_try_advisory_lock's, and
// its steady writes.
func TestMeasureBesideAdvisoryLocks(t *testing.T) {
	if !*pgMeasure {
		t.Log("a measurement of about 5 minutes, off by default; run it with: go test -run TestMeasureBesideAdvisoryLocks -pg.measure -parallel 16 -v -timeout 30m .")
		return
	}
	ttls := []time.Duration{5 * time.Second, 15 * time.Second}
	events := []string{"SIGKILL", "partition", "SIGSTOP", "leave"}
	kinds := []string{"store", "advisory"}
	var mu sync.Mutex
	got := map[string]takeover{}
	t.Run("takeovers", func(t *testing.T) {
		for _, ttl := range ttls {
			for _, kind := range kinds {
				for _, event := range events {
					t.Run(fmt.Sprintf("%s/%v/%s", kind, ttl, event), func(t *testing.T) {
						t.Parallel() // most of each is waiting
						m := measureTakeover(t, kind, event, ttl)
						t.Logf("%s, TTL %v, %s: %v", kind, ttl, event, m)
						mu.Lock()
						defer mu.Unlock()
						got[fmt.Sprint(kind, ttl, event)] = m
					})
				}
			}
		}
	})
	var rows []string // of the writes' table
	t.Run("writes", func(t *testing.T) {
		for _, ttl := range ttls {
			for _, n := range []int{1000, 100000} {
				s := startScale(t, n, ttl)
				window := 4 * ttl
				c, moved := s.steady(window)
				s.close()
				if moved != 0 {
					t.Errorf("%d names, TTL %v: the group's position moved %d in a steady %v", n, ttl, moved, window)
				}
				per := func(k int64) string { return strconv.FormatFloat(float64(k)/window.Seconds(), 'f', 1, 64) }
				rows = append(rows, fmt.Sprintf("| %d names, TTL %v | %s | %s | %s | %.1f |\n", n, ttl, per(c.Renewals+c.WriteTxs), per(c.Rows), per(c.Statements), 3/s.renewEvery().Seconds()))
			}
		}
	})
	var b strings.Builder
	if len(got) > 0 {
		fmt.Fprintf(&b, "\n| time until the other replica runs every name of one that was … | this store, TTL 5s | advisory locks, poll %v | this store, TTL 15s | advisory locks, poll %v |\n|---|---|---|---|---|\n", advisoryPoll(ttls[0]), advisoryPoll(ttls[1]))
		for _, event := range events {
			fmt.Fprintf(&b, "| %s |", event)
			for _, ttl := range ttls {
				for _, kind := range kinds {
					fmt.Fprintf(&b, " %v |", got[fmt.Sprint(kind, ttl, event)])
				}
			}
			b.WriteString("\n")
		}
	}
	if len(rows) > 0 {
		b.WriteString("\n| this store's writes, three replicas, steady | renewals and write transactions per second | rows written per second | statements per second (reads included) | expected renewals per second |\n|---|---|---|---|---|\n")
		b.WriteString(strings.Join(rows, ""))
	}
	t.Log(b.String())
}
