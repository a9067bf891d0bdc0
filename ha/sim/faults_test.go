// Tests of the faults a test injects, each on the store's backends in a
// testing/synctest bubble: what a request meets, on its way and back.

package sim_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/bgctl/controller/ha"
	"github.com/bgctl/controller/ha/sim"
)

// A partitioned replica's requests wait until their context ends and
// never reach the store, while another's go on; its session, unrenewed,
// ends exactly a TTL after its last renewal; once healed, its requests
// reach the store again.
func TestPartitionDropsRequestsUntilHealed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var st sim.Store
		start := time.Now()
		r0, r1 := backend(t, &st, "r0"), backend(t, &st, "r1")
		s0, s1 := begin(t, r0), begin(t, r1)
		st.Partition("r1")
		renewals := st.Requests(sim.OpRenew)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		sent := time.Now()
		if _, err := r1.Renew(ctx, s1.ID); !errors.Is(err, context.DeadlineExceeded) || time.Since(sent) != 300*time.Millisecond {
			t.Errorf("a partitioned renewal: %v after %v, want the context's deadline after 300ms", err, time.Since(sent))
		}
		if n := st.Requests(sim.OpRenew); n != renewals {
			t.Errorf("%d renewals reached the store across the partition", n-renewals)
		}
		if _, err := r0.Renew(context.Background(), s0.ID); err != nil {
			t.Errorf("the other replica's renewal: %v", err)
		}
		time.Sleep(time.Until(start.Add(ttl)))
		if at, ok := st.Expires("r0"); !ok || at.Sub(start) != 300*time.Millisecond+ttl {
			t.Errorf("r0's session expires at %v (%v), want 300ms + TTL", at.Sub(start), ok)
		}
		ended(t, &st, start, "r1 2 expired at 2s")
		st.Heal("r1")
		if _, err := r1.Begin(context.Background(), 0, ttl, "d"); err != nil {
			t.Errorf("Begin once healed: %v", err)
		}
	})
}

// A paused replica's request is held, not dropped: it reaches the store
// at Resume, and is carried out then; one whose context ended meanwhile
// never reaches it. The feed delivers nothing while paused, and what it
// held at Resume.
func TestPauseHoldsRequestsAndFeedUntilResumed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var st sim.Store
		start := time.Now()
		r0, r1 := backend(t, &st, "r0"), backend(t, &st, "r1")
		s0 := begin(t, r0)
		feed := watch(t, r1, s0.JoinedAt)

		st.Pause("r1")
		begun := make(chan error)
		go func() { // joined by the receive below
			_, err := r1.Begin(context.Background(), 0, ttl, "d")
			begun <- err
		}()
		short, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		if _, _, err := r1.MemberSession(short); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("a request whose context ended while paused: %v", err)
		}
		if _, _, err := r0.Claim(context.Background(), s0.ID, []string{"x"}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
		synctest.Wait()
		select {
		case b := <-feed.Batches():
			t.Errorf("the feed delivered %+v while paused", b)
		default:
		}
		if n := st.Requests(sim.OpBegin) + st.Requests(sim.OpMemberSession); n != 1 {
			t.Errorf("%d Begin and MemberSession requests reached the store while r1 was paused, want r0's Begin alone", n)
		}
		st.Resume("r1")
		if err := <-begun; err != nil {
			t.Errorf("the held Begin: %v", err)
		}
		if at, _ := st.Expires("r1"); at.Sub(start) != 300*time.Millisecond+ttl {
			t.Errorf("the held Begin's session expires at %v, want from Resume (300ms) + TTL", at.Sub(start))
		}
		if b := changes(feed); len(b.Changes) != 1 || b.Changes[0].Kind != ha.ClaimPut || b.Changes[0].Name != "x" {
			t.Errorf("the feed's first batch after Resume: %+v, want x's claim", b)
		}
	})
}

// A lost answer: the store carried the request out, the caller got
// ErrAnswerLost; the fault meets one request, of its replica and op.
func TestLoseAnswerCarriesTheRequestOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var st sim.Store
		ctx := context.Background()
		r0, r1 := backend(t, &st, "r0"), backend(t, &st, "r1")
		s0, s1 := begin(t, r0), begin(t, r1)
		st.LoseAnswer("r1", sim.OpClaim)
		if _, _, err := r0.Claim(ctx, s0.ID, []string{"a"}); err != nil {
			t.Errorf("r0's Claim met r1's fault: %v", err)
		}
		if _, _, err := r1.Claim(ctx, s1.ID, []string{"b"}); !errors.Is(err, sim.ErrAnswerLost) {
			t.Errorf("r1's Claim: %v, want ErrAnswerLost", err)
		}
		if holder, held := st.Holder("b"); holder != "r1" || !held {
			t.Errorf("b is held by %q (%v), want r1: the store carried the Claim out", holder, held)
		}
		got, _, err := r1.Claim(ctx, s1.ID, []string{"b"})
		if err != nil || len(got) != 1 || !got[0].Mine {
			t.Errorf("r1's Claim again: %+v, %v; want b found Mine, once", got, err)
		}
	})
}

// A renewal whose answer was lost renewed the session all the same: it
// lives a TTL from the renewal's arrival, past its first grant.
func TestLostRenewalStillRenewed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var st sim.Store
		r0 := backend(t, &st, "r0")
		s := begin(t, r0)
		time.Sleep(ttl * 3 / 4)
		st.LoseAnswer("r0", sim.OpRenew)
		if _, err := r0.Renew(context.Background(), s.ID); !errors.Is(err, sim.ErrAnswerLost) {
			t.Fatalf("a renewal whose answer was lost: %v, want ErrAnswerLost", err)
		}
		time.Sleep(ttl / 2) // past the first grant's end
		if _, err := r0.Renew(context.Background(), s.ID); err != nil {
			t.Errorf("the session after a renewal whose answer was lost: %v", err)
		}
	})
}

// A late answer: the store acts when the request arrives, the caller
// hears d later; a renewal's validity counts from its arrival.
func TestDelayAnswerActsAtOnceAndAnswersLater(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var st sim.Store
		start := time.Now()
		r0 := backend(t, &st, "r0")
		s := begin(t, r0)
		st.DelayAnswer("", sim.OpRenew, 500*time.Millisecond)
		if _, err := r0.Renew(context.Background(), s.ID); err != nil || time.Since(start) != 500*time.Millisecond {
			t.Errorf("a renewal held back 500ms: %v after %v", err, time.Since(start))
		}
		if at, _ := st.Expires("r0"); at != start.Add(ttl) {
			t.Errorf("renewed until %v, want from its arrival, at 0: %v", at.Sub(start), ttl)
		}
	})
}

// A session ended early goes at once, its record and holdings in one
// batch of the feed; the store says why.
func TestEndSessionEndsItAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var st sim.Store
		start := time.Now()
		r0, r1 := backend(t, &st, "r0"), backend(t, &st, "r1")
		s0, s1 := begin(t, r0), begin(t, r1)
		if _, _, err := r1.Claim(context.Background(), s1.ID, []string{"a", "b"}); err != nil {
			t.Fatal(err)
		}
		_, at, err := r0.List(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		feed := watch(t, r0, at)
		time.Sleep(time.Second)
		if err := st.EndSession("r1"); err != nil {
			t.Fatal(err)
		}
		if b := changes(feed); len(b.Changes) != 3 {
			t.Errorf("the session's end came as %+v, want its record and two holdings in one batch", b)
		}
		if _, err := r1.Renew(context.Background(), s1.ID); !errors.Is(err, ha.ErrSessionEnded) {
			t.Errorf("renewing a session ended early: %v, want ErrSessionEnded", err)
		}
		if err := st.EndSession("r1"); err == nil {
			t.Error("EndSession of a replica without a live session did not fail")
		}
		ended(t, &st, start, "r1 2 ended early at 1s")
		_ = r0.End(context.Background(), s0.ID)
	})
}

// The feed delivers a session's expiry at the moment its validity runs
// out, without any request, and progress alone at least every
// RenewEvery meanwhile, so that a replica's Health sees it current.
func TestFeedDeliversExpiryOnTimeAndProgress(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var st sim.Store
		start := time.Now()
		r0 := backend(t, &st, "r0")
		s := begin(t, r0)
		feed := watch(t, r0, s.JoinedAt)
		var progress []time.Duration
		for {
			b := <-feed.Batches()
			if len(b.Changes) == 0 {
				progress = append(progress, time.Since(start))
				continue
			}
			if time.Since(start) != ttl || b.Changes[0].Kind != ha.MemberGone {
				t.Errorf("at %v: %+v, want the member record gone at the TTL, %v", time.Since(start), b, ttl)
			}
			break
		}
		if want := "[500ms 1s 1.5s]"; fmt.Sprint(progress) != want {
			t.Errorf("progress batches at %v, want %s (every RenewEvery)", progress, want)
		}
	})
}
