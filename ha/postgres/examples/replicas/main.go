// Command replicas runs three replicas of a service on ha's PostgreSQL
// store: twelve controllers shared by the replicas, each on one replica
// at a time, each writing to a table through its claim (postgres.Held in
// its own transaction). Half-way it crashes one replica and shows the
// others take its names over once its session ran out.
//
//	cd ha/postgres/examples/replicas
//	go run .                                  # on a PostgreSQL server started for it
//	go run . -listen 127.0.0.1:8080 -duration 0
//	go run . -dsn postgres://me@db.example/mydb   # or DATABASE_URL
//
// Given no -dsn and no DATABASE_URL, it starts a server of its own, as
// the module's tests do: Debian's initdb and postgres (the newest of
// /usr/lib/postgresql/*/bin; apt-get install postgresql), a cluster in
// a temporary directory on a free loopback port, run as the user nobody
// when the example runs as root, removed at the end. On a database of
// yours it creates the store's schema bgctl_ha (or uses it) and the
// table bgctl_example_jobs, which it leaves there.
//
// With -listen it serves ha's placement page and each replica's health:
//
//	/placement, /readyz          the first replica's (r0's)
//	/replicas/<id>/placement     who runs what, as replica <id> sees it
//	/replicas/<id>/readyz        replica <id>'s Health: 200, or 503 and why
//
// It exits with status 1 when a name ran on two replicas at once, or
// when at the end a name does not run on exactly one replica.
//
// Each replica has two pools, as the module's guide advises: the store's
// own, and the one its DoFuncs write through.
//
// It is a package of the module ha/postgres rather than a module of its
// own: it needs nothing beyond that module's requirements (pgx, ha, the
// core), and it starts its server through the module's internal/pgtest,
// which the tests use too.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/bgctl/controller"
	"github.com/bgctl/controller/ha"
	"github.com/bgctl/controller/ha/internal/examplekit"
	"github.com/bgctl/controller/ha/postgres"
	"github.com/bgctl/controller/ha/postgres/internal/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// options are the command's flags.
type options struct {
	dsn      string
	names    int
	ttl      time.Duration
	duration time.Duration
	listen   string
	group    string
	verbose  bool
}

// ids are the replicas' IDs; victim is the one that crashes half-way.
var ids = []string{"r0", "r1", "r2"}

const victim = "r1"

func main() {
	var o options
	flag.StringVar(&o.dsn, "dsn", os.Getenv("DATABASE_URL"), "the database to run on (default $DATABASE_URL); empty: a PostgreSQL server started here")
	flag.IntVar(&o.names, "names", 12, "how many controllers the replicas share")
	flag.DurationVar(&o.ttl, "ttl", 2*time.Second, "the replicas' session TTL: how long a crashed replica's names wait")
	flag.DurationVar(&o.duration, "duration", 10*time.Second, "leave after this long, "+victim+" crashing half-way; 0: on SIGINT or SIGTERM, and no crash")
	flag.StringVar(&o.listen, "listen", "", "serve the placement pages and readiness on this host:port (port 0: any)")
	flag.StringVar(&o.group, "group", "replicas-example", "the group's name (ha.Options.Prefix)")
	flag.BoolVar(&o.verbose, "v", false, "log the replicas' claims and releases")
	examplekit.Main("replicas", func() error { return run(o) })
}

// replica is one member of the group, with the pools it reaches the
// database through, its own as a process of its own would have: one for
// the store (its feed's connection and its renewals), one for the
// service's work, so that the work never holds the renewals up.
type replica struct {
	r     *ha.Replica
	store *pgxpool.Pool
	work  *pgxpool.Pool
}

// close closes the pools m made.
func (m *replica) close() {
	for _, p := range []*pgxpool.Pool{m.work, m.store} {
		if p != nil {
			p.Close()
		}
	}
}

// run starts the replicas, each with every controller, crashes the
// victim half-way through o.duration, and has the others leave at its
// end (or on SIGINT or SIGTERM); then it checks the run.
func run(o options) error {
	if o.names < 1 {
		return fmt.Errorf("-names %d: want at least one", o.names)
	}
	// Caught before a server starts, so that Ctrl-C while it starts
	// still stops it (it runs in a process group of its own).
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	dsn := o.dsn
	if dsn == "" {
		fmt.Println("no -dsn or DATABASE_URL: starting a PostgreSQL server of its own")
		srv, err := pgtest.Start("")
		if err != nil {
			return err
		}
		defer srv.Stop()
		dsn = srv.DSN
	}
	if o.duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.duration)
		defer cancel()
	}

	level := slog.LevelWarn
	if o.verbose {
		level = slog.LevelInfo
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	names := make([]string, o.names)
	for i := range names {
		names[i] = fmt.Sprintf("job-%02d", i)
	}
	b := newBoard()
	members := map[string]*replica{}
	defer func() { // every replica still a member leaves, whatever went wrong
		leaveCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, id := range ids {
			if m := members[id]; m != nil {
				if err := m.r.Leave(leaveCtx); err != nil {
					fmt.Fprintf(os.Stderr, "replicas: %s: leave: %v\n", id, err)
				}
				m.close()
			}
		}
	}()
	for _, id := range ids {
		m, err := startReplica(ctx, dsn, o, id, names, b, logger)
		if err != nil {
			return err
		}
		members[id] = m
	}
	fmt.Printf("replicas %s joined group %s, TTL %v\n", strings.Join(ids, ", "), o.group, o.ttl)
	if o.listen != "" {
		rs := make([]*ha.Replica, len(ids))
		for i, id := range ids {
			rs[i] = members[id].r
		}
		stopServing, err := examplekit.Serve(o.listen, rs)
		if err != nil {
			return err
		}
		defer stopServing()
	}

	start := time.Now()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	var crashedAt time.Time
	var orphans []string // the victim's names at its crash, until they run elsewhere
	last := ""
	for done := false; !done; {
		select {
		case <-ctx.Done():
			done = true
		case <-tick.C:
		}
		at := time.Since(start).Round(100 * time.Millisecond)
		if line := b.Line(ids); line != last {
			fmt.Printf("%6v  %s\n", at, line)
			last = line
		}
		if orphans != nil && b.AllMoved(orphans, victim) {
			fmt.Printf("%6v  the others run %s's %d names, %v after its crash (TTL %v)\n",
				at, victim, len(orphans), time.Since(crashedAt).Round(10*time.Millisecond), o.ttl)
			orphans = nil
		}
		if crashedAt.IsZero() && o.duration > 0 && time.Since(start) >= o.duration/2 && !done {
			orphans = b.On(victim)
			fmt.Printf("%6v  crashing %s, which runs %s: its names wait for its session to run out\n",
				at, victim, strings.Join(orphans, " "))
			crashedAt = time.Now()
			crash(members[victim])
			delete(members, victim)
		}
	}

	// Checked before the Leaves, which stop every name.
	errs := []error{b.Placed(names)}
	starts, overlaps := b.Counts()
	writes, refused := b.writeCounts()
	fmt.Printf("%d starts, %d while the name ran on another replica; %d fenced writes committed, %d refused (the name had moved)\n",
		starts, overlaps, writes, refused)
	if overlaps > 0 {
		errs = append(errs, fmt.Errorf("%d names started while they ran on another replica", overlaps))
	}
	return errors.Join(errs...)
}

// startReplica makes replica id on pools of its own, registers every
// name on it and joins.
func startReplica(ctx context.Context, dsn string, o options, id string, names []string, b *board, logger *slog.Logger) (_ *replica, err error) {
	m := &replica{}
	defer func() {
		if err != nil {
			m.close()
		}
	}()
	// The store's pool: the feed holds one connection, renewals and
	// claims take another now and then.
	if m.store, err = newPool(ctx, dsn, 4); err != nil {
		return nil, err
	}
	// The service's: the DoFuncs' transactions.
	if m.work, err = newPool(ctx, dsn, 8); err != nil {
		return nil, err
	}
	if _, err := m.work.Exec(ctx, `CREATE TABLE IF NOT EXISTS bgctl_example_jobs (name text PRIMARY KEY, replica text NOT NULL, writes bigint NOT NULL)`); err != nil {
		return nil, fmt.Errorf("creating the example's table: %w", err)
	}
	m.r, err = ha.New(postgres.Store(m.store, postgres.StoreOptions{}), ha.Options{
		Prefix:         o.group,
		ID:             id,
		TTL:            o.ttl,
		ManagerOptions: []controller.Option{controller.WithSlog(logger)},
	})
	if err != nil {
		return nil, err
	}
	for _, name := range names {
		err := m.r.UpdateController(name, controller.ControllerParams{
			DoFunc:      func(ctx context.Context) error { return job(ctx, m.work, name, id, b) },
			RunInterval: time.Second,
		})
		if err != nil {
			return nil, err
		}
	}
	joinCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := m.r.Join(joinCtx); err != nil {
		_ = m.r.Close()
		return nil, fmt.Errorf("%s: join: %w", id, err)
	}
	return m, nil
}

// newPool returns a pool on dsn of at most conns connections.
func newPool(ctx context.Context, dsn string, conns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("-dsn: %w", err)
	}
	cfg.MaxConns = conns
	return pgxpool.NewWithConfig(ctx, cfg)
}

// job is the work of name on replica id: until its context ends, a
// write every 200 ms, each in a transaction that first checks the claim
// (postgres.Held), so that it commits only while this replica holds the
// name.
func job(ctx context.Context, pool *pgxpool.Pool, name, id string, b *board) error {
	defer b.Start(name, id)()
	claim, ok := ha.ClaimFrom(ctx)
	if !ok {
		return errors.New("job runs only on a replica")
	}
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if err := postgres.Held(ctx, tx, claim); err != nil {
				return err // the name moved: write nothing
			}
			_, err := tx.Exec(ctx, `INSERT INTO bgctl_example_jobs (name, replica, writes) VALUES ($1, $2, 1)
ON CONFLICT (name) DO UPDATE SET replica = $2, writes = bgctl_example_jobs.writes + 1`, name, id)
			return err
		})
		switch {
		case ctx.Err() != nil:
			return nil // stopped: the name moves, or the replica leaves
		case errors.Is(err, postgres.ErrNotHeld):
			b.wrote(false)
			return controller.NewExitReason("the claim moved: another replica runs " + name)
		case err != nil:
			return err // retried with backoff
		}
		b.wrote(true)
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// crash stops m as a crashed process would: its controllers stop and its
// session is left to run out (Close, no Leave), then its pools close.
func crash(m *replica) {
	if err := m.r.Close(); err != nil {
		fmt.Fprintf(os.Stderr, "replicas: %s: close: %v\n", m.r.ID(), err)
	}
	m.close()
}
