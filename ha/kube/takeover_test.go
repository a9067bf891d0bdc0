// The backend's writes at scale, on the real API server: a bucket
// written from the version the feed brought, with no read; a crashed
// replica's buckets rewritten by the survivors, each the buckets it owns;
// a member of another bucket count refused.

package kube

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bgctl/controller/ha"
	"k8s.io/client-go/rest"
)

// bucketReads counts the GETs of one group's bucket Leases a client
// sends, and in writes, if not nil, its updates and deletes of them and
// every create it sends (a create names its Lease in its body alone).
type bucketReads struct {
	rt     http.RoundTripper
	prefix string // "/leases/<group>-b-"
	n      *atomic.Int64
	writes *atomic.Int64
}

// RoundTrip counts req if it reads or writes a bucket, and sends it.
func (r bucketReads) RoundTrip(req *http.Request) (*http.Response, error) {
	bucket := strings.Contains(req.URL.Path, r.prefix)
	switch {
	case bucket && req.Method == http.MethodGet:
		r.n.Add(1)
	case r.writes != nil && (bucket || req.Method == http.MethodPost):
		r.writes.Add(1)
	}
	return r.rt.RoundTrip(req)
}

// backendOn returns the backend of member id in g, on clients of its own
// made of cfg.
func backendOn(t *testing.T, c *cluster, g *group, id string, cfg *rest.Config) *kubeBackend {
	t.Helper()
	return newKubeBackend(groupOn(t, c, g, cfg), id, slog.New(slog.DiscardHandler), nil, 5*time.Second)
}

// waitFor polls cond every 20ms until it holds, failing the test after
// within.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(within); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("not within %v: %s", within, what)
		}
	}
}

// A replica whose feed brought a bucket's version writes it with one
// update and no read; when that version is behind, the update conflicts,
// and one quorum read puts it right.
func TestBackendWritesFromTheFeedsVersion(t *testing.T) {
	t.Parallel()
	c := needCluster(t)
	g := newTestGroup(t, c, 4, nil)
	var reads atomic.Int64
	cfg := replicaConfig(c, nil)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return bucketReads{rt: rt, prefix: "/leases/" + g.name + bucketInfix, n: &reads}
	}
	a := backendOn(t, c, g, "r0", cfg)
	runBackend(t, a)
	other := backendOn(t, c, g, "r1", replicaConfig(c, nil))
	so, err := other.Begin(t.Context(), 0, testD, "digest")
	if err != nil {
		t.Fatal(err)
	}
	names := namesIn(g, 0, 4)
	if _, _, err := other.Claim(t.Context(), so.ID, names[:1]); err != nil {
		t.Fatal(err)
	}
	theirs := other.known(0).lease
	waitFor(t, 5*time.Second, "r0's feed brings r1's write of bucket 0", func() bool {
		k := a.known(0)
		return k != nil && k.lease != nil && rvOf(k.lease) >= rvOf(theirs)
	})
	sa, err := a.Begin(t.Context(), 0, testD, "digest")
	if err != nil {
		t.Fatal(err)
	}
	reads.Store(0)
	got, _, err := a.Claim(t.Context(), sa.ID, names[1:2])
	if err != nil || len(got) != 1 || !got[0].Mine {
		t.Fatalf("claim from the feed's version = %+v, %v", got, err)
	}
	if n := reads.Load(); n != 0 {
		t.Errorf("claim of a bucket the feed brought read it %d times, want none", n)
	}
	// Behind: r0 knows bucket 0 as r1's first write left it.
	if _, _, err := other.Claim(t.Context(), so.ID, names[2:3]); err != nil {
		t.Fatal(err)
	}
	// Once r0's feed brought that write, it brings nothing more of bucket
	// 0 that could replace the stale version set below.
	latest := other.known(0).lease
	waitFor(t, 5*time.Second, "r0's feed brings r1's second write of bucket 0", func() bool {
		k := a.known(0)
		return k != nil && k.lease != nil && rvOf(k.lease) >= rvOf(latest)
	})
	a.mu.Lock()
	a.buckets[0] = known{lease: theirs}
	a.mu.Unlock()
	reads.Store(0)
	got, _, err = a.Claim(t.Context(), sa.ID, names[3:4])
	if err != nil || len(got) != 1 || !got[0].Mine {
		t.Fatalf("claim from a version behind = %+v, %v", got, err)
	}
	if n := reads.Load(); n != 1 {
		t.Errorf("claim from a version behind read the bucket %d times, want one (after the conflict)", n)
	}
}

// A member whose bucket count differs from a live member's is refused at
// begin, with an error naming that member and its count, and leaves no
// Lease behind.
func TestBackendRefusesAnotherBucketCount(t *testing.T) {
	t.Parallel()
	c := needCluster(t)
	g := newTestGroup(t, c, 4, nil)
	first := backendOn(t, c, g, "r0", replicaConfig(c, nil))
	if _, err := first.Begin(t.Context(), 0, testD, "digest"); err != nil {
		t.Fatal(err)
	}
	wider, err := newGroup(nil, nil, g.name, 8, testD)
	if err != nil {
		t.Fatal(err)
	}
	second := backendOn(t, c, wider, "r1", replicaConfig(c, nil))
	_, err = second.Begin(t.Context(), 0, testD, "digest")
	if !errors.Is(err, errBucketCount) || !strings.Contains(err.Error(), g.memberName("r0")+" has 4 buckets") {
		t.Fatalf("begin with 8 buckets beside a member with 4: %v, want errBucketCount naming it", err)
	}
	if _, found, err := second.MemberSession(t.Context()); err != nil || found {
		t.Errorf("the refused member's Lease: found %v, %v; want none", found, err)
	}
}

// A crashed replica's names go to their new owners in one write per
// bucket, the buckets split over the survivors: each rewrites the
// buckets it owns (bucketOwner), once its own observer counts the crashed
// session ended (the one that proved it, and the one whose feed brought
// that proof's delete), and not before.
func TestBackendTakeOverSplitsTheBucketsOverTheSurvivors(t *testing.T) {
	t.Parallel()
	c := needCluster(t)
	g := newTestGroup(t, c, 16, nil)
	ids := []string{"r0", "r1", "r2"}
	backends := map[string]*kubeBackend{}
	sessions := map[string]ha.Session{}
	identities := map[string]string{}
	for _, id := range ids {
		b := backendOn(t, c, g, id, replicaConfig(c, nil))
		s, err := b.Begin(t.Context(), 0, testD, "digest")
		if err != nil {
			t.Fatal(err)
		}
		backends[id], sessions[id], identities[id] = b, s, b.live(s.ID).identity
	}
	survivors := []string{"r0", "r1"}
	for _, id := range survivors {
		runBackend(t, backends[id])
		stop := renewing(backends[id].live(sessions[id].ID))
		t.Cleanup(func() { _, _ = stop() })
	}
	var names []string
	for k := range 200 {
		names = append(names, "name-"+string(rune('a'+k%26))+strings.Repeat("x", k/26))
	}
	crashedNames := map[string]bool{}
	for _, id := range ids {
		var mine []string
		for _, n := range names {
			if scaleOwner(n, ids) == id {
				mine = append(mine, n)
			}
		}
		if id == "r2" {
			for _, n := range mine {
				crashedNames[n] = true
			}
		}
		if got, _, err := backends[id].Claim(t.Context(), sessions[id].ID, mine); err != nil || len(got) != len(mine) {
			t.Fatalf("%s's claim of its %d names: %d, %v", id, len(mine), len(got), err)
		}
	}
	// r2 crashes: it never renews. Until a survivor counts it ended,
	// takeOver writes nothing.
	ownerOf := func(n string) string { return scaleOwner(n, survivors) }
	waitFor(t, 5*time.Second, "both survivors' feeds show the three members", func() bool {
		return len(backends["r0"].liveMembers()) == 3 && len(backends["r1"].liveMembers()) == 3
	})
	for _, id := range survivors {
		if n, err := backends[id].takeOver(t.Context(), sessions[id].ID, ownerOf); err != nil || n != 0 {
			t.Fatalf("%s's takeOver while r2 is live: %d buckets, %v; want none", id, n, err)
		}
	}
	waitFor(t, 3*testD, "both survivors count r2 ended", func() bool {
		return backends["r0"].o.ended(identities["r2"]) && backends["r1"].o.ended(identities["r2"])
	})
	wrote := map[string]int{}
	for _, id := range survivors {
		n, err := backends[id].takeOver(t.Context(), sessions[id].ID, ownerOf)
		if err != nil {
			t.Fatalf("%s's takeOver: %v", id, err)
		}
		wrote[id] = n
	}
	live := map[string]string{"r0": identities["r0"], "r1": identities["r1"]}
	withCrashed := 0
	for i := range g.buckets {
		claims, l := bucketNow(t, c, g, i)
		had := false
		for n, e := range claims {
			if !crashedNames[n] {
				continue
			}
			had = true
			if want := identities[ownerOf(n)]; e.session != want {
				t.Errorf("r2's %s is held by %s, want its new owner %s", n, e.session, want)
			}
		}
		if had {
			withCrashed++
			if owner := bucketOwner(i, live); holder(l) != identities[owner] {
				t.Errorf("bucket %d was last written by %s, want its owner %s", i, holder(l), owner)
			}
		}
	}
	if wrote["r0"] == 0 || wrote["r1"] == 0 || wrote["r0"]+wrote["r1"] != withCrashed {
		t.Errorf("the survivors wrote %v buckets; want both some, %d in all (one per bucket that held r2's names)", wrote, withCrashed)
	}
}

// bucketLists counts the lists of bucket Leases a client sends, and
// sends every request.
type bucketLists struct {
	rt http.RoundTripper
	n  *atomic.Int64
}

func (r bucketLists) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method == http.MethodGet && strings.HasSuffix(req.URL.Path, "/leases") && strings.Contains(req.URL.Query().Get("labelSelector"), kindLabel+"="+kindBucket) {
		r.n.Add(1)
	}
	return r.rt.RoundTrip(req)
}

// A claim of names every bucket gives the session already (handed over
// by a survivor's takeOver, or claimed by a call whose answer was lost)
// reads them with one list of the buckets, not a read of each: at a
// client's rate limit, 256 reads would take seconds, and the names
// handed over would wait for them. It writes nothing.
func TestBackendClaimOfNamesHeldListsTheBucketsOnce(t *testing.T) {
	t.Parallel()
	c := needCluster(t)
	g := newTestGroup(t, c, 16, nil)
	var reads, writes, lists atomic.Int64
	cfg := replicaConfig(c, nil)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return bucketReads{rt: bucketLists{rt: rt, n: &lists}, prefix: "/leases/" + g.name + bucketInfix, n: &reads, writes: &writes}
	}
	b := backendOn(t, c, g, "r0", cfg)
	s := beginOn(t, b)
	keepRenewing(t, b, s)
	var names []string
	for i := range g.buckets {
		names = append(names, namesIn(g, i, 2)...)
	}
	if got, _, err := b.Claim(t.Context(), s.ID, names); err != nil || len(got) != len(names) {
		t.Fatalf("the first claim of %d names: %d, %v", len(names), len(got), err)
	}
	reads.Store(0)
	writes.Store(0)
	lists.Store(0)
	got, _, err := b.Claim(t.Context(), s.ID, names)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range got {
		if !c.Mine {
			t.Errorf("%s: not found held by the session", c.Name)
		}
	}
	if r, w, l := reads.Load(), writes.Load(), lists.Load(); r != 0 || w != 0 || l != 1 {
		t.Errorf("the claim of %d names held already in %d buckets read %d buckets, wrote %d times and listed %d times; want one list alone", len(names), g.buckets, r, w, l)
	}
}

// Rendezvous hashing spreads the buckets evenly over members whose IDs
// differ in one byte: of 256 buckets over r0 … r2, each owns between a
// fifth and a half, and a member's leaving moves only its own.
func TestBucketOwnerSpreadsEvenly(t *testing.T) {
	all := map[string]string{"r0": "", "r1": "", "r2": ""}
	two := map[string]string{"r0": "", "r1": ""}
	owned := map[string]int{}
	for i := range 256 {
		o := bucketOwner(i, all)
		owned[o]++
		if o != "r2" && bucketOwner(i, two) != o {
			t.Errorf("bucket %d moved from %s when r2 left", i, o)
		}
	}
	for id := range all {
		if owned[id] < 256/5 || owned[id] > 256/2 {
			t.Errorf("%s owns %d of 256 buckets: %v", id, owned[id], owned)
		}
	}
}

// A claim of an ended session's names waits for the survivors' rewrites
// only when this replica's ha asked for a hand-over (kubeBackend.TakeOver):
// driven without one, the claim writes at once
// (TestBackendClaimWaitsForAMissingHandOverOnce shows the wait when
// asked). Before, every claim of
// such names waited up to the request timeout (5s here) for rewrites
// nobody was making, and a session that was not renewed meanwhile ran
// past its validity (hatest's UnrenewedSessionEnds on a loaded machine).
func TestBackendClaimWaitsForHandOversOnlyWhenAsked(t *testing.T) {
	t.Parallel()
	c := needCluster(t)
	g := newTestGroup(t, c, 4, nil)
	r0 := backendOn(t, c, g, "r0", replicaConfig(c, nil))
	s0, err := r0.Begin(t.Context(), 0, testD, "digest")
	if err != nil {
		t.Fatal(err)
	}
	if got, _, err := r0.Claim(t.Context(), s0.ID, []string{"x"}); err != nil || len(got) != 1 {
		t.Fatalf("r0's claim: %d, %v", len(got), err)
	}
	id0 := r0.live(s0.ID).identity
	r1 := backendOn(t, c, g, "r1", replicaConfig(c, nil))
	runBackend(t, r1)
	s1, err := r1.Begin(t.Context(), 0, testD, "digest")
	if err != nil {
		t.Fatal(err)
	}
	stop := renewing(r1.live(s1.ID))
	t.Cleanup(func() { _, _ = stop() })
	waitFor(t, 3*testD, "r1 counts r0's unrenewed session ended", func() bool { return r1.o.ended(id0) })
	start := time.Now()
	got, _, err := r1.Claim(t.Context(), s1.ID, []string{"x"})
	took := time.Since(start)
	if err != nil || len(got) != 1 || !got[0].Mine {
		t.Fatalf("r1's claim of x: %+v, %v; want ours", got, err)
	}
	if took >= r1.requestTimeout {
		t.Errorf("r1's claim of x, no hand-over asked, took %v: it waited for a rewrite nobody makes", took)
	}
}

// A claim of a crashed session's names waits for no hand-over that will
// not come: when this replica owns the buckets (bucketOwner) and no
// takeOver of its own runs, nobody else rewrites them, and the claim
// takes the names at once, not after the request timeout (5 s here),
// though its ha asked for a hand-over lately (noteHandOver).
func TestBackendClaimWaitsForNoTakeOverOfItsOwn(t *testing.T) {
	t.Parallel()
	c := needCluster(t)
	g := newTestGroup(t, c, 4, nil)
	a, sa := liveOn(t, c, g, "r0")
	var names []string
	for i := range g.buckets {
		names = append(names, namesIn(g, i, 1)...)
	}
	crashHolding(t, c, g, a, names, 1)
	a.noteHandOver() // as ha asks, with a takeOver that ended at once
	a.handOverDone()
	if took := claimEnded(t, a, sa, names); took >= 2*time.Second {
		t.Errorf("the claim of an ended session's names in buckets r0 owns, with no takeOver running, took %v; want well under the request timeout (5s)", took.Round(time.Millisecond))
	}
}

// A claim waits for a hand-over that does not come once, not once a
// call: here r1, live, owns buckets that give r2's names away, and never
// hands them over (its ha saw the end in a listing). r0's ha asked for a
// hand-over (noteHandOver): its first claim of r2's names there waits
// the request timeout (5 s here) and takes them itself; its second claim,
// of r2's other names in those buckets, waits no more, though its ha
// asked again. Each claim of a crashed replica's share waiting the
// whole timeout again would hold the share that long per claim.
func TestBackendClaimWaitsForAMissingHandOverOnce(t *testing.T) {
	t.Parallel()
	c := needCluster(t)
	g := newTestGroup(t, c, 16, nil)
	a, sa := liveOn(t, c, g, "r0")
	liveOn(t, c, g, "r1")
	survivors := map[string]string{"r0": "", "r1": ""}
	var first, second []string // names of r2 in the buckets r1 owns among the survivors
	for i := range g.buckets {
		if bucketOwner(i, survivors) == "r1" {
			names := namesIn(g, i, 2)
			first, second = append(first, names[0]), append(second, names[1])
		}
	}
	if len(first) == 0 {
		t.Fatal("r1 owns none of the buckets")
	}
	crashHolding(t, c, g, a, slices.Concat(first, second), 2)
	a.noteHandOver() // as ha asks, with a takeOver that ended at once
	a.handOverDone()
	if took := claimEnded(t, a, sa, first); took < a.requestTimeout {
		t.Errorf("the first claim of r2's names in buckets r1 owns took %v; want the request timeout (%v), waiting for r1's hand-over", took.Round(time.Millisecond), a.requestTimeout)
	}
	a.noteHandOver() // as ha asks, with a takeOver that ended at once
	a.handOverDone()
	if took := claimEnded(t, a, sa, second); took >= 2*time.Second {
		t.Errorf("the second claim of r2's names in buckets r1 never hands over took %v; want no second wait for the request timeout (5s)", took.Round(time.Millisecond))
	}
}

// crashHolding has replica r2 of g claim names and crash (it never
// renews), and waits until a counts r2's session ended, a's feed brought
// r2's writes of the buckets, and it shows live members of its own.
func crashHolding(t *testing.T, c *cluster, g *group, a *kubeBackend, names []string, live int) {
	t.Helper()
	x := backendOn(t, c, g, "r2", replicaConfig(c, nil))
	sx := beginOn(t, x)
	if got, _, err := x.Claim(t.Context(), sx.ID, names); err != nil || len(got) != len(names) {
		t.Fatalf("r2's claim of %d names: %d, %v", len(names), len(got), err)
	}
	crashed := x.live(sx.ID).identity
	waitFor(t, 5*testD, "a counts r2 ended, and its feed shows r2's entries and the live members", func() bool {
		if m := a.liveMembers(); len(m) != live || !a.o.ended(crashed) {
			return false
		}
		for i := range g.buckets {
			if xk := x.known(i); xk != nil && xk.lease != nil {
				if k := a.known(i); k == nil || k.lease == nil || rvOf(k.lease) < rvOf(xk.lease) {
					return false
				}
			}
		}
		return true
	})
}

// claimEnded has session s of a claim names, held by an ended session,
// fails the test unless it gets them all, and answers how long the call
// took.
func claimEnded(t *testing.T, a *kubeBackend, s ha.Session, names []string) time.Duration {
	t.Helper()
	start := time.Now()
	got, _, err := a.Claim(t.Context(), s.ID, names)
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	for _, cl := range got {
		if !cl.Mine {
			t.Errorf("%s: not taken from the ended session", cl.Name)
		}
	}
	return took
}

// liveOn returns the backend of member id in g, running, and its session,
// renewed until the test ends.
func liveOn(t *testing.T, c *cluster, g *group, id string) (*kubeBackend, ha.Session) {
	t.Helper()
	b := backendOn(t, c, g, id, replicaConfig(c, nil))
	runBackend(t, b)
	s := beginOn(t, b)
	keepRenewing(t, b, s)
	return b, s
}

// A claim waits for a hand-over that goes on, past a request timeout:
// here r1, the owner of three buckets that give crashed r2's names to
// r0 (bucketOwner), rewrites them one a second, as a survivor does at
// its client's rate limit on a loaded machine, and r0's claim of those
// names, its request timeout 2 s, finds each given to it and writes
// none of them. Before, the claim gave up a request timeout after it
// began and wrote the buckets not rewritten yet, each a second write
// of the bucket and a conflict for its owner's rewrite (a crash at
// 3,000 names under load took 404 writes and 108 conflicts, for 256
// buckets). The wait still ends a request timeout after the last
// rewrite it saw (TestBackendClaimWaitsForAMissingHandOverOnce), and D
// after it began at the latest (TestBackendClaimWaitsForAHandOverAtMostD).
func TestBackendClaimWaitsForAHandOverThatGoesOn(t *testing.T) {
	t.Parallel()
	if took, w := claimHandedOneASecond(t, 3); w != 0 {
		t.Errorf("r0's claim of 3 names, which r1 was handing over one bucket a second, wrote %d times after %v; want none: each was handed to it", w, took.Round(time.Millisecond))
	}
}

// A claim waits for a hand-over that goes on no longer than D (6 s
// here) from its start: here r1 rewrites ten buckets one a second, and
// r0's claim of r2's names in them, its request timeout 2 s, gives up
// after six and writes the rest itself. Without the bound, a hand-over
// that trickles on would hold the claim, and the names of every bucket
// already handed over with it, as long as it lasts (here 10 s).
func TestBackendClaimWaitsForAHandOverAtMostD(t *testing.T) {
	t.Parallel()
	if took, _ := claimHandedOneASecond(t, 10); took >= handOverD+1500*time.Millisecond {
		t.Errorf("r0's claim of 10 names, which r1 was handing over one bucket a second, took %v; want about D (%v)", took.Round(time.Millisecond), handOverD)
	}
}

// handOverD is the D of claimHandedOneASecond's group: the whole bound
// of a claim's wait, its request timeout being shorter.
const handOverD = 6 * time.Second

// claimHandedOneASecond has r2 claim a name in each of n buckets that
// r1 owns among r0 and r1 (bucketOwner), in a group of 32 buckets and D
// handOverD, and crash; then r1 hands those names to r0 one bucket a
// second, while r0, its request timeout 2 s and its ha having asked for
// a hand-over, claims them all. It fails the test unless r0 gets every
// name and r1's writes succeed, and answers how long r0's claim took
// and how many bucket writes r0 sent meanwhile.
func claimHandedOneASecond(t *testing.T, n int) (time.Duration, int64) {
	t.Helper()
	c := needCluster(t)
	gr := newTestGroupOf(t, c, 32, handOverD, nil)
	var reads, writes atomic.Int64
	cfg := replicaConfig(c, nil)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return bucketReads{rt: rt, prefix: "/leases/" + gr.name + bucketInfix, n: &reads, writes: &writes}
	}
	a := newKubeBackend(groupOn(t, c, gr, cfg), "r0", slog.New(slog.DiscardHandler), nil, 2*time.Second)
	runBackend(t, a)
	sa := beginOn(t, a)
	keepRenewing(t, a, sa)
	r1, s1 := liveOn(t, c, groupOn(t, c, gr, replicaConfig(c, nil)), "r1")
	var buckets []int
	var names []string
	for i := range gr.buckets {
		if bucketOwner(i, map[string]string{"r0": "", "r1": ""}) == "r1" && len(buckets) < n {
			buckets = append(buckets, i)
			names = append(names, namesIn(gr, i, 1)...)
		}
	}
	if len(buckets) < n {
		t.Fatalf("r1 owns %d of the %d buckets among r0 and r1; want at least %d", len(buckets), gr.buckets, n)
	}
	crashHolding(t, c, gr, a, names, 2)
	toA := a.live(sa.ID).identity
	a.noteHandOver() // as ha asks, with a takeOver of its own that ended at once: the buckets are r1's
	a.handOverDone()
	w0 := writes.Load()
	handed := make(chan error, 1)
	go func() { // joined below: r1 hands its buckets over, one a second
		for k, i := range buckets {
			time.Sleep(time.Second)
			if _, err := r1.g.change(t.Context(), r1.o, i, claimChange{give: map[string]string{names[k]: toA}, othersOnly: true}, r1.live(s1.ID).writer(), nil); err != nil {
				handed <- fmt.Errorf("r1's hand-over of bucket %d: %w", i, err)
				return
			}
		}
		handed <- nil
	}()
	took := claimEnded(t, a, sa, names)
	w := writes.Load() - w0
	if err := <-handed; err != nil {
		t.Fatal(err)
	}
	return took, w
}

// Claims that wait for hand-overs at once share one list of the buckets
// every handOverPoll: each list decodes every bucket (2.5 MB at 100,000
// names), and a replica whose ha claims a crashed share in several
// calls would otherwise send as many lists a poll as it has calls
// waiting, on the same rate limit as the hand-over's writes. Here two
// claims of r0 wait the request timeout (2 s) for a hand-over r1 never
// makes, beside each other.
func TestBackendClaimsWaitingShareTheirLists(t *testing.T) {
	t.Parallel()
	var lists atomic.Int64
	a, sa, names := waitingOnR1(t, 2*time.Second, 2, &lists)
	l0 := lists.Load()
	start := time.Now()
	var wg sync.WaitGroup
	for _, part := range names {
		wg.Go(func() { // joined below
			if got, _, err := a.Claim(t.Context(), sa.ID, part); err != nil || len(got) != len(part) {
				t.Errorf("r0's claim of %d names: %d, %v", len(part), len(got), err)
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	if n, most := lists.Load()-l0, int64(took/handOverPoll)+2; n > most {
		t.Errorf("two claims waiting %v beside each other listed the buckets %d times; want at most %d, one a poll (%v) and the claims' own", took.Round(time.Millisecond), n, most, handOverPoll)
	}
}

// A claim that waits alone lists the buckets every handOverPoll, as a
// claim beside others shares theirs: a rewrite the feed has not
// brought yet is seen within a poll. Here r0's claim waits the request
// timeout (4 s) for a hand-over r1 never makes. Before, a list was
// skipped whenever one had begun less than a poll before, its own
// included, and its ticks, a little late one time and less the next,
// made it skip about every other one: 9 or 10 lists in 4 s, 16 polls
// due (15 now).
func TestBackendClaimWaitingAloneListsEveryPoll(t *testing.T) {
	t.Parallel()
	var lists atomic.Int64
	a, sa, names := waitingOnR1(t, 4*time.Second, 1, &lists)
	l0 := lists.Load()
	took := claimEnded(t, a, sa, names[0])
	if n, least := lists.Load()-l0, int64(took/handOverPoll)*3/4; n < least {
		t.Errorf("a claim waiting alone %v listed the buckets %d times; want at least %d, about one a poll (%v)", took.Round(time.Millisecond), n, least, handOverPoll)
	}
}

// waitingOnR1 starts r0, its request timeout timeout and its lists of
// bucket Leases counted in lists, and r1, both live in a group of 16
// buckets, and has r2 claim perBucket names in each bucket r1 owns
// among them and crash. r0's ha has asked for a hand-over, its own
// takeOver ended at once; r1 makes none. It answers r0, its session
// and r2's names, the k-th of each bucket in names[k].
func waitingOnR1(t *testing.T, timeout time.Duration, perBucket int, lists *atomic.Int64) (*kubeBackend, ha.Session, [][]string) {
	t.Helper()
	c := needCluster(t)
	g := newTestGroup(t, c, 16, nil)
	cfg := replicaConfig(c, nil)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return bucketLists{rt: rt, n: lists} }
	a := newKubeBackend(groupOn(t, c, g, cfg), "r0", slog.New(slog.DiscardHandler), nil, timeout)
	runBackend(t, a)
	sa := beginOn(t, a)
	keepRenewing(t, a, sa)
	liveOn(t, c, g, "r1")
	names := make([][]string, perBucket)
	for i := range g.buckets {
		if bucketOwner(i, map[string]string{"r0": "", "r1": ""}) == "r1" {
			for k, n := range namesIn(g, i, perBucket) {
				names[k] = append(names[k], n)
			}
		}
	}
	crashHolding(t, c, g, a, slices.Concat(names...), 2)
	a.noteHandOver() // as ha asks, with a takeOver of its own that ended at once: the buckets are r1's
	a.handOverDone()
	return a, sa, names
}

// A claim's wait starts its give-up timer again at a rewrite it sees,
// not when its own replica's takeOver ends: the buckets that one leaves
// unwritten (a write that failed) are the claim's to write, no sign
// that the other survivors' hand-over goes on. Here r0's takeOver runs
// until 2.5 s into r0's claim, its request timeout 3 s, and ends
// without a write; r1 never hands its buckets over. The claim gives up
// at the request timeout. Before, the end of r0's takeOver dropped its
// buckets from the wait and started the timer again: 5.5 s, within the
// wait's whole bound, D (6 s).
func TestBackendClaimWaitsNoLongerForItsOwnTakeOversEnd(t *testing.T) {
	t.Parallel()
	c := needCluster(t)
	g := newTestGroupOf(t, c, 16, 6*time.Second, nil)
	a := newKubeBackend(groupOn(t, c, g, replicaConfig(c, nil)), "r0", slog.New(slog.DiscardHandler), nil, 3*time.Second)
	runBackend(t, a)
	sa := beginOn(t, a)
	keepRenewing(t, a, sa)
	liveOn(t, c, g, "r1")
	var names []string // a name of r2 in each bucket: r0 owns some, r1 the others
	for i := range g.buckets {
		names = append(names, namesIn(g, i, 1)...)
	}
	crashHolding(t, c, g, a, names, 2)
	a.noteHandOver() // as ha asks; its takeOver ends below, having written nothing
	ended := make(chan struct{})
	go func() { // joined below
		defer close(ended)
		time.Sleep(2500 * time.Millisecond)
		a.handOverDone()
	}()
	took := claimEnded(t, a, sa, names)
	<-ended
	if took >= a.requestTimeout+1500*time.Millisecond {
		t.Errorf("r0's claim, its takeOver ending unwritten 2.5 s in and r1 handing nothing over, took %v; want about the request timeout (%v)", took.Round(time.Millisecond), a.requestTimeout)
	}
}
