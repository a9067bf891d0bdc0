// Package postgres keeps the sessions of package ha's replicas in
// PostgreSQL, the database most services already run: [Store] gives
// [ha.New] and [ha.Join] a store on a *pgxpool.Pool the service has, and
// [Held] fences a DoFunc's write inside the service's own transaction,
// so that it commits only while the replica still holds the name.
//
// # Quick start
//
//	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
//	if err != nil { ... }
//	r, err := ha.New(postgres.Store(pool, postgres.StoreOptions{}), ha.Options{
//		Prefix: "billing", // the group: the replicas of one service
//		ID:     hostname,
//		TTL:    5 * time.Second,
//	})
//	if err != nil { ... }
//	r.UpdateController("invoices", controller.ControllerParams{
//		DoFunc: func(ctx context.Context) error {
//			claim, _ := ha.ClaimFrom(ctx)
//			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
//				if err := postgres.Held(ctx, tx, claim); err != nil {
//					return err // the name moved: write nothing
//				}
//				_, err := tx.Exec(ctx, "UPDATE invoices SET ...")
//				return err
//			})
//		},
//	})
//	if err := r.Join(ctx); err != nil { ... }
//	defer r.Leave(context.Background())
//
// The store creates its tables on first use in the schema
// StoreOptions.Schema names (bgctl_ha by default), and refuses tables of
// another version; [SchemaSQL] is the same file, for users who run their
// migrations themselves. The user the pool connects as needs CREATE on
// the database for that (or the tables made beforehand), and to read and
// write them.
//
// # What it gives
//
// A crashed replica's names run elsewhere once its session runs out, a
// TTL after its last renewal, counted on the database server's clock; a
// replica that leaves hands them over at once. The steady state writes
// one renewal per replica per renewal period, whatever the number of
// names; a claim or a session's end is a constant number of statements
// for any number of names. DESIGN.md in the module gives the figures
// measured, at 100,000 names and beside advisory locks.
//
// # What it assumes
//
// One primary that every replica writes to, and that a commit it
// acknowledges survives (synchronous_commit on; with a standby, one
// that a failover promotes only with every acknowledged commit: synchronous
// replication). A failover that loses acknowledged commits may lose
// renewals and claims too: see DESIGN.md in the module for what then
// happens. It needs a session-mode connection to LISTEN on (the pool's
// own, or a pooler in session mode): each replica's feed takes one
// connection from the pool and keeps it, outside the pool's MaxConns,
// for as long as it runs. And a server clock that
// is not stepped forward (slewing is fine): expiry is decided on it.
//
// Renewals take a connection of the pool like any request: a pool user
// code can exhaust (transactions left open, a burst of queries) delays
// them, and a replica whose renewals fail for its window stops its
// names. Give the store a pool of its own, or keep room in the shared
// one. A statement_timeout or lock_timeout set low on the pool's role
// for user code does not cut the store's transactions short: they set
// their own, bounded by the replica's RequestTimeout.
//
// # Server versions
//
// Supported: PostgreSQL 15 and later, the releases the PostgreSQL
// project still supports, of which the tests run against the oldest and
// the newest: 15 (Debian bookworm's) and 18.4; they start their own
// server, from Debian's packages or from the directory -pg.bin names.
// Older servers from 10 on are accepted, untested: 10 is the first with
// identity columns (GENERATED ALWAYS AS IDENTITY), the newest feature the
// store's SQL uses. The store refuses an older server at its first
// request with an error wrapping [ErrServerTooOld] that names the
// server's version.
//
// # The example
//
// examples/replicas in the module is a whole program: three replicas on
// a server it starts (or on -dsn), writes fenced by Held, a crash
// half-way, and the placement page. docs/replicas-postgres.md in the
// repository is the guide.
package postgres
