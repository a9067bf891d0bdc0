// A session's graceful end (ha's Leave: kubeBackend.End) as the other
// replicas see it, on the real API server: one batch at one position,
// at once, and nothing after it that changes their view.

package kube

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bgctl/controller/ha"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// endLine is the feed's line of the end of member id's session: its
// record, its holdings of names and its chunks (chunkLines), gone at
// one position.
func endLine(id string, names []string, chunkLines ...string) string {
	parts := append([]string{"gone " + id}, chunkLines...)
	for _, n := range names {
		parts = append(parts, "released "+n)
	}
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}

// A graceful end (ha's Leave: the member record marked leaving, then
// end) reaches another replica's feed as one batch at one position, at
// once: the member record, every holding (two of them in one bucket, the
// others in buckets of their own) and the published chunk. Nothing the
// end writes after it (the removal of its entries, the withdrawal of its
// set, the deletion of its Lease) changes the view: the next line is
// another replica's claim. Had each bucket's removal come on its own,
// ha would read the two names of one bucket gone at one position as the
// session's end, and the others as releases.
func TestBackendEndComesInOneBatchAtOnce(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	g, a, sa, w := pairOf(t, "da")
	x, sx := begunIn(t, g, "r2", "dx")
	defer func() { _ = x.End(ctx, sx.ID) }()
	held := slices.Concat(namesIn(g, 0, 2), namesIn(g, 1, 1), namesIn(g, 2, 1))
	if got, _, err := a.Claim(ctx, sa.ID, held); err != nil || len(got) != len(held) {
		t.Fatalf("claim of %v = %+v, %v", held, got, err)
	}
	if err := a.Publish(ctx, sa.ID, "da", "", [][]byte{[]byte("set")}); err != nil {
		t.Fatal(err)
	}
	f, from := watchFrom(t, w)

	sent := time.Now()
	if ok, err := a.PutMember(ctx, sa.ID, "da", true); !ok || err != nil {
		t.Fatalf("marking r0 leaving = %v, %v", ok, err)
	}
	if err := a.End(ctx, sa.ID); err != nil {
		t.Fatalf("end: %v", err)
	}
	next := namesIn(g, 3, 1)[0]
	if got, _, err := x.Claim(ctx, sx.ID, []string{next}); err != nil || len(got) != 1 || !got[0].Mine {
		t.Fatalf("r2's claim of %s = %+v, %v", next, got, err)
	}
	sessions := map[ha.SessionID]string{sa.ID: "r0", sx.ID: "r2"}
	rec := readFeed(t, f, from, sessions, 5*testD, func(lines []string) bool {
		return len(lines) > 0 && strings.Contains(lines[len(lines)-1], "claim "+next)
	})
	sameLines(t, "the feed, a line per position", rec.lines,
		"member r0 of r0 digest=da leaving=true",
		endLine("r0", held, "chunk gone r0/da 0/1"),
		fmt.Sprintf("claim %s by r2 of r2", next))
	if len(rec.when) > 1 && !rec.when[1].Before(sent.Add(testD)) {
		t.Errorf("r0's end came %v after its last renewal was sent: not at once", rec.when[1].Sub(sent))
	}
}

// claimedBesideAWatcher begins a session of a and has it claim held,
// then begins r1 beside it, renewing until the test ends and watching
// the group from a listing (watchFrom): the replica that sees a's end.
func claimedBesideAWatcher(t *testing.T, a *kubeBackend, held []string) (sa ha.Session, b *kubeBackend, sb ha.Session, f ha.Feed, from int64) {
	t.Helper()
	sa = beginOn(t, a)
	if got, _, err := a.Claim(t.Context(), sa.ID, held); err != nil || len(got) != len(held) {
		t.Fatalf("claim of %v = %+v, %v", held, got, err)
	}
	b, sb = begunIn(t, a.g, "r1", "db")
	keepRenewing(t, b, sb)
	t.Cleanup(func() { _ = b.End(context.Background(), sb.ID) })
	f, from = watchFrom(t, b)
	return sa, b, sb, f, from
}

// refusing fails, without sending it, every request that refuse
// matches, as a connection that drops before the request leaves would.
type refusing struct {
	rt     http.RoundTripper
	refuse func(req *http.Request) bool
}

// RoundTrip fails req if refuse matches it, else sends it.
func (r *refusing) RoundTrip(req *http.Request) (*http.Response, error) {
	if r.refuse(req) {
		return nil, fmt.Errorf("refused by the test: %s %s", req.Method, req.URL.Path)
	}
	return r.rt.RoundTrip(req)
}

// A session's end is its end mark: once end has written it into the
// member Lease, another replica's feed shows the end at once and its
// claim takes the session's names, though nothing else of the end lands
// (the removal of its entries and the deletion of its Lease fail here).
// The session is renewed no more: a renewal after the mark is refused,
// so the mark can never be lifted by its own holder. And the member,
// restarted, begins at once: the Lease its end left is one its own
// session said ended.
func TestBackendEndMarkFreesTheNamesAtOnce(t *testing.T) {
	var cut atomic.Bool
	bucketPrefix, memberPrefix := "", ""
	a := backendThrough(t, func(rt http.RoundTripper) http.RoundTripper {
		return &refusing{rt: rt, refuse: func(req *http.Request) bool {
			bucketWrite := req.Method != http.MethodGet && strings.Contains(req.URL.Path, bucketPrefix)
			memberDelete := req.Method == http.MethodDelete && strings.Contains(req.URL.Path, memberPrefix)
			return cut.Load() && (bucketWrite || memberDelete)
		}}
	})
	ctx, g := t.Context(), a.g
	bucketPrefix, memberPrefix = "/leases/"+g.name+bucketInfix, "/leases/"+g.name+memberInfix
	held := slices.Concat(namesIn(g, 0, 2), namesIn(g, 1, 1))
	sa, b, sb, f, from := claimedBesideAWatcher(t, a, held)

	sent := time.Now()
	if ok, err := a.PutMember(ctx, sa.ID, "digest", true); !ok || err != nil {
		t.Fatalf("marking r0 leaving = %v, %v", ok, err)
	}
	s := a.live(sa.ID)
	cut.Store(true)
	if err := a.End(ctx, sa.ID); err != nil {
		t.Errorf("end, whose mark landed: %v; want it ended", err)
	}
	rec := readFeed(t, f, from, map[ha.SessionID]string{sa.ID: "r0", sb.ID: "r1"}, 5*testD, func(lines []string) bool {
		return len(lines) > 0 && strings.Contains(lines[len(lines)-1], "gone r0")
	})
	sameLines(t, "the feed, a line per position", rec.lines,
		"member r0 of r0 digest=digest leaving=true",
		endLine("r0", held))
	if end := rec.when[len(rec.when)-1]; !end.Before(sent.Add(testD)) {
		t.Errorf("r0's end came %v after its last renewal was sent: not at once", end.Sub(sent))
	}
	got, _, err := b.Claim(ctx, sb.ID, held)
	if err != nil || len(got) != len(held) || slices.ContainsFunc(got, func(c ha.Claimed) bool { return !c.Mine }) {
		t.Errorf("r1's claim of r0's names after r0's end = %+v, %v; want all r1's", got, err)
	}
	if _, err := s.renew(ctx); err == nil {
		t.Error("r0's session renewed after its end mark")
	}
	if _, err := a.Renew(ctx, sa.ID); !errors.Is(err, ha.ErrSessionEnded) {
		t.Errorf("renew after end: %v, want ha.ErrSessionEnded", err)
	}
	l, err := needCluster(t).admin.CoordinationV1().Leases(replicaNamespace).Get(ctx, g.memberName("r0"), metav1.GetOptions{})
	if err != nil || l.Annotations[endedAnnotation] != s.identity {
		t.Fatalf("r0's member Lease after an end whose delete failed: %v; want it left, marked ended", err)
	}
	restarted := replicaBackend(t, g, "r0")
	s2, err := restarted.Begin(ctx, 0, testD, "digest")
	if err != nil {
		t.Fatalf("r0 restarted, its ended session's Lease left: %v; want it begun at once", err)
	}
	_ = restarted.End(ctx, s2.ID)
}

// begin from prev ends prev as end does: another replica's feed shows
// prev's member record and holdings gone in one batch at one position,
// then the member record of the new session, and nothing in between.
func TestBackendBeginFromPrevEndsPrevInOneBatch(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	g, a, sa, w := pairOf(t, "da")
	held := slices.Concat(namesIn(g, 0, 2), namesIn(g, 1, 1))
	if got, _, err := a.Claim(ctx, sa.ID, held); err != nil || len(got) != len(held) {
		t.Fatalf("claim of %v = %+v, %v", held, got, err)
	}
	f, from := watchFrom(t, w)
	s2, err := a.Begin(ctx, sa.ID, testD, "da")
	if err != nil {
		t.Fatalf("begin from prev: %v", err)
	}
	defer func() { _ = a.End(ctx, s2.ID) }()
	rec := readFeed(t, f, from, map[ha.SessionID]string{sa.ID: "prev", s2.ID: "next"}, 5*testD, func(lines []string) bool {
		return len(lines) > 0 && strings.Contains(lines[len(lines)-1], "member r0 of next")
	})
	sameLines(t, "the feed, a line per position", rec.lines,
		endLine("r0", held),
		"member r0 of next digest=da leaving=false")
}

// An end whose mark the server applied while its client gave up on it
// answers an error, and the session stays as it was to its holder; but
// the others take the mark as the end all the same, at once, and the
// holder's next end finds its session ended: its write names a version
// the mark replaced.
func TestBackendEndMarkLandedUnansweredEndsTheSession(t *testing.T) {
	late := &lateRenewals{sent: make(chan time.Time, 1), answered: make(chan error, 1)}
	a := backendThrough(t, func(rt http.RoundTripper) http.RoundTripper { late.rt = rt; return late })
	ctx, g := t.Context(), a.g
	held := namesIn(g, 0, 2)
	sa, _, sb, f, from := claimedBesideAWatcher(t, a, held)
	late.armed.Store(true)
	ended := time.Now()
	if err := a.End(ctx, sa.ID); err == nil || errors.Is(err, ha.ErrSessionEnded) {
		t.Errorf("end whose mark was not answered: %v; want a transient error", err)
	}
	<-late.sent
	if err := <-late.answered; err != nil {
		t.Fatalf("the mark, applied late: %v", err)
	}
	rec := readFeed(t, f, from, map[ha.SessionID]string{sa.ID: "r0", sb.ID: "r1"}, 5*testD, func(lines []string) bool {
		return len(lines) > 0 && strings.Contains(lines[len(lines)-1], "gone r0")
	})
	sameLines(t, "the feed, a line per position", rec.lines, endLine("r0", held))
	if end := rec.when[len(rec.when)-1]; !end.Before(ended.Add(testD)) {
		t.Errorf("r0's end came %v after its end was sent: not at once", end.Sub(ended))
	}
	if err := a.End(ctx, sa.ID); !errors.Is(err, ha.ErrSessionEnded) {
		t.Errorf("end again: %v, want ha.ErrSessionEnded", err)
	}
}
