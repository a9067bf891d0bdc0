// A replica in a process of its own, frozen (SIGSTOP) past its TTL while
// another takes its names over: woken, its DoFunc, which ignores its
// context, finds Held refused and writes nothing after the new holder's
// first write.

package postgres

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
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

// The child process's settings, in its environment: the test binary runs
// as a replica (runChild) when childDSN is set.
const (
	childDSN   = "HA_POSTGRES_CHILD_DSN"
	childGroup = "HA_POSTGRES_CHILD_GROUP"
	childTable = "HA_POSTGRES_CHILD_TABLE"
)

// pausedTTL is the TTL of the replicas of the paused test.
const pausedTTL = time.Second

// pausedNames are the names of the paused test's service.
var pausedNames = []string{"a", "b", "c"}

// fencedLoop is a hostile DoFunc: it writes a row of its name as writer
// every 50ms under Held, ignoring its context, until Held refuses it,
// which it reports to refused, or stop is closed (the test's end).
func fencedLoop(pool *pgxpool.Pool, table, writer string, refused func(name string), stop <-chan struct{}) controller.ControllerFunc {
	return func(ctx context.Context) error {
		claim, _ := ha.ClaimFrom(ctx)
		for {
			err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
				if err := Held(context.Background(), tx, claim); err != nil {
					return err
				}
				_, err := tx.Exec(context.Background(), "INSERT INTO "+table+" (name, writer) VALUES ($1, $2)", claim.Name, writer)
				return err
			})
			if errors.Is(err, ErrNotHeld) {
				refused(claim.Name)
				return nil
			}
			select {
			case <-time.After(50 * time.Millisecond):
			case <-stop:
				return nil
			}
		}
	}
}

// pausedOptions are the replicas' options: Leader mode, so that the
// frozen replica, once it rejoins, never gets a name back from the
// senior one.
func pausedOptions(group, id string) ha.Options { return leaderOptions(group, id, pausedTTL) }

// leaderOptions are the options of replica id of group with ttl in
// Leader mode: the senior replica runs every name, the others wait. Each
// request may take half a TTL (the default, a quarter of it less a
// Margin, is 375ms at a TTL of 1s: a Join on a loaded machine of two
// cores was seen failing on it), so that what a test times is the fault
// it makes.
func leaderOptions(group, id string, ttl time.Duration) ha.Options {
	return ha.Options{
		Prefix:         group,
		ID:             id,
		TTL:            ttl,
		RequestTimeout: ttl / 2,
		Mode:           ha.Leader,
		ManagerOptions: []controller.Option{controller.WithSlog(slog.New(slog.DiscardHandler))},
	}
}

// runChild is the child process: a replica that runs pausedNames with
// fencedLoop as writer "child", printing "refused <name>" for each
// refusal, until it is killed.
func runChild() int {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv(childDSN))
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	r, err := ha.New(Store(pool, StoreOptions{}), pausedOptions(os.Getenv(childGroup), "child"))
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	var mu sync.Mutex // serializes the lines
	refused := func(name string) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Println("refused", name)
	}
	for _, name := range pausedNames {
		_ = r.UpdateController(name, controller.ControllerParams{DoFunc: fencedLoop(pool, os.Getenv(childTable), "child", refused, nil)})
	}
	if err := r.Join(ctx); err != nil {
		fmt.Println("error", err)
		return 1
	}
	select {} // until killed
}

// newWriteTable makes the user table of group's fenced writes, and
// returns its name and ids, which reads agg (min or max) of the ids of
// writer's rows, by name: the ids are taken at the insert, in the order
// of the writes.
func newWriteTable(t *testing.T, pool *pgxpool.Pool, group string) (table string, ids func(agg, writer string) map[string]int64) {
	t.Helper()
	ctx := context.Background()
	table = pgx.Identifier{"public", strings.ReplaceAll(group, "-", "_")}.Sanitize()
	if _, err := pool.Exec(ctx, "CREATE TABLE "+table+" (id bigserial, name text, writer text)"); err != nil {
		t.Fatal(err)
	}
	return table, func(agg, writer string) map[string]int64 {
		t.Helper()
		out := map[string]int64{}
		r, err := pool.Query(ctx, "SELECT name, "+agg+"(id) FROM "+table+" WHERE writer = $1 GROUP BY name", writer)
		if err != nil {
			t.Fatal(err)
		}
		var name string
		var id int64
		if _, err := pgx.ForEachRow(r, []any{&name, &id}, func() error { out[name] = id; return nil }); err != nil {
			t.Fatal(err)
		}
		return out
	}
}

// replicaProcess is a replica "child" in a process of its own
// (runChild), and the lines it prints.
type replicaProcess struct {
	cmd     *exec.Cmd
	lines   chan string    // what it prints, line by line; lines beyond its capacity are dropped
	done    chan struct{}  // closed by the test's cleanup: the reader stops
	readers sync.WaitGroup // the reader of its stdout: joined by the cleanup
}

// startReplicaProcess starts the child replica of group, writing to
// table; the test's cleanup kills it and waits for it.
func startReplicaProcess(t *testing.T, group, table string) *replicaProcess {
	t.Helper()
	return startChild(t, childDSN+"="+testServer.DSN, childGroup+"="+group, childTable+"="+table)
}

// startChild starts the test binary as a child with env added to its
// environment (which TestMain tells a child by); the test's cleanup
// kills it and waits for it.
func startChild(t *testing.T, env ...string) *replicaProcess {
	t.Helper()
	p := &replicaProcess{lines: make(chan string, 100), done: make(chan struct{})}
	p.cmd = exec.Command(os.Args[0], "-test.run=^$")
	p.cmd.Env = append(os.Environ(), env...)
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p.cmd.Stderr = os.Stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p.readers.Go(func() { // ends at the child's end, when its stdout closes
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			select {
			case p.lines <- sc.Text():
			case <-p.done:
			default:
			}
		}
	})
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		close(p.done)
		p.readers.Wait()
		_ = p.cmd.Wait()
	})
	return p
}

func TestFrozenReplicaWritesNothingOnceItsNamesMoved(t *testing.T) {
	t.Parallel()
	pool := newPool(t, 8)
	ctx := context.Background()
	group := newGroup("paused")
	table, ids := newWriteTable(t, pool, group)
	child := startReplicaProcess(t, group, table)
	lines := child.lines

	await(t, 15*time.Second, "the child writing every name", func() bool { return len(ids("min", "child")) == len(pausedNames) })
	if err := child.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	var rec sync.Mutex
	var r1Refused []string
	joinFencedHolder(t, ctx, pool, group, table, func(n string) {
		rec.Lock()
		defer rec.Unlock()
		r1Refused = append(r1Refused, n)
	})
	// Taken over while the child is frozen: when it froze inside a
	// fenced transaction, whose locks hold the takeover off, once the
	// server ended that transaction, idle for a TTL (Held's bound).
	await(t, 2*pausedTTL+5*time.Second, "r1 writing every name while the child is frozen", func() bool { return len(ids("min", "r1")) == len(pausedNames) })
	t.Logf("r1 wrote every name %v after the child froze", time.Since(stopped).Round(10*time.Millisecond))
	if err := child.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	refused := map[string]bool{}
	timeout := time.After(5 * time.Second)
	for waiting := true; waiting && len(refused) < len(pausedNames); {
		select {
		case l := <-lines:
			if name, ok := strings.CutPrefix(l, "refused "); ok {
				refused[name] = true
			} else {
				t.Logf("child: %s", l)
			}
		case <-timeout:
			waiting = false
		}
	}
	await(t, 5*time.Second, "r1 writing every name", func() bool { return len(ids("min", "r1")) == len(pausedNames) })
	// The last row the child ever wrote of a name comes before r1's
	// first: ids are taken at the insert, and r1 held the name only
	// after the child's transaction ended.
	lastChild, firstR1 := ids("max", "child"), ids("min", "r1")
	for _, name := range pausedNames {
		if lastChild[name] > firstR1[name] {
			t.Errorf("%s: the frozen child wrote row %d after r1's first, %d", name, lastChild[name], firstR1[name])
		}
	}
	if len(refused) < len(pausedNames) {
		t.Errorf("the woken child's DoFuncs were refused for %v only, in 5s; want every name's", refused)
	}
	rec.Lock()
	defer rec.Unlock()
	if len(r1Refused) > 0 {
		t.Errorf("r1, the holder, was refused for %v", r1Refused)
	}
}

// A replica's process killed (SIGKILL): its names run on the replica
// that waited, junior in Leader mode, once its session ran out, within
// its TTL and a few seconds; nothing the killed one wrote comes after.
func TestKilledReplicasNamesMoveOnceItsSessionRanOut(t *testing.T) {
	t.Parallel()
	pool := newPool(t, 8)
	group := newGroup("killed")
	table, ids := newWriteTable(t, pool, group)
	child := startReplicaProcess(t, group, table)
	await(t, 15*time.Second, "the child writing every name", func() bool { return len(ids("min", "child")) == len(pausedNames) })
	joinFencedHolder(t, context.Background(), pool, group, table, func(string) {})
	time.Sleep(pausedTTL) // r1 watches, junior: it runs nothing
	if n := len(ids("min", "r1")); n != 0 {
		t.Fatalf("r1 wrote %d names while the senior child ran them", n)
	}
	if err := child.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	await(t, pausedTTL+5*time.Second, "r1 writing every name after the child was killed", func() bool { return len(ids("min", "r1")) == len(pausedNames) })
	t.Logf("r1 wrote every name %v after the child was killed (TTL %v)", time.Since(killed).Round(10*time.Millisecond), pausedTTL)
	lastChild, firstR1 := ids("max", "child"), ids("min", "r1")
	for _, name := range pausedNames {
		if lastChild[name] > firstR1[name] {
			t.Errorf("%s: the killed child wrote row %d after r1's first, %d", name, lastChild[name], firstR1[name])
		}
	}
}

// joinFencedHolder joins replica r1 of group on pool with ctx, in Leader
// mode (pausedOptions), running every one of pausedNames with fencedLoop
// as writer "r1" into table, refused called for each refusal. The test's
// cleanup, which runs before the pool's, makes its DoFuncs return, then
// closes it (Close joins them).
func joinFencedHolder(t *testing.T, ctx context.Context, pool *pgxpool.Pool, group, table string, refused func(name string)) *ha.Replica {
	t.Helper()
	r1, err := ha.New(Store(pool, StoreOptions{}), pausedOptions(group, "r1"))
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	t.Cleanup(func() {
		close(stop)
		_ = r1.Close()
	})
	for _, name := range pausedNames {
		_ = r1.UpdateController(name, controller.ControllerParams{DoFunc: fencedLoop(pool, table, "r1", refused, stop)})
	}
	if err := r1.Join(ctx); err != nil {
		t.Fatal(err)
	}
	return r1
}
