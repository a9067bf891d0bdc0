// Examples for the package documentation: they run in real time, outside
// a bubble, so they show what needs no TTL to pass; the faults that do
// (Crash, Partition, Pause) are shown by docs/testing-replicas.md's test.

package sim_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"time"

	"github.com/bgctl/controller"
	"github.com/bgctl/controller/ha"
	"github.com/bgctl/controller/ha/sim"
)

// Three replicas of a service share its controllers on one Store, each
// name on one replica; when one leaves, the others take its names over at
// once, and the Recorder shows that no name ever ran on two replicas at
// once. (The faults that wait for a TTL, Crash and Partition, belong in a
// testing/synctest bubble: see docs/testing-replicas.md.)
func Example() {
	names := []string{"billing", "emails", "reports"}
	register := func(c ha.Controllers) error { // the service's own code
		for _, name := range names {
			err := c.UpdateController(name, controller.ControllerParams{
				DoFunc: func(ctx context.Context) error { <-ctx.Done(); return nil },
			})
			if err != nil {
				return err
			}
		}
		return nil
	}

	var store sim.Store
	var rec sim.Recorder
	var replicas []*ha.Replica
	for _, id := range []string{"r0", "r1", "r2"} {
		r, err := ha.New(&store, ha.Options{
			Prefix:         "/my-service",
			ID:             id,
			Settle:         -1, // claim at once: the replicas join one by one
			ManagerOptions: []controller.Option{controller.WithSlog(slog.New(slog.DiscardHandler))},
		})
		if err != nil {
			log.Fatal(err)
		}
		if err := register(rec.Controllers(r)); err != nil {
			log.Fatal(err)
		}
		if err := r.Join(context.Background()); err != nil {
			log.Fatal(err)
		}
		replicas = append(replicas, r)
	}
	// everyNameOnce waits until each name runs on one of replicas.
	everyNameOnce := func(replicas ...*ha.Replica) bool {
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			running := 0
			for _, r := range replicas {
				for _, name := range names {
					if r.Running(name) {
						running++
					}
				}
			}
			if running == len(names) {
				return true
			}
		}
		return false
	}
	fmt.Println("every name runs once:", everyNameOnce(replicas...))

	if err := replicas[1].Leave(context.Background()); err != nil {
		log.Fatal(err)
	}
	fmt.Println("r1 left, its names taken over:", everyNameOnce(replicas[0], replicas[2]))

	for _, r := range replicas {
		_ = r.Close()
	}
	fmt.Println("ran twice at once:", len(rec.Overlaps()))
	// Output:
	// every name runs once: true
	// r1 left, its names taken over: true
	// ran twice at once: 0
}

// A session the store ends early takes the replica's names with it: its
// fence passes at once, and it joins again under a new session.
func ExampleStore_EndSession() {
	var store sim.Store
	r, err := ha.New(&store, ha.Options{
		Prefix:         "/my-service",
		ID:             "r0",
		ManagerOptions: []controller.Option{controller.WithSlog(slog.New(slog.DiscardHandler))},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer r.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events := r.Events(ctx)
	if err := r.Join(ctx); err != nil {
		log.Fatal(err)
	}
	if err := store.EndSession("r0"); err != nil {
		log.Fatal(err)
	}
	gained := 0
	for e := range events {
		if e.Kind == ha.LeaseGained || e.Kind == ha.FencePassed || e.Kind == ha.LeaseLost {
			fmt.Println(e.Kind)
		}
		if e.Kind == ha.LeaseGained {
			if gained++; gained == 2 {
				break
			}
		}
	}
	fmt.Println(store.Ended()[0].Reason)
	// Output:
	// lease gained
	// fence passed
	// lease lost
	// lease gained
	// ended early
}

// A lost answer: the store carries the request out and the caller hears
// an error; asking again finds the write made.
func ExampleStore_LoseAnswer() {
	var store sim.Store
	b, _ := store.Backend(ha.BackendConfig{ID: "r0", TTL: 2 * time.Second})
	ctx := context.Background()
	s, err := b.Begin(ctx, 0, 2*time.Second, "")
	if err != nil {
		log.Fatal(err)
	}
	store.LoseAnswer("r0", sim.OpClaim)
	_, _, err = b.Claim(ctx, s.ID, []string{"billing"})
	fmt.Println("claim:", errors.Is(err, sim.ErrAnswerLost))
	holder, _ := store.Holder("billing")
	fmt.Println("held by:", holder)
	got, _, _ := b.Claim(ctx, s.ID, []string{"billing"})
	fmt.Println("claim again, mine:", got[0].Mine)
	_ = b.End(ctx, s.ID)
	// Output:
	// claim: true
	// held by: r0
	// claim again, mine: true
}
