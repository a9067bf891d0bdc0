// Buckets against the real kube-apiserver, with the replicas'
// credentials: one winner per claim, a token that only grows, and a
// paused holder whose buckets moved and whose writes are refused when it
// wakes.

package kube

import (
	"errors"
	"sync"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// raceClaims has a and b claim bucket i at the same moment, checks that
// exactly one won, the other being refused with errBucketHeld, and
// returns the winner's holding and session.
func raceClaims(t *testing.T, a, b *session, i int) (holding, *session) {
	t.Helper()
	var ha, hb holding
	var ea, eb error
	start := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { <-start; ha, ea = a.claim(t.Context(), i) })
	wg.Go(func() { <-start; hb, eb = b.claim(t.Context(), i) })
	close(start)
	wg.Wait()
	switch {
	case ea == nil && errors.Is(eb, errBucketHeld):
		return ha, a
	case eb == nil && errors.Is(ea, errBucketHeld):
		return hb, b
	}
	t.Fatalf("racing claims of bucket %d answered %v and %v, want one win and one errBucketHeld", i, ea, eb)
	panic("unreachable")
}

// Two replicas claim the same bucket at the same moment, when it is
// absent (two creates) and when it is free (two updates on the same
// resourceVersion): exactly one wins each time, and the bucket Lease
// names it.
func TestBucketClaimRaceHasOneWinner(t *testing.T) {
	c := needCluster(t)
	const buckets = 8
	g := newTestGroup(t, c, buckets, nil)
	a, _ := mustBegin(t, g, "a")
	b, _ := mustBegin(t, otherReplica(t, c, g, nil), "b")
	for i := range buckets {
		h, winner := raceClaims(t, a, b, i)
		if h.token != 0 {
			t.Fatalf("bucket %d created with token %d, want 0", i, h.token)
		}
		if err := winner.release(t.Context(), h); err != nil {
			t.Fatalf("release of bucket %d: %v", i, err)
		}
		h2, winner2 := raceClaims(t, a, b, i)
		if h2.token != 1 {
			t.Fatalf("bucket %d claimed again with token %d, want 1", i, h2.token)
		}
		l, err := g.leases.Get(t.Context(), g.bucketName(i), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if holder(l) != winner2.identity || l.ResourceVersion != h2.rv {
			t.Fatalf("bucket %d is held by %q at %s, want the winner %q at %s", i, holder(l), l.ResourceVersion, winner2.identity, h2.rv)
		}
	}
}

// leaseTransitions, the bucket's token, grows with every claim: a create
// (0), a claim after a release, a takeover from a session that ended, a
// takeover from an earlier incarnation of a live ID. A retried claim of
// one's own holding answers the same token; a live holder's bucket is
// refused; a release on a holding someone took since is refused.
func TestBucketTokenGrows(t *testing.T) {
	c := needCluster(t)
	g := newTestGroup(t, c, 4, nil)
	gb := otherReplica(t, c, g, nil)
	a, _ := mustBegin(t, g, "a")
	b, _ := mustBegin(t, gb, "b")
	ctx := t.Context()
	var tokens []int64
	took := func(h holding, err error) holding {
		t.Helper()
		if err != nil {
			t.Fatalf("claim: %v", err)
		}
		if n := len(tokens); n > 0 && h.token <= tokens[n-1] {
			t.Fatalf("claim's token %d after %v: want it to grow", h.token, tokens)
		}
		tokens = append(tokens, h.token)
		return h
	}

	first := took(a.claim(ctx, 0))
	if again, err := a.claim(ctx, 0); err != nil || again.token != first.token || again.rv != first.rv {
		t.Fatalf("a's claim retried: %+v, %v; want its holding %+v", again, err, first)
	}
	if _, err := b.claim(ctx, 0); !errors.Is(err, errBucketHeld) {
		t.Fatalf("b's claim of a's bucket: %v, want errBucketHeld", err)
	}
	if err := a.release(ctx, first); err != nil {
		t.Fatal(err)
	}
	second := took(b.claim(ctx, 0)) // after a release
	if _, err := a.claim(ctx, 0); !errors.Is(err, errBucketHeld) {
		t.Fatalf("a's claim of b's bucket: %v, want errBucketHeld", err)
	}
	if err := b.end(ctx); err != nil {
		t.Fatal(err)
	}
	third := took(a.claim(ctx, 0)) // b's session ended: a takeover
	if err := b.release(ctx, second); !errors.Is(err, errNotHeld) {
		t.Fatalf("b's release after a took its bucket: %v, want errNotHeld", err)
	}

	// a restarts: a new incarnation of the same ID, after the old one's
	// Lease is gone. The old incarnation's holding is taken over.
	if err := a.end(ctx); err != nil {
		t.Fatal(err)
	}
	a2, _ := mustBegin(t, g, "a")
	b2, _ := mustBegin(t, gb, "b")
	took(b2.claim(ctx, 0)) // held by a's old incarnation; a's ID lives on
	if _, err := a2.claim(ctx, 0); !errors.Is(err, errBucketHeld) {
		t.Fatalf("a's new incarnation claims b's bucket: %v, want errBucketHeld", err)
	}
	if err := a.release(ctx, third); !errors.Is(err, errNotHeld) {
		t.Fatalf("a's old incarnation releases: %v, want errNotHeld", err)
	}
	t.Logf("tokens of bucket 0: %v", tokens)
}
