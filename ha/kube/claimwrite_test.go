// Claims of names through bucket Leases against the real kube-apiserver,
// with the replicas' credentials: one holder per name whatever the race,
// tokens that only grow per name, hand-overs, a paused holder refused
// when it wakes, and a member Lease deleted by hand that lets no one
// take its names before the holder's fence passed.

package kube

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// namesIn returns k names of bucket i of g, the same on every call.
func namesIn(g *group, i, k int) []string {
	var names []string
	for n := 0; len(names) < k; n++ {
		if name := fmt.Sprint("name-", n); bucketOf(name, g.buckets) == i {
			names = append(names, name)
		}
	}
	return names
}

// replica is one replica's session of a group, on clients of its own,
// with its own observer.
type replica struct {
	s *session
	o *observer
}

// newReplica begins a session of id for a replica of g with clients of
// its own.
func newReplica(t *testing.T, c *cluster, g *group, id string) replica {
	t.Helper()
	mine := otherReplica(t, c, g, nil)
	s, _ := mustBegin(t, mine, id)
	return replica{s: s, o: newObserver(mine)}
}

// mustChange makes r change bucket i as ch asks, failing the test on an
// error.
func mustChange(t *testing.T, r replica, i int, ch claimChange) changeResult {
	t.Helper()
	res, err := r.s.change(t.Context(), r.o, i, ch)
	if err != nil {
		t.Fatalf("%s's change of bucket %d: %v", r.s.identity, i, err)
	}
	return res
}

// bucketNow returns bucket i's claims as a quorum read by the
// administrator finds them, and the Lease.
func bucketNow(t *testing.T, c *cluster, g *group, i int) (bucketClaims, *coordinationv1.Lease) {
	t.Helper()
	l, err := c.admin.CoordinationV1().Leases(replicaNamespace).Get(t.Context(), g.bucketName(i), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	claims, err := claimsOf(l)
	if err != nil {
		t.Fatal(err)
	}
	return claims, l
}

// Three replicas claim overlapping sets of names of one bucket at the
// same moment, when the bucket is absent (three creates) and then
// existing (updates on one resourceVersion): every name ends with one
// holder, each writer's answer holds exactly the names the bucket gives
// it, with the bucket's tokens, and every name asked for is held by
// someone. Released and raced for again, each name's token grows.
func TestClaimRaceGivesEachNameOneHolder(t *testing.T) {
	c := needCluster(t)
	g := newTestGroup(t, c, 4, nil)
	rs := []replica{newReplica(t, c, g, "a"), newReplica(t, c, g, "b"), newReplica(t, c, g, "c")}
	names := namesIn(g, 1, 12)
	asks := func(k int) []string { // replica k asks for 8 names: 4 only the next one shares
		return append(slices.Clone(names[4*k:min(4*k+8, 12)]), names[:max(0, 4*k+8-12)]...)
	}
	last := map[string]int64{}
	for round := range 3 {
		results := make([]changeResult, len(rs))
		errs := make([]error, len(rs))
		start := make(chan struct{})
		var wg sync.WaitGroup
		for k, r := range rs {
			wg.Go(func() { <-start; results[k], errs[k] = r.s.change(t.Context(), r.o, 1, claimChange{claim: asks(k)}) })
		}
		close(start)
		wg.Wait()
		claims, _ := bucketNow(t, c, g, 1)
		if len(claims) != len(names) {
			t.Fatalf("round %d: the bucket holds %d names, want all %d: %v", round, len(claims), len(names), claims)
		}
		for k, r := range rs {
			if errs[k] != nil {
				t.Fatalf("round %d: %s's claim: %v", round, r.s.identity, errs[k])
			}
			got := slices.Sorted(maps.Keys(results[k].got))
			if want := heldIn(claims, r.s.identity); !slices.Equal(got, want) {
				t.Fatalf("round %d: %s was answered %v, the bucket gives it %v", round, r.s.identity, got, want)
			}
			for n, tok := range results[k].got {
				if claims[n].token != tok {
					t.Fatalf("round %d: %s got %s at token %d, the bucket says %d", round, r.s.identity, n, tok, claims[n].token)
				}
				if !slices.Contains(asks(k), n) {
					t.Fatalf("round %d: %s got %s, which it did not ask for", round, r.s.identity, n)
				}
			}
		}
		for n, e := range claims {
			if old, ok := last[n]; ok && e.token <= old {
				t.Fatalf("round %d: %s held at token %d, after %d the round before: want it to grow", round, n, e.token, old)
			}
			last[n] = e.token
		}
		// Each releases what it got, at once too.
		for k, r := range rs {
			wg.Go(func() {
				_, errs[k] = r.s.change(t.Context(), r.o, 1, claimChange{release: slices.Collect(maps.Keys(results[k].got))})
			})
		}
		wg.Wait()
		for k := range rs {
			if errs[k] != nil {
				t.Fatalf("round %d: release: %v", round, errs[k])
			}
		}
		if claims, _ := bucketNow(t, c, g, 1); len(claims) != 0 {
			t.Fatalf("round %d: after every release the bucket holds %v", round, claims)
		}
	}
}

// takeWhenEnded has r claim names of bucket i every 50 ms, running its
// observer's expiry and renewing r's own session meanwhile, until it
// gets them all, and returns when it did; it fails the test after
// within.
func takeWhenEnded(t *testing.T, r replica, i int, names []string, within time.Duration) time.Time {
	t.Helper()
	for deadline := time.Now().Add(within); ; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not get %v within %v", r.s.identity, names, within)
		}
		if _, err := r.s.renew(t.Context()); err != nil {
			t.Fatalf("%s's renewal: %v", r.s.identity, err)
		}
		for _, id := range r.o.due(time.Now()) {
			if _, err := r.o.expire(t.Context(), id); err != nil {
				t.Fatal(err)
			}
		}
		res := mustChange(t, r, i, claimChange{claim: names})
		if len(res.got) == len(names) {
			return time.Now()
		}
	}
}

// A name's token grows from each holder to the next: a create (0), a
// claim after a release, a takeover from a session that ended without
// releasing, a takeover from an earlier incarnation of a live ID. A
// retried claim of one's own name answers the same token and writes
// nothing; a live holder's name is not got. A session's end deleted its
// own Lease, which the others' observers did not do: they take its names
// only D after they first find it gone.
func TestNameTokensGrow(t *testing.T) {
	c := needCluster(t)
	g := newTestGroup(t, c, 4, nil)
	a, b := newReplica(t, c, g, "a"), newReplica(t, c, g, "b")
	n := namesIn(g, 0, 1)
	var tokens []int64
	took := func(r replica) {
		t.Helper()
		res := mustChange(t, r, 0, claimChange{claim: n})
		tok, ok := res.got[n[0]]
		if !ok || !res.wrote {
			t.Fatalf("%s's claim of %s: %+v, want it got and written", r.s.identity, n[0], res)
		}
		if k := len(tokens); k > 0 && tok <= tokens[k-1] {
			t.Fatalf("%s got %s at token %d after %v: want it to grow", r.s.identity, n[0], tok, tokens)
		}
		tokens = append(tokens, tok)
	}
	// takenOver has r take n from a session that ended at since, by no
	// delete of r's observer: no sooner than D after, with a larger token.
	takenOver := func(r replica, since time.Time, within time.Duration, what string) {
		t.Helper()
		if at := takeWhenEnded(t, r, 0, n, within); at.Sub(since) < testD {
			t.Fatalf("%s took %s %v after %s: want D = %v at least", r.s.identity, n[0], at.Sub(since), what, testD)
		}
		tokens = append(tokens, mustChange(t, r, 0, claimChange{claim: n}).got[n[0]])
		if k := len(tokens); tokens[k-1] <= tokens[k-2] {
			t.Fatalf("the takeover's token: %v, want it to grow", tokens)
		}
	}
	refused := func(r replica) {
		t.Helper()
		if res := mustChange(t, r, 0, claimChange{claim: n}); len(res.got) != 0 || res.wrote {
			t.Fatalf("%s's claim of a live session's %s: %+v, want nothing", r.s.identity, n[0], res)
		}
	}

	took(a) // the create
	if tokens[0] != 0 {
		t.Fatalf("a name written by the bucket's create has token %d, want 0", tokens[0])
	}
	if again := mustChange(t, a, 0, claimChange{claim: n}); again.got[n[0]] != tokens[0] || again.wrote {
		t.Fatalf("a's claim retried: %+v, want token %d and no write", again, tokens[0])
	}
	refused(b)
	mustChange(t, a, 0, claimChange{release: n})
	took(b) // after a release
	refused(a)

	// b's session ends without releasing n.
	if err := b.s.end(t.Context()); err != nil {
		t.Fatal(err)
	}
	takenOver(a, time.Now(), 4*testD, "b's Lease was deleted, which a did not do")

	// a restarts: a new incarnation of its ID, after its old Lease is
	// gone. n, held by the old incarnation, is taken over by b's new
	// session D after it finds a's Lease of another incarnation.
	if err := a.s.end(t.Context()); err != nil {
		t.Fatal(err)
	}
	a2, b2 := newReplica(t, c, g, "a"), newReplica(t, c, g, "b")
	takenOver(b2, time.Now(), 3*testD, "a restarted")
	refused(a2)
	t.Logf("tokens of %s: %v", n[0], tokens)
}

// A holder hands a name over to another live session: the entry names
// the new holder with a larger token, which the new holder's claim
// answers without a write; the old holder's claim and release of it do
// nothing, and a session cannot give away a live session's name.
func TestHandOverToALiveSession(t *testing.T) {
	c := needCluster(t)
	g := newTestGroup(t, c, 4, nil)
	a, b := newReplica(t, c, g, "a"), newReplica(t, c, g, "b")
	n := namesIn(g, 2, 2)
	first := mustChange(t, a, 2, claimChange{claim: n})
	gave := mustChange(t, a, 2, claimChange{give: map[string]string{n[0]: b.s.identity}})
	claims, l := bucketNow(t, c, g, 2)
	if !gave.wrote || claims[n[0]].session != b.s.identity || claims[n[0]].token <= first.got[n[0]] {
		t.Fatalf("after the hand-over %s is %+v (was %d), want b's with a larger token", n[0], claims[n[0]], first.got[n[0]])
	}
	if holder(l) != a.s.identity {
		t.Errorf("the bucket's holderIdentity is %q, want the last writer %q", holder(l), a.s.identity)
	}
	if res := mustChange(t, b, 2, claimChange{claim: n[:1]}); res.got[n[0]] != claims[n[0]].token || res.wrote {
		t.Fatalf("b's claim of the name handed to it: %+v, want token %d and no write", res, claims[n[0]].token)
	}
	for _, ch := range []claimChange{
		{claim: n[:1]},   // a's claim of the name it gave
		{release: n[:1]}, // a's release of it
	} {
		if res := mustChange(t, a, 2, ch); len(res.got) != 0 || res.wrote {
			t.Fatalf("a's change %+v of the name it gave: %+v, want nothing", ch, res)
		}
	}
	if res := mustChange(t, b, 2, claimChange{give: map[string]string{n[1]: b.s.identity}}); res.wrote {
		t.Fatalf("b gave itself a's live name: %+v", res)
	}
	if after, _ := bucketNow(t, c, g, 2); !maps.Equal(after, claims) {
		t.Fatalf("the refused changes changed the bucket: %v, was %v", after, claims)
	}
}

// observeFeed runs g's feed into o until the test ends, also handing
// each change to also when not nil (on the feed's goroutine).
func observeFeed(t *testing.T, g *group, o *observer, also func(change)) {
	t.Helper()
	ctx, stop := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { // joined by the cleanup
		done <- g.feed(ctx, "", func(ch change) {
			o.observe(ch)
			if also != nil {
				also(ch)
			}
		})
	}()
	t.Cleanup(func() {
		stop()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("feed: %v, want context.Canceled", err)
		}
	})
}

// A holder that stops (its goroutine does nothing for longer than D, as a
// SIGSTOPped process would) is proven ended by an observer fed by the
// group's watch, after its validity ended; another replica takes its
// names, each with a larger token. When the holder wakes, a release it
// makes before it knows changes nothing; then every guarded write it
// makes is refused: its renewal (session lost), its release and claims
// (session lost), a write to a bucket on the resourceVersion its claim
// left (Conflict).
func TestPausedHolderIsRefusedWhenItWakes(t *testing.T) {
	c := needCluster(t)
	const buckets = 4
	g := newTestGroup(t, c, buckets, nil)
	paused, taker := newReplica(t, c, g, "paused"), newReplica(t, c, g, "taker")
	names := make([][]string, buckets)
	held := make([]changeResult, buckets)
	for i := range buckets {
		names[i] = namesIn(g, i, 3)
		held[i] = mustChange(t, paused, i, claimChange{claim: names[i]})
		if len(held[i].got) != 3 {
			t.Fatalf("the holder got %v of %v", held[i].got, names[i])
		}
	}
	stopRenewing := renewing(paused.s)

	var mu sync.Mutex
	var memberSeen []changeKind                      // guarded by mu: the holder's member Lease, change by change
	lastBucket := map[string]*coordinationv1.Lease{} // guarded by mu
	observeFeed(t, taker.s.g, taker.o, func(ch change) {
		mu.Lock()
		defer mu.Unlock()
		record := func(kind changeKind, l *coordinationv1.Lease) {
			if !isMember(l) {
				lastBucket[l.Name] = l
			} else if l.Name == paused.s.name {
				memberSeen = append(memberSeen, kind)
			}
		}
		if ch.kind == changeSnapshot {
			for _, l := range ch.leases {
				record(changePut, l)
			}
			return
		}
		record(ch.kind, ch.lease)
	})

	time.Sleep(testD) // the holder renews; the taker watches
	lastValid, err := stopRenewing()
	if err != nil {
		t.Fatalf("the holder's renewals: %v", err)
	}
	// Paused: the holder does nothing from here until it wakes.

	var provenAt time.Time
	for deadline := time.Now().Add(4 * testD); provenAt.IsZero(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the paused holder was not proven ended within %v", 4*testD)
		}
		if _, err := taker.s.renew(t.Context()); err != nil {
			t.Fatalf("the taker's renewal: %v", err)
		}
		for _, id := range taker.o.due(time.Now()) {
			ended, err := taker.o.expire(t.Context(), id)
			if err != nil {
				t.Fatal(err)
			}
			if ended && id == paused.s.identity {
				provenAt = time.Now()
			} else if ended {
				t.Fatalf("the observer ended %s, which is not the paused holder", id)
			}
		}
	}
	if !provenAt.After(lastValid) {
		t.Fatalf("the holder was proven ended %v before its last renewal's validity ended", lastValid.Sub(provenAt))
	}
	t.Logf("proven ended %v after the holder's validity ended", provenAt.Sub(lastValid).Round(time.Millisecond))

	taken := make([]changeResult, buckets)
	for i := range buckets {
		taken[i] = mustChange(t, taker, i, claimChange{claim: names[i]})
		if len(taken[i].got) != 3 {
			t.Fatalf("the taker got %v of bucket %d, want %v", taken[i].got, i, names[i])
		}
		for n, tok := range taken[i].got {
			if tok <= held[i].got[n] {
				t.Fatalf("%s taken with token %d, the holder's was %d: want it larger", n, tok, held[i].got[n])
			}
		}
	}

	// The holder wakes. Before it knows, its release changes nothing.
	if res := mustChange(t, paused, 0, claimChange{release: names[0]}); res.wrote || len(res.got) != 0 {
		t.Errorf("the woken holder's release: %+v, want nothing written", res)
	}
	if _, err := paused.s.renew(t.Context()); !errors.Is(err, errSessionLost) {
		t.Errorf("the woken holder's renewal: %v, want errSessionLost", err)
	}
	for _, ch := range []claimChange{{release: names[0]}, {claim: names[2]}} {
		if _, err := paused.s.change(t.Context(), paused.o, 0, ch); !errors.Is(err, errSessionLost) {
			t.Errorf("the woken holder's change %+v: %v, want errSessionLost", ch, err)
		}
	}
	stale := held[1].lease.DeepCopy()
	if err := setClaims(stale, bucketClaims{}); err != nil {
		t.Fatal(err)
	}
	if _, err := paused.s.g.leases.Update(t.Context(), stale, metav1.UpdateOptions{}); !apierrors.IsConflict(err) {
		t.Errorf("the woken holder's write to bucket 1 on its claim's resourceVersion: %v, want Conflict", err)
	}

	// The taker's feed showed the holder's member Lease come and go, and
	// every bucket at the version the taker's claim wrote.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		mu.Lock()
		var behind []string
		for i, res := range taken {
			if l := lastBucket[g.bucketName(i)]; l == nil || l.ResourceVersion != res.lease.ResourceVersion {
				behind = append(behind, fmt.Sprint(i))
			}
		}
		seen := slices.Clone(memberSeen)
		mu.Unlock()
		if len(behind) == 0 {
			if len(seen) < 2 || seen[len(seen)-1] != changeDelete || seen[len(seen)-2] != changePut {
				t.Fatalf("the feed showed the holder's member Lease as %v, want puts, then its delete", seen)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("10 s after the takeover the feed shows buckets %v behind", behind)
		}
	}
}

// An administrator deletes a live holder's member Lease by hand (an
// early end, DESIGN.md). Another replica must not take its names before
// the holder's fence has passed: not before D after a time its observer
// knows to be after the holder's last renewal. The holder's next
// renewal fails (session lost), and the names move once the holder's
// validity ended, however the taker learnt of the deletion:
//
//   - its feed brought the Lease's versions, then the deletion, in order:
//     D counts from the stamp of the last version;
//   - it stamped the Lease once by a read, and its feed stalled (here:
//     it has none) while the holder renewed on: D counts from the read
//     that finds the Lease gone, not from the stale stamp;
//   - it never saw the Lease: D counts from the read that finds it gone.
func TestEarlyEndWaitsForTheHoldersFence(t *testing.T) {
	c := needCluster(t)
	for _, how := range []string{"feed", "stalled feed", "never seen"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel() // each on a group of its own: they wait side by side
			g := newTestGroup(t, c, 4, nil)
			holderR, taker := newReplica(t, c, g, "holder"), newReplica(t, c, g, "taker")
			names := namesIn(g, 0, 3)
			mustChange(t, holderR, 0, claimChange{claim: names})
			stopRenewing := renewing(holderR.s)
			// gotDelete: when the taker's feed brought the deletion. The
			// last version's stamp comes before it, but may come after
			// the Delete was sent, when a renewal committed just before.
			var gotDeleteMu sync.Mutex
			var gotDelete time.Time
			switch how {
			case "feed":
				observeFeed(t, taker.s.g, taker.o, func(ch change) {
					if ch.kind == changeDelete && ch.lease.Name == holderR.s.name {
						gotDeleteMu.Lock()
						gotDelete = ch.at
						gotDeleteMu.Unlock()
					}
				})
			case "stalled feed":
				seeNow(t, taker.o, holderR.s)
			}
			time.Sleep(3 * testD / 2) // the holder renews on
			if how == "feed" {
				if st, ok := taker.o.stampOf(holderR.s.identity); !ok || !st.fed {
					t.Fatalf("the taker's feed did not bring the holder's Lease: %+v", st)
				}
			}

			deleted := time.Now()
			if err := c.admin.CoordinationV1().Leases(replicaNamespace).Delete(t.Context(), holderR.s.name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			took := takeWhenEnded(t, taker, 0, names, 3*testD)
			lastValid, err := stopRenewing()
			if !took.After(lastValid) {
				t.Fatalf("the taker took the names %v after the deletion, %v before the holder's validity ended",
					took.Sub(deleted), lastValid.Sub(took))
			}
			if !errors.Is(err, errSessionLost) {
				t.Fatalf("the holder's renewals after the deletion: %v, want errSessionLost", err)
			}
			t.Logf("deleted, then the holder's validity ended %v later and the names moved %v later",
				lastValid.Sub(deleted).Round(time.Millisecond), took.Sub(deleted).Round(time.Millisecond))
			taker.o.mu.Lock()
			since := taker.o.ends[holderR.s.identity].since
			taker.o.mu.Unlock()
			gotDeleteMu.Lock()
			fedDelete := gotDelete
			gotDeleteMu.Unlock()
			switch {
			case how == "feed" && (fedDelete.IsZero() || !since.Before(fedDelete)):
				t.Errorf("with the feed, the end counted from %v after the deletion, which the feed brought %v after it: want the stamp of the last version, before that",
					since.Sub(deleted), fedDelete.Sub(deleted))
			case how != "feed" && (since.Before(deleted) || took.Sub(deleted) < testD):
				t.Errorf("the end counted from %v after the deletion and the names moved %v after it: want D = %v from a read after it",
					since.Sub(deleted), took.Sub(deleted), testD)
			}
		})
	}
}
