// Review: what a user's test relies on of the Store that no other test
// showed: bad input to Crash answered with an error, sessions that
// expire at one instant ended in one order on every run, and Compact's
// honesty to feeds and HeldAt.

package sim_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/bgctl/controller/ha"
	"github.com/bgctl/controller/ha/sim"
)

// Crash of no replica, or of one made on another store, is a mistake in
// the test: it must say so, not panic nor close a replica the store
// never cut off.
func TestReviewCrashRefusesNilAndAnotherStoresReplica(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var st, other sim.Store
		err := func() (err error) {
			defer func() {
				if p := recover(); p != nil {
					err = fmt.Errorf("panicked: %v", p)
				}
			}()
			return st.Crash(nil)
		}()
		if err == nil || !errors.Is(err, sim.ErrUnknownReplica) {
			t.Errorf("Crash(nil) = %v, want an error wrapping ErrUnknownReplica", err)
		}
		var rec sim.Recorder
		r := join(t, &other, &rec, "r0")
		if err := st.Crash(r); !errors.Is(err, sim.ErrUnknownReplica) {
			t.Errorf("Crash of another store's replica = %v, want an error wrapping ErrUnknownReplica", err)
		}
		if _, ok := other.Expires("r0"); !ok {
			t.Error("the other store's replica lost its session")
		}
	})
}

// Sessions whose validity runs out at one instant end in the order of
// their IDs, at successive positions, on every run: a test that reads
// Ended, or the feed, sees the same thing each time.
func TestReviewSessionsExpiringTogetherEndInOneOrder(t *testing.T) {
	for range 20 {
		synctest.Test(t, func(t *testing.T) {
			var st sim.Store
			base := time.Now()
			var want []string
			for i := range 6 {
				id := fmt.Sprintf("r%d", i)
				s := begin(t, backend(t, &st, id))
				want = append(want, fmt.Sprintf("%s %d expired at %v", id, s.ID, ttl))
			}
			time.Sleep(ttl)
			ended(t, &st, base, want...)
		})
	}
}

// Compact: a feed behind the compacted position fails once with
// ErrCompacted and delivers nothing after; a feed caught up goes on;
// HeldAt before the position fails, at or after it answers.
func TestReviewCompactIsHonest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var st sim.Store
		b := backend(t, &st, "r0")
		s := begin(t, b)
		ctx := context.Background()
		got, _, err := b.Claim(ctx, s.ID, []string{"a"})
		if err != nil || len(got) != 1 || !got[0].Mine {
			t.Fatalf("Claim: %v, %v", got, err)
		}
		claimedAt := got[0].Revision
		caught := watch(t, b, claimedAt)
		behind := watch(t, b, s.JoinedAt-1)
		if c := changes(behind); c.At != s.JoinedAt {
			t.Fatalf("the feed behind delivered %+v first, want the Begin at %d", c, s.JoinedAt)
		}
		synctest.Wait() // the feed behind now holds the Claim's batch, the one caught up progress
		if err := b.Release(ctx, ha.Claim{Name: "a", Revision: claimedAt}); err != nil {
			t.Fatal(err)
		}
		_, at, err := b.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if c := changes(caught); c.At != at || c.Err != nil {
			t.Fatalf("the feed caught up delivered %+v, want the release at %d", c, at)
		}
		st.Compact()
		if _, err := b.PutMember(ctx, s.ID, "d2", false); err != nil {
			t.Fatal(err)
		}
		if c := changes(caught); c.At != at+1 || c.Err != nil {
			t.Errorf("the feed caught up delivered %+v after the compaction, want the member's write at %d", c, at+1)
		}
		for {
			c := <-behind.Batches()
			if c.Err != nil {
				if !errors.Is(c.Err, sim.ErrCompacted) {
					t.Errorf("the feed behind failed with %v, want ErrCompacted", c.Err)
				}
				break
			}
			if c.At > claimedAt {
				t.Fatalf("the feed behind delivered %+v past the compaction's position, as if nothing was forgotten", c)
			}
		}
		synctest.Wait()
		select {
		case c := <-behind.Batches():
			t.Errorf("the failed feed delivered %+v after its error", c)
		default:
		}
		if _, err := b.(ha.HistoryReader).HeldAt(ctx, claimedAt); !errors.Is(err, sim.ErrCompacted) {
			t.Errorf("HeldAt before the compaction = %v, want ErrCompacted", err)
		}
		if names, err := b.(ha.HistoryReader).HeldAt(ctx, at); err != nil || len(names) != 0 {
			t.Errorf("HeldAt the compaction = %v, %v, want nothing held", names, err)
		}
	})
}

// A batch the feed had made ready before a Pause or a Partition, its
// replica not yet receiving, is held (Pause) or dropped (Partition) like
// every other: a paused or cut-off replica's feed delivers nothing, as
// documented, whether or not its replica was busy when the fault came.
func TestReviewFaultHoldsTheFeedsBatchOnItsWay(t *testing.T) {
	for _, fault := range []struct {
		name        string
		start, stop func(st *sim.Store, id string)
	}{
		{"Pause", (*sim.Store).Pause, (*sim.Store).Resume},
		{"Partition", (*sim.Store).Partition, (*sim.Store).Heal},
	} {
		t.Run(fault.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var st sim.Store
				b0, b1 := backend(t, &st, "r0"), backend(t, &st, "r1")
				begin(t, b0)
				f := watch(t, b0, 0)
				if c := changes(f); len(c.Changes) != 1 {
					t.Fatalf("first batch %+v, want r0's Begin", c)
				}
				s1 := begin(t, b1)
				synctest.Wait() // r0's feed has r1's Begin ready, and r0 is not receiving
				fault.start(&st, "r0")
				synctest.Wait()
				select {
				case c := <-f.Batches():
					t.Errorf("%s: the feed delivered %+v", fault.name, c)
				default:
				}
				fault.stop(&st, "r0")
				if c := changes(f); c.At != s1.JoinedAt {
					t.Errorf("after the fault ended the feed delivered %+v, want r1's Begin at %d", c, s1.JoinedAt)
				}
			})
		})
	}
}

// A session ends at the moment its validity runs out on the bubble's
// clock even while every feed waits for its replica to receive a batch
// (the replica busy, its feed's receiver waiting on something else):
// the others see it end then, not when a feed next moves.
func TestReviewSessionEndsOnTimeWhileTheFeedWaitsToDeliver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var st sim.Store
		base := time.Now()
		b0, b1 := backend(t, &st, "r0"), backend(t, &st, "r1")
		s0 := begin(t, b0)
		watch(t, b0, 0) // never received from: its first batch waits
		s1 := begin(t, b1)
		time.Sleep(3 * ttl)
		ended(t, &st, base, fmt.Sprintf("r0 %d expired at %v", s0.ID, ttl), fmt.Sprintf("r1 %d expired at %v", s1.ID, ttl))
	})
}

// A fault meant for a request no backend sends (an Op misspelt), or a
// delay of nothing, would meet nothing and let the test pass without
// it: it is refused, naming the culprit, and not injected.
func TestReviewFaultOfNoRequestIsRefused(t *testing.T) {
	var st sim.Store
	if err := st.LoseAnswer("r0", "renew"); err == nil || !strings.Contains(err.Error(), `"renew"`) {
		t.Errorf("LoseAnswer of Op %q = %v, want an error naming it", "renew", err)
	}
	if err := st.DelayAnswer("r0", "Claims", time.Second); err == nil || !strings.Contains(err.Error(), `"Claims"`) {
		t.Errorf("DelayAnswer of Op %q = %v, want an error naming it", "Claims", err)
	}
	if err := st.DelayAnswer("r0", sim.OpClaim, 0); err == nil || !strings.Contains(err.Error(), "0s") {
		t.Errorf("DelayAnswer of 0s = %v, want an error naming the delay", err)
	}
	if err := st.LoseAnswer("", ""); err != nil {
		t.Errorf("LoseAnswer of any request = %v", err)
	}
	if err := st.DelayAnswer("r0", sim.OpRenew, time.Second); err != nil {
		t.Errorf("DelayAnswer(r0, Renew, 1s) = %v", err)
	}
}

// With no feed running, a session whose validity ran out is ended by
// the next look at the store; it ended, and is reported as ended, at
// the moment its validity ran out, and sessions that ran out one after
// the other end in that order, whatever their IDs.
func TestReviewSessionEndedLazilyEndsAtItsExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var st sim.Store
		base := time.Now()
		b0, b1 := backend(t, &st, "r0"), backend(t, &st, "r1")
		s0 := begin(t, b0)
		s1 := begin(t, b1)
		time.Sleep(ttl / 2)
		if _, err := b0.Renew(context.Background(), s0.ID); err != nil {
			t.Fatal(err)
		}
		time.Sleep(3 * ttl)
		ended(t, &st, base, fmt.Sprintf("r1 %d expired at %v", s1.ID, ttl), fmt.Sprintf("r0 %d expired at %v", s0.ID, ttl+ttl/2))
	})
}

// What the store answers and delivers comes in one order on every run,
// not the maps': a session's end deletes its holdings in the order of
// their names, and a listing and a fetch answer records sorted, so that
// a test that replays a run sees the same batches.
func TestReviewBatchesAndListingsInOneOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var st sim.Store
		b := backend(t, &st, "r0")
		s := begin(t, b)
		ctx := context.Background()
		var names []string
		for i := range 20 {
			names = append(names, fmt.Sprintf("n%02d", i))
		}
		if _, _, err := b.Claim(ctx, s.ID, names); err != nil {
			t.Fatal(err)
		}
		chunks := [][]byte{[]byte("a"), []byte("b"), []byte("c"), []byte("d"), []byte("e")}
		if err := b.Publish(ctx, s.ID, "d1", "", chunks); err != nil {
			t.Fatal(err)
		}
		got, _, err := b.Fetch(ctx, "r0", "d1")
		if err != nil {
			t.Fatal(err)
		}
		for i, c := range got {
			if c.Index != i {
				t.Fatalf("Fetch answered chunk %d at %d: %+v", c.Index, i, got)
			}
		}
		records, _, err := b.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var listed []string
		for _, r := range records {
			if r.Kind == ha.ClaimPut {
				listed = append(listed, r.Name)
			}
		}
		if fmt.Sprint(listed) != fmt.Sprint(names) {
			t.Errorf("List answered the holdings %v, want them by name", listed)
		}
		_, at, err := b.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		f := watch(t, b, at)
		if err := b.End(ctx, s.ID); err != nil {
			t.Fatal(err)
		}
		var gone []string
		for _, c := range changes(f).Changes {
			if c.Kind == ha.ClaimGone {
				gone = append(gone, c.Name)
			}
		}
		if fmt.Sprint(gone) != fmt.Sprint(names) {
			t.Errorf("the session's end deleted the holdings in the order %v, want them by name", gone)
		}
	})
}

// Publish with a digest of "" publishes nothing, as documented, even
// when given chunks: it only withdraws the replica's sets.
func TestReviewPublishOfNoDigestPublishesNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var st sim.Store
		b := backend(t, &st, "r0")
		s := begin(t, b)
		ctx := context.Background()
		if err := b.Publish(ctx, s.ID, "d1", "", [][]byte{[]byte("a")}); err != nil {
			t.Fatal(err)
		}
		_, at, err := b.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		f := watch(t, b, at)
		if err := b.Publish(ctx, s.ID, "", "d1", [][]byte{[]byte("b")}); err != nil {
			t.Fatal(err)
		}
		c := changes(f)
		if len(c.Changes) != 1 || c.Changes[0].Kind != ha.ChunkGone || c.Changes[0].Chunk.Digest != "d1" {
			t.Errorf("Publish of digest \"\" delivered %+v, want d1's chunk gone alone", c.Changes)
		}
	})
}

// A feed delivers every change, in the order of the positions, while
// replicas write at once: the holdings it shows at the end are the
// store's, and its positions never go back.
func TestReviewFeedUnderConcurrentWritesMissesNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var st sim.Store
		ctx := context.Background()
		watcher := backend(t, &st, "w")
		f := watch(t, watcher, 0)
		var wg sync.WaitGroup
		for i := range 4 {
			b := backend(t, &st, fmt.Sprintf("r%d", i))
			s := begin(t, b)
			wg.Go(func() {
				for j := range 50 {
					name := fmt.Sprintf("n%d", (i+j)%5)
					got, _, err := b.Claim(ctx, s.ID, []string{name})
					if err != nil {
						t.Error(err)
						return
					}
					if len(got) == 1 && got[0].Mine && j%3 != 0 {
						if err := b.Release(ctx, ha.Claim{Name: name, Revision: got[0].Revision}); err != nil {
							t.Error(err)
							return
						}
					}
					time.Sleep(time.Millisecond)
				}
			})
		}
		held := map[string]bool{}
		var last, lastChange int64
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		var final int64 = -1
		for final < 0 || last < final {
			select {
			case <-done:
				_, at, err := watcher.List(ctx)
				if err != nil {
					t.Fatal(err)
				}
				final, done = at, nil
				continue
			case bt := <-f.Batches():
				if bt.Err != nil {
					t.Fatal(bt.Err)
				}
				if bt.At < last || (len(bt.Changes) > 0 && bt.At <= lastChange) {
					t.Fatalf("the feed went from %d back to %d", last, bt.At)
				}
				last = bt.At
				for _, c := range bt.Changes {
					if c.At != bt.At {
						t.Errorf("a change at %d in the batch at %d", c.At, bt.At)
					}
					lastChange = bt.At
					switch c.Kind {
					case ha.ClaimPut:
						held[c.Name] = true
					case ha.ClaimGone:
						delete(held, c.Name)
					}
				}
			}
		}
		records, _, err := watcher.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]bool{}
		for _, r := range records {
			if r.Kind == ha.ClaimPut {
				want[r.Name] = true
			}
		}
		if fmt.Sprint(held) != fmt.Sprint(want) {
			t.Errorf("the feed shows the holdings %v, the store holds %v", held, want)
		}
	})
}

// Recorder.Controllers of no replica says so, instead of a nil
// dereference with nothing to name it.
func TestReviewRecorderOfNilReplicaSaysSo(t *testing.T) {
	var rec sim.Recorder
	defer func() {
		if p := fmt.Sprint(recover()); !strings.Contains(p, "Recorder.Controllers(nil)") {
			t.Errorf("Controllers(nil) panicked with %q, want it named", p)
		}
	}()
	rec.Controllers(nil)
}
