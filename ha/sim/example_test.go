// Examples for the package documentation: they run in real time, outside
// a bubble, so they show what needs no TTL to pass; the faults that do
// (Crash, Partition, Pause) are shown by docs/testing-replicas.md's test.

package sim_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/bgctl/controller/ha"
	"github.com/bgctl/controller/ha/sim"
)

// Three replicas of a service share its controllers on one Store, each
// name on one replica; when one leaves, the others take its names over at
// once, and the Recorder shows that no name ever ran on two replicas at
// once.
func Example() {
	var store sim.Store
	var rec sim.Recorder
	var replicas []*ha.Replica
	for _, id := range []string{"r0", "r1", "r2"} {
		r, err := ha.New(&store, quiet(id))
		if err != nil {
			log.Fatal(err)
		}
		if err := registerControllers(rec.Controllers(r)); err != nil {
			log.Fatal(err)
		}
		if err := r.Join(context.Background()); err != nil {
			log.Fatal(err)
		}
		replicas = append(replicas, r)
	}
	total := func() int { return runningOn(replicas[0]) + runningOn(replicas[1]) + runningOn(replicas[2]) }
	fmt.Println("spread over three:", until(func() bool {
		return total() == len(controllerNames) && runningOn(replicas[0]) > 0 && runningOn(replicas[1]) > 0 && runningOn(replicas[2]) > 0
	}))

	if err := replicas[1].Leave(context.Background()); err != nil {
		log.Fatal(err)
	}
	fmt.Println("r1's names taken over:", until(func() bool { return total() == len(controllerNames) }))

	for _, r := range replicas {
		_ = r.Close()
	}
	fmt.Println("ran twice at once:", len(rec.Overlaps()))
	// Output:
	// spread over three: true
	// r1's names taken over: true
	// ran twice at once: 0
}

// A session the store ends early takes the replica's names with it: its
// fence passes at once, and it joins again under a new session.
func ExampleStore_EndSession() {
	var store sim.Store
	r, err := ha.New(&store, quiet("r0"))
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
