// Examples: three replicas of a service on one database, and a DoFunc's
// write fenced in its own transaction.

package postgres

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/bgctl/controller"
	"github.com/bgctl/controller/ha"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Three replicas of a service share its four controllers through the
// database; the one that leaves hands its names to the others at once.
func ExampleStore() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testServer.DSN) // the service's own pool
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	store := Store(pool, StoreOptions{})
	names := []string{"billing", "emails", "reports", "thumbnails"}
	var replicas []*ha.Replica
	for _, id := range []string{"r0", "r1", "r2"} {
		r, err := ha.New(store, ha.Options{
			Prefix:         "example-store",
			ID:             id,
			TTL:            2 * time.Second,
			ManagerOptions: []controller.Option{controller.WithSlog(slog.New(slog.DiscardHandler))},
		})
		if err != nil {
			panic(err)
		}
		defer func() { _ = r.Leave(context.Background()) }()
		for _, name := range names {
			_ = r.UpdateController(name, controller.ControllerParams{
				DoFunc: func(ctx context.Context) error { <-ctx.Done(); return nil },
			})
		}
		if err := r.Join(ctx); err != nil {
			panic(err)
		}
		replicas = append(replicas, r)
	}
	runningOnce := func(rs []*ha.Replica) bool {
		for _, name := range names {
			on := 0
			for _, r := range rs {
				if r.Running(name) {
					on++
				}
			}
			if on != 1 {
				return false
			}
		}
		return true
	}
	for !runningOnce(replicas) {
		time.Sleep(50 * time.Millisecond)
	}
	fmt.Println("every name runs on one of three replicas")
	if err := replicas[0].Leave(ctx); err != nil {
		panic(err)
	}
	for !runningOnce(replicas[1:]) {
		time.Sleep(50 * time.Millisecond)
	}
	fmt.Println("r0 left: every name runs on r1 or r2")
	// Output:
	// every name runs on one of three replicas
	// r0 left: every name runs on r1 or r2
}

// A DoFunc writes only while its replica holds the name: Held, in the
// same transaction as the write, fails once the name has moved, and a
// takeover waits for a transaction that passed it.
func ExampleHeld() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testServer.DSN)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, "CREATE TABLE IF NOT EXISTS example_invoices (run int)"); err != nil {
		panic(err)
	}
	r, err := ha.New(Store(pool, StoreOptions{}), ha.Options{
		Prefix:         "example-held",
		ID:             "r0",
		TTL:            2 * time.Second,
		ManagerOptions: []controller.Option{controller.WithSlog(slog.New(slog.DiscardHandler))},
	})
	if err != nil {
		panic(err)
	}
	var once sync.Once
	wrote := make(chan error, 1)
	_ = r.UpdateController("invoices", controller.ControllerParams{
		DoFunc: func(ctx context.Context) error {
			claim, _ := ha.ClaimFrom(ctx)
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				if err := Held(ctx, tx, claim); err != nil {
					return err // the name moved: nothing is written
				}
				_, err := tx.Exec(ctx, "INSERT INTO example_invoices VALUES (1)")
				return err
			})
			once.Do(func() { wrote <- err })
			<-ctx.Done()
			return nil
		},
	})
	if err := r.Join(ctx); err != nil {
		panic(err)
	}
	fmt.Println("fenced write:", <-wrote)
	_ = r.Leave(ctx)
	// Output:
	// fenced write: <nil>
}
