// A hostile review's tests (branch kube-review): each states a way the
// safety or liveness promise could break, and fails while it does.

package kube

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A change that both claims a name and gives it (or claims and releases
// it) must not answer that the writer holds a name the bucket gives to
// another, or to no one: change would report it got (and the caller
// would install) a name whose entry names another session, which that
// session runs too. change should refuse such a change, or apply must
// not report the name.
func TestReviewClaimAndGiveOfOneNameIsNotGot(t *testing.T) {
	never := func(string) bool { return false }
	for _, tc := range []struct {
		what string
		ch   claimChange
	}{
		{"claim and give", claimChange{claim: []string{"n"}, give: map[string]string{"n": "s/1"}}},
		{"claim and release", claimChange{claim: []string{"n"}, release: []string{"n"}}},
	} {
		t.Run(tc.what, func(t *testing.T) {
			c := bucketClaims{}
			got, _ := c.apply("me/1", tc.ch, never, 7)
			for _, n := range got {
				if c[n].session != "me/1" {
					t.Errorf("apply answered %q got by me/1, but the bucket says %+v", n, c[n])
				}
			}
		})
	}
}

// An observer's stamp must not move back in time: a read answered at t1
// whose see() runs after the feed stamped a later version at t2 > t1 (a
// goroutine scheduled late between time.Now() and the lock) restamps the
// Lease at t1; the feed's Deletion then ends the session from t1, though
// the holder's last renewal (the version stamped at t2) may have
// committed after t1.
func TestReviewStampDoesNotMoveBackInTime(t *testing.T) {
	g, err := newGroup(nil, nil, "g", 4, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	const x = "r1/old"
	now := time.Now()
	o := newObserver(g)
	o.observe(change{kind: changePut, lease: memberLease(g, x, "u1", "5"), at: now.Add(-3 * time.Second)})
	t1 := now.Add(-2500 * time.Millisecond)                                                                // a read of rv 5 answered here ...
	o.observe(change{kind: changePut, lease: memberLease(g, x, "u1", "6"), at: now.Add(-1 * time.Second)}) // rv 6, the last renewal, received at now-1s
	o.see(memberLease(g, x, "u1", "5"), t1)                                                                // ... takes the lock only now
	o.observe(change{kind: changeDelete, lease: memberLease(g, x, "u1", "7"), at: now})
	if o.ended(x) {
		t.Errorf("ended from %v before now; the last renewal was received 1s ago, D = 2s", now.Sub(t1))
	}
}

// A member Lease whose name is not its holder's ID's (written by anyone
// with the Role's update right, or a restore gone wrong) is stamped as
// that holder's: expire would then read and delete the wrong Lease and
// prove a live session ended. seeLocked should ignore it.
func TestReviewMemberLeaseOfAnotherNameIsNotStamped(t *testing.T) {
	g, err := newGroup(nil, nil, "g", 4, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	l := memberLease(g, "b/inc", "u9", "3")
	l.Name = g.memberName("a") // g-m-a claiming to be b's session
	o := newObserver(g)
	o.see(l, time.Now())
	if st, ok := o.stampOf("b/inc"); ok {
		t.Errorf("b/inc stamped from the Lease %s: %+v; expire would delete that Lease as proof of b's end", st.name, st)
	}
}

// Replicas whose D differ (a rolling upgrade that changes it, or one
// replica configured apart) must not end each other early.
//
// As the review wrote it, the taker (D = 2 s) began while the holder
// (D = 6 s) was live; begin now refuses that (errDurationMismatch), so
// the test checks the refusal, and that the refused begin left no Lease.
// What remains of the hazard is an observer that judges a session of a
// D wider than its own: two begins that raced (each lists after its
// create, so one of the two is refused, which a test cannot make both
// escape), or the observer of a replica configured apart. So the
// taker's observer (D = 2 s) reads one member of D = 6 s, never the
// holder's Lease; the holder pauses and its Lease is deleted by hand;
// the observer's read finds it absent, and must count the widest D it
// has seen in the group, not its own: not ended before the holder's
// validity.
func TestReviewMixedDurationsDoNotEndASessionEarly(t *testing.T) {
	c := needCluster(t)
	g := newTestGroup(t, c, 4, nil)
	long := *g
	long.duration = 3 * testD
	holderG := otherReplica(t, c, &long, nil)
	hs, valid := mustBegin(t, holderG, "holder")
	other, _ := mustBegin(t, holderG, "other")
	holderR := replica{s: hs, o: newObserver(holderG)}
	mustChange(t, holderR, 0, claimChange{claim: namesIn(g, 0, 3)})

	takerG := otherReplica(t, c, g, nil)
	if _, _, err := takerG.begin(t.Context(), "taker"); !errors.Is(err, errDurationMismatch) {
		t.Fatalf("begin with D = %v while members of D = %v live: %v, want errDurationMismatch", g.duration, long.duration, err)
	}
	leases := c.admin.CoordinationV1().Leases(replicaNamespace)
	if _, err := leases.Get(t.Context(), g.memberName("taker"), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the refused begin left its Lease: %v", err)
	}

	o := newObserver(takerG)
	seeNow(t, o, other)
	// The holder pauses now: valid is its validity, its fence passes
	// Margin before it.
	if err := leases.Delete(t.Context(), hs.name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	for !o.ended(hs.identity) {
		if err := o.learn(t.Context(), []string{hs.identity}); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(valid.Add(2 * testD)) {
			t.Fatal("the holder's session never ended")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if ended := time.Now(); ended.Before(valid) {
		t.Fatalf("the taker (D = %v) judged the holder (D = %v) ended %v before its validity ended",
			g.duration, long.duration, valid.Sub(ended).Round(time.Millisecond))
	}
}

// Two observers race to prove one silent session ended: one's delete
// wins; the other's read finds the Lease gone before its feed brings the
// deletion. Its feed had shown every version of the Lease, then shows
// the deletion: it could count D from its stamp (already past), yet
// absent() dropped the stamp and it waits another D from its read, so
// the names it is to take over move 2·D after the holder went silent.
func TestReviewDeleteRaceLoserDoesNotWaitAnotherD(t *testing.T) {
	c := needCluster(t)
	g := newTestGroup(t, c, 4, nil)
	hs, _ := mustBegin(t, g, "holder") // never renewed: silent from now
	a := newObserver(otherReplica(t, c, g, nil))
	b := newObserver(otherReplica(t, c, g, nil))
	observeFeed(t, a.g, a, nil)
	gate := make(chan struct{})
	var gateOnce sync.Once
	openGate := func() { gateOnce.Do(func() { close(gate) }) }
	t.Cleanup(openGate)
	ctx, stop := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- b.g.feed(ctx, "", func(ch change) {
			if ch.kind == changeDelete {
				<-gate // b's feed brings the deletion late
			}
			b.observe(ch)
		})
	}()
	t.Cleanup(func() { openGate(); stop(); <-done })
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if st, ok := b.stampOf(hs.identity); ok && st.fed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("b's feed did not bring the holder's Lease")
		}
	}
	st, _ := b.stampOf(hs.identity)
	sleepUntil(st.due().Add(100 * time.Millisecond))
	if ok, err := a.expire(t.Context(), hs.identity); err != nil || !ok {
		t.Fatalf("a's expire: %v, %v", ok, err)
	}
	if _, err := b.expire(t.Context(), hs.identity); err != nil {
		t.Fatal(err)
	}
	openGate()
	time.Sleep(500 * time.Millisecond) // b's feed brings the deletion
	if !b.ended(hs.identity) {
		b.mu.Lock()
		e := b.ends[hs.identity]
		b.mu.Unlock()
		t.Errorf("b's feed showed every version and the deletion, its stamp is %v past due, yet it counts the end %v from now",
			time.Since(st.due()).Round(time.Millisecond), time.Until(e.since.Add(e.duration)).Round(time.Millisecond))
	}
}

// Several writers changing one bucket at once, each at its own pace (a
// join: every holder hands over its part, and the joiner claims), must
// not be refused errBucketContended: the caller has nothing better to do
// than try again, with the same odds.
func TestReviewBucketUnderSeveralWritersIsNotContended(t *testing.T) {
	c := needCluster(t)
	for _, writers := range []int{3, 5} {
		t.Run(fmt.Sprint(writers, " writers"), func(t *testing.T) { severalWriters(t, c, writers) })
	}
}

func severalWriters(t *testing.T, c *cluster, writers int) {
	g := newTestGroup(t, c, 4, nil)
	const rounds = 25
	names := namesIn(g, 2, 2*writers)
	var contended, total atomic.Int64
	var wg sync.WaitGroup
	for k := range writers {
		r := newReplica(t, c, g, "w"+string(rune('a'+k)))
		mine := names[2*k : 2*k+2]
		wg.Go(func() {
			for i := range rounds {
				ch := claimChange{claim: mine}
				if i%2 == 1 {
					ch = claimChange{release: mine}
				}
				_, err := r.s.change(t.Context(), r.o, 2, ch)
				total.Add(1)
				if errors.Is(err, errBucketContended) {
					contended.Add(1)
				} else if err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if n := contended.Load(); n > 0 {
		t.Errorf("%d of %d changes by %d writers of one bucket answered errBucketContended", n, total.Load(), writers)
	}
}

// Anyone with the Role's update right who shortens leaseDurationSeconds
// on a member Lease (kubectl edit, a tool that "fixes" Leases) makes
// observers expire the session by the new D, counted from the edit,
// while the holder, paused, keeps the fence of its last renewal, sent
// just before, for the old D. DESIGN.md assumes only the session writes
// leaseDurationSeconds; nothing enforces it, and the observer could take
// the larger of the Lease's D, the group's and any it stamped before.
func TestReviewShortenedDurationDoesNotEndASessionEarly(t *testing.T) {
	c := needCluster(t)
	g := newTestGroup(t, c, 4, nil)
	holderR, taker := newReplica(t, c, g, "holder"), newReplica(t, c, g, "taker")
	names := namesIn(g, 0, 3)
	mustChange(t, holderR, 0, claimChange{claim: names})
	observeFeed(t, taker.s.g, taker.o, nil)
	time.Sleep(200 * time.Millisecond)
	valid, err := holderR.s.renew(t.Context()) // its last renewal: it pauses now
	if err != nil {
		t.Fatal(err)
	}
	leases := c.admin.CoordinationV1().Leases(replicaNamespace)
	l, err := leases.Get(t.Context(), holderR.s.name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	l.Spec.LeaseDurationSeconds = new(int32(1))
	if _, err := leases.Update(t.Context(), l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	took := takeWhenEnded(t, taker, 0, names, 4*testD)
	if took.Before(valid) {
		t.Fatalf("the taker took the paused holder's names %v before its validity (D = %v) ended", valid.Sub(took).Round(time.Millisecond), g.duration)
	}
}
