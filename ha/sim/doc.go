// Package sim is an in-memory store for the replicas of package ha, with
// faults a test injects: a crash, a partition, a paused process, a lost
// answer, a session the store ends early. It runs inside a
// testing/synctest bubble, where sessions expire on the bubble's clock,
// so a test of three replicas of a service's own controllers, with a
// crash and a partition, runs in milliseconds, and every wait in it
// lasts exactly as long on every run.
//
// # Testing a replicated service
//
// Make a [Store] (the zero value is an empty one) and a [Recorder], make
// each replica with [ha.New] on the store, register the service's
// controllers through the recorder ([Recorder.Controllers]), and join.
// Then inject faults and let the bubble's clock run with time.Sleep:
//
//	synctest.Test(t, func(t *testing.T) {
//		var st sim.Store
//		var rec sim.Recorder
//		// ha.New(&st, opts) for r0, r1, r2; register through
//		// rec.Controllers(r); Join each.
//		st.Crash(r1)                  // r1 dies; its session runs out
//		st.Partition("r2")            // r2's requests go unanswered
//		time.Sleep(10 * time.Second)  // instant in the bubble
//		st.Heal("r2")
//		// Close every replica, then:
//		if o := rec.Overlaps(); len(o) > 0 {
//			t.Errorf("ran twice at once: %v", o)
//		}
//	})
//
// Every replica must be closed (or have left) before the bubble's
// function returns, or synctest reports its goroutines as leaked.
//
// # The faults, and what they cannot show
//
// The store stands between the replicas and their group, so it fakes
// what a replica's requests and their answers meet; it cannot freeze or
// kill a replica's goroutines. So:
//
//   - [Store.Crash] cuts a replica off for good and closes it: its
//     controllers are stopped at once and the store ends its session
//     when its TTL runs out. Unlike a real crash, its StopFuncs may
//     still run while its fence is open (Replica.Close runs them).
//   - [Store.Partition] drops a replica's requests, its renewals
//     included, until [Store.Heal]: each waits until its context ends and
//     never reaches the store; its feed delivers nothing meanwhile. The
//     others go on; its session runs out after its TTL.
//   - [Store.Pause] holds a replica's requests, and the answers and feed
//     batches on their way to it, until [Store.Resume]; then they go on,
//     those whose context has not ended. The replica's own clock still
//     runs: its fence passes on time and its DoFuncs see their context
//     end, which a process frozen mid-DoFunc would not (the hazard the
//     package ha documentation names in "Why no name runs on two
//     replicas at once"); to test that hazard, block the DoFunc itself.
//   - [Store.LoseAnswer] has the store carry out a request and the caller
//     get an error; [Store.DelayAnswer] holds the answer back.
//   - [Store.EndSession] ends a replica's session before its TTL, as a
//     server that revokes a lease early does.
//
// # The reference store
//
// [Backend] keeps the contract of [ha.Backend] the simplest way that
// keeps it: one lock, one position counter for every write, every record
// in a map, expiry carried out by the store itself at the moment a
// session's validity runs out. Its methods' documentation says what each
// guarantees; a store of another kind keeps the same guarantees, and
// runs the cases of github.com/bgctl/controller/ha/hatest to show it, as
// this one does.
package sim
