// Review cases of kubeBackend's calls on the real API server: each
// checks one way a hostile schedule could give a name two holders, or
// leave a holding behind, and fails if the backend lets it.

package kube

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bgctl/controller/ha"
)

// beginOn begins a session of b's member, or fails the test.
func beginOn(t *testing.T, b *kubeBackend) ha.Session {
	t.Helper()
	s, err := b.Begin(t.Context(), 0, testD, "digest")
	if err != nil {
		t.Fatalf("begin %s: %v", b.id, err)
	}
	return s
}

// keepRenewing renews session s of b every D/4 until the test ends.
func keepRenewing(t *testing.T, b *kubeBackend, s ha.Session) {
	t.Helper()
	stop := renewing(b.live(s.ID))
	t.Cleanup(func() { _, _ = stop() })
}

// A survivor's takeOver gives away only names held by ended sessions,
// never one the survivor holds itself: its controller may be running it.
// Here survivor a plans the takeover of bucket i from a version its feed
// brought while crashed x held name n, and by the time it writes, a
// holds n itself (its own claim, or another survivor's hand-over, came
// between: the update conflicts and a reads the bucket again). The name
// must stay a's, not go to c, which would then run it beside a.
func TestReviewTakeOverLeavesTheWritersOwnNames(t *testing.T) {
	t.Parallel()
	c := needCluster(t)
	g := newTestGroup(t, c, 4, nil)
	a := backendOn(t, c, g, "a", replicaConfig(c, nil))
	other := backendOn(t, c, g, "c", replicaConfig(c, nil))
	x := backendOn(t, c, g, "x", replicaConfig(c, nil))
	sa, sc, sx := beginOn(t, a), beginOn(t, other), beginOn(t, x)
	i := 0
	for bucketOwner(i, map[string]string{"a": "", "c": ""}) != "a" {
		i++
	}
	n := namesIn(g, i, 1)[0]
	if got, _, err := x.Claim(t.Context(), sx.ID, []string{n}); err != nil || len(got) != 1 || !got[0].Mine {
		t.Fatalf("x's claim of %s = %+v, %v", n, got, err)
	}
	xIdentity, aIdentity := x.live(sx.ID).identity, a.live(sa.ID).identity
	keepRenewing(t, a, sa)
	keepRenewing(t, other, sc)
	// x crashes: a's observer proves it ended. Then a's feed stops, so
	// that the version of bucket i it planned from stays as it was.
	ctx, stopFeed := context.WithCancel(t.Context())
	ran := make(chan error, 1)
	go func() { ran <- a.run(ctx) }() // joined below
	waitFor(t, 3*testD, "a counts x ended and sees a and c live", func() bool {
		m := a.liveMembers()
		return a.o.ended(xIdentity) && len(m) == 2 && m["a"] != "" && m["c"] != ""
	})
	stopFeed()
	if err := <-ran; !errors.Is(err, context.Canceled) {
		t.Fatalf("a's run: %v", err)
	}
	stale := a.known(i)
	if stale == nil || stale.lease == nil {
		t.Fatalf("a's feed brought no version of bucket %d", i)
	}
	if got, _, err := a.Claim(t.Context(), sa.ID, []string{n}); err != nil || len(got) != 1 || !got[0].Mine {
		t.Fatalf("a's claim of crashed x's %s = %+v, %v; want ours", n, got, err)
	}
	a.mu.Lock()
	a.buckets[i] = *stale // the version takeOver plans from: before a's claim landed
	a.mu.Unlock()
	if _, err := a.takeOver(t.Context(), sa.ID, func(string) string { return "c" }); err != nil {
		t.Fatalf("takeOver: %v", err)
	}
	if claims, _ := bucketNow(t, c, g, i); claims[n].session != aIdentity {
		t.Errorf("after a's takeOver, %s is held by %q; want a's own holding (%s) left alone", n, claims[n].session, aIdentity)
	}
}

// begin from prev moves the member record, and prev's holdings go with
// prev at once, as end's would: the shared part begins from prev only
// once every controller of prev terminated, and its end of prev that
// follows answers ha.ErrSessionEnded. Another replica then claims a name
// prev held at once, not D after its observer found prev's Lease gone.
func TestReviewBeginFromPrevLetsPrevsNamesGo(t *testing.T) {
	t.Parallel()
	c := needCluster(t)
	st := newKubeStore(t, c)
	a, s1 := kubeBegin(t, st, "r0")
	x := namesIn(st.g, 0, 1)[0]
	if got, _, err := a.Claim(t.Context(), s1.ID, []string{x}); err != nil || len(got) != 1 || !got[0].Mine {
		t.Fatalf("claim of %s = %+v, %v", x, got, err)
	}
	s2, err := a.Begin(t.Context(), s1.ID, testD, "digest")
	if err != nil {
		t.Fatalf("begin from prev: %v", err)
	}
	defer func() { _ = a.End(t.Context(), s2.ID) }()
	if err := a.End(t.Context(), s1.ID); !errors.Is(err, ha.ErrSessionEnded) {
		t.Errorf("end of prev after begin moved the record: %v, want ha.ErrSessionEnded", err)
	}
	b, sb := kubeBegin(t, st, "r1")
	defer func() { _ = b.End(t.Context(), sb.ID) }()
	got, _, err := b.Claim(t.Context(), sb.ID, []string{x})
	if err != nil || len(got) != 1 || !got[0].Mine {
		claims, _ := bucketNow(t, c, st.g, 0)
		t.Errorf("r1's claim of %s, which r0's previous session held, right after r0 began from it = %+v, %v; want ours (bucket: %v)", x, got, err, claims)
	}
}

// pausedHolder begins r0 in a store of its own, has it claim the first
// held of held+more names of bucket 0 (all returned), and returns once
// r0 paused: it never renews, and the store's watcher proved its
// session ended (deleted its member Lease). got is the claim's answer.
func pausedHolder(t *testing.T, c *cluster, held, more int) (st kubeStore, a *kubeBackend, sa ha.Session, names []string, got []ha.Claimed) {
	t.Helper()
	st = newKubeStore(t, c)
	a, sa = kubeBegin(t, st, "r0")
	names = namesIn(st.g, 0, held+more)
	got, _, err := a.Claim(t.Context(), sa.ID, names[:held])
	if err != nil || len(got) != held {
		t.Fatalf("claim of %v = %+v, %v", names[:held], got, err)
	}
	for _, g := range got {
		if !g.Mine {
			t.Fatalf("claim of %v = %+v, want all ours", names[:held], got)
		}
	}
	waitFor(t, 3*testD, "the watcher deletes r0's member Lease", func() bool {
		_, found, err := a.MemberSession(t.Context())
		return err == nil && !found
	})
	return st, a, sa, names, got
}

// A claimer paused past its session's validity, whose session the
// others' observers have proven ended since, writes nothing when it
// wakes: its write from the version it knew conflicts (the bucket was
// written since), and the write it would retry from a new read is
// refused before it is sent. An entry written then would name a session
// whose Lease is gone, and keep the name from a replica that never saw
// that session for D; and its answer is refused all the same.
func TestReviewPausedClaimerWritesNothingAfterTheProof(t *testing.T) {
	t.Parallel()
	c := needCluster(t)
	st, a, sa, names, _ := pausedHolder(t, c, 1, 2)
	identity := a.live(sa.ID).identity
	// Another replica writes the bucket since.
	b, sb := kubeBegin(t, st, "r1")
	defer func() { _ = b.End(t.Context(), sb.ID) }()
	if got, _, err := b.Claim(t.Context(), sb.ID, names[1:2]); err != nil || len(got) != 1 || !got[0].Mine {
		t.Fatalf("r1's claim of %s = %+v, %v", names[1], got, err)
	}
	// r0 wakes and claims.
	got, _, err := a.Claim(t.Context(), sa.ID, names[2:])
	if err == nil {
		t.Errorf("r0's claim after its session was proven ended = %+v; want refused", got)
	}
	if claims, _ := bucketNow(t, c, st.g, 0); claims[names[2]].session == identity {
		t.Errorf("r0's claim after its session was proven ended wrote %s under it: %v", names[2], claims)
	}
}

// backendThrough marks t parallel and returns the backend of r0 in a
// group of its own, its requests through the transport wrap makes.
func backendThrough(t *testing.T, wrap func(http.RoundTripper) http.RoundTripper) *kubeBackend {
	t.Helper()
	t.Parallel()
	c := needCluster(t)
	g := newTestGroup(t, c, 4, nil)
	cfg := replicaConfig(c, nil)
	cfg.WrapTransport = wrap
	return newKubeBackend(groupOn(t, c, g, cfg), "r0", slog.New(slog.DiscardHandler), nil, 5*time.Second)
}

// slowReads holds back the answer of every GET of a member Lease by
// delay, once it came from the server.
type slowReads struct {
	rt    http.RoundTripper
	delay atomic.Int64 // nanoseconds
}

// RoundTrip sends req, and holds a member Lease's GET answer back.
func (r *slowReads) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := r.rt.RoundTrip(req)
	if req.Method == http.MethodGet && strings.Contains(req.URL.Path, memberInfix) {
		time.Sleep(time.Duration(r.delay.Load()))
	}
	return resp, err
}

// TimeLeft of a live session is never ha.ErrSessionEnded, however its read
// and the session's own renewal interleave: here the read is answered
// with the version before a renewal, and the renewal is answered before
// TimeLeft compares that version with the session's last write.
func TestReviewTimeLeftDuringARenewalIsNotEnded(t *testing.T) {
	slow := &slowReads{}
	b := backendThrough(t, func(rt http.RoundTripper) http.RoundTripper { slow.rt = rt; return slow })
	s := beginOn(t, b)
	defer func() { _ = b.End(t.Context(), s.ID) }()
	slow.delay.Store(int64(time.Second))
	left := make(chan error, 1)
	go func() { _, _, err := b.TimeLeft(t.Context(), s.ID); left <- err }() // joined below
	// The read is answered, and held back; the renewal is not.
	time.Sleep(testD / 8)
	if _, err := b.Renew(t.Context(), s.ID); err != nil {
		t.Fatalf("renew: %v", err)
	}
	if err := <-left; err != nil {
		t.Errorf("TimeLeft of a live session read just before its renewal: %v, want its time left", err)
	}
}

// A replica paused past its session's proven end, whose names another
// replica took meanwhile, wakes, ends its session and releases a
// holding of it: neither touches the newer holding of the name, which is
// at a later position. Its end answers ha.ErrSessionEnded and writes
// nothing: its entries left are free to the others, whose observers
// count the session ended (an end's removal could otherwise reach an
// observer that does not yet, as several deletions at one position,
// which ha reads as the session's end).
func TestReviewLateReleaseAndEndLeaveNewerHoldings(t *testing.T) {
	t.Parallel()
	c := needCluster(t)
	st, a, sa, names, got := pausedHolder(t, c, 2, 0)
	x, y := names[0], names[1]
	old := ha.Claim{Name: x, Revision: kubeClaimedBy(got)[x].Revision}
	identity := a.live(sa.ID).identity
	// r1 takes x.
	b, sb := kubeBegin(t, st, "r1")
	keepRenewing(t, b, sb)
	var taken ha.Claimed
	waitFor(t, 3*testD, "r1 takes x from r0's ended session", func() bool {
		got, _, err := b.Claim(t.Context(), sb.ID, []string{x})
		if err == nil && len(got) == 1 && got[0].Mine {
			taken = got[0]
		}
		return taken.Mine
	})
	if taken.Revision <= old.Revision {
		t.Errorf("r1's holding of %s at position %d, r0's was at %d: want a later one", x, taken.Revision, old.Revision)
	}
	// r0 wakes, its version of the bucket the one it wrote.
	if err := a.End(t.Context(), sa.ID); !errors.Is(err, ha.ErrSessionEnded) {
		t.Errorf("r0's late end: %v, want ha.ErrSessionEnded", err)
	}
	if err := a.Release(t.Context(), old); err != nil {
		t.Errorf("r0's late release: %v", err)
	}
	claims, _ := bucketNow(t, c, st.g, 0)
	if e, ok := claims[x]; !ok || e.session != b.live(sb.ID).identity || e.token != taken.Token {
		t.Errorf("after r0's late release and end, %s is %+v (held %v); want r1's holding, token %d", x, e, ok, taken.Token)
	}
	if e := claims[y]; e.session != identity {
		t.Errorf("after r0's late end, %s is %+v; want r0's entry left as it was", y, e)
	}
	if got, _, err := b.Claim(t.Context(), sb.ID, []string{y}); err != nil || len(got) != 1 || !got[0].Mine {
		t.Errorf("r1's claim of %s, left by r0's ended session = %+v, %v; want r1's", y, got, err)
	}
}

// failDeletes fails the next n DELETE requests of member Leases without
// sending them, as a connection that drops would.
type failDeletes struct {
	rt http.RoundTripper
	n  atomic.Int64
}

// RoundTrip fails req if it deletes a member Lease and failures are
// left, else sends it.
func (f *failDeletes) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method == http.MethodDelete && strings.Contains(req.URL.Path, memberInfix) && f.n.Add(-1) >= 0 {
		return nil, errors.New("connection reset before the request was sent")
	}
	return f.rt.RoundTrip(req)
}

// begin from prev that fails to delete prev's Lease (the request never
// reached the server) keeps prev: the next begin from prev deletes it
// and begins at once, rather than waiting D to prove prev ended.
func TestReviewBeginFromPrevKeepsPrevOnATransientError(t *testing.T) {
	fail := &failDeletes{}
	b := backendThrough(t, func(rt http.RoundTripper) http.RoundTripper { fail.rt = rt; return fail })
	s1 := beginOn(t, b)
	fail.n.Store(1)
	if _, err := b.Begin(t.Context(), s1.ID, testD, "digest"); err == nil {
		t.Fatal("begin from prev whose delete failed: no error")
	}
	s2, err := b.Begin(t.Context(), s1.ID, testD, "digest")
	if err != nil {
		t.Fatalf("begin from prev again, at once: %v", err)
	}
	_ = b.End(t.Context(), s2.ID)
}

// lateRenewals makes the next renewal (a PUT of a member Lease), once
// armed, fail at once on the client, as a request its client gave up
// on, and reach the server delay later all the same: sent receives the
// time it went out, answered its outcome.
type lateRenewals struct {
	rt       http.RoundTripper
	delay    time.Duration
	armed    atomic.Bool
	sent     chan time.Time // buffered: one
	answered chan error     // buffered: one
}

// RoundTrip sends req, unless it is the renewal armed for: that one is
// sent delay later by a goroutine of its own, which the test joins by
// receiving its answer.
func (l *lateRenewals) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method != http.MethodPut || !strings.Contains(req.URL.Path, memberInfix) || !l.armed.CompareAndSwap(true, false) {
		return l.rt.RoundTrip(req)
	}
	body, err := io.ReadAll(req.Body)
	if err != nil {
		return nil, err
	}
	later := req.Clone(context.Background())
	later.Body = io.NopCloser(bytes.NewReader(body))
	go func() { // joined by the test, through answered
		time.Sleep(l.delay)
		l.sent <- time.Now()
		resp, err := l.rt.RoundTrip(later)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("answered %s", resp.Status)
			}
		}
		l.answered <- err
	}()
	return nil, errors.New("the client gave up on the request")
}

// A renewal that the server applies after its client gave up on it
// counts for nothing to the holder, whose fence counts from its last
// answered renewal; to an observer it is a version of the member Lease
// like any other, stamped when its feed brings it, after its commit. So
// the observer shows the session's end no earlier than D after the late
// renewal went out, after the holder's validity ended; and the holder's
// next renewal is refused, its session ended.
func TestReviewLateRenewalCountsFromItsCommit(t *testing.T) {
	late := &lateRenewals{delay: testD / 2, sent: make(chan time.Time, 1), answered: make(chan error, 1)}
	a := backendThrough(t, func(rt http.RoundTripper) http.RoundTripper { late.rt = rt; return late })
	ctx := t.Context()
	sa := beginOn(t, a)
	w := replicaBackend(t, a.g, "r1")
	f, from := watchFrom(t, w)
	if _, err := a.Renew(ctx, sa.ID); err != nil {
		t.Fatalf("renew: %v", err)
	}
	s := a.live(sa.ID)
	late.armed.Store(true)
	if _, err := a.Renew(ctx, sa.ID); err == nil || errors.Is(err, ha.ErrSessionEnded) {
		t.Fatalf("the renewal given up on: %v; want a transient error", err)
	}
	sent := <-late.sent
	if err := <-late.answered; err != nil {
		t.Fatalf("the late renewal: %v", err)
	}
	s.mu.Lock()
	valid := s.valid
	s.mu.Unlock()
	if !valid.Before(sent.Add(testD)) {
		t.Fatalf("the holder's validity %v after the late renewal went out; want it counted from its last answered renewal", valid.Sub(sent))
	}
	rec := readFeed(t, f, from, map[ha.SessionID]string{sa.ID: "r0"}, 5*testD, func(lines []string) bool {
		return len(lines) > 0 && strings.Contains(lines[len(lines)-1], "gone r0")
	})
	sameLines(t, "the feed", rec.lines, "gone r0")
	if end := rec.when[len(rec.when)-1]; end.Before(sent.Add(testD)) {
		t.Errorf("r0's end came %v after its late renewal went out: before D", end.Sub(sent))
	}
	if _, err := a.Renew(ctx, sa.ID); !errors.Is(err, ha.ErrSessionEnded) {
		t.Errorf("renew after the late renewal and the end: %v, want ha.ErrSessionEnded", err)
	}
}

// A renewal the server applies after its client gave up on it is the
// session's own write: its next write, refused for that version, reads
// the Lease, finds it still the session's and unmarked, and goes on from
// it, so the session lives on (a Leave's leaving mark after a cancelled
// renewal used to lose it, and the Leave with it). A version that carries
// the session's end mark is not gone on from: the session is lost.
func TestReviewLateRenewalIsTheSessionsOwn(t *testing.T) {
	late := &lateRenewals{delay: testD / 20, sent: make(chan time.Time, 1), answered: make(chan error, 1)}
	a := backendThrough(t, func(rt http.RoundTripper) http.RoundTripper { late.rt = rt; return late })
	ctx := t.Context()
	sa := beginOn(t, a)
	late.armed.Store(true)
	if _, err := a.Renew(ctx, sa.ID); err == nil || errors.Is(err, ha.ErrSessionEnded) {
		t.Fatalf("the renewal given up on: %v; want a transient error", err)
	}
	<-late.sent
	if err := <-late.answered; err != nil {
		t.Fatalf("the late renewal: %v", err)
	}
	if written, err := a.PutMember(ctx, sa.ID, "digest", true); err != nil || !written {
		t.Fatalf("PutMember after a late renewal landed: %v, %v; want written, the session its own", written, err)
	}
	if _, err := a.Renew(ctx, sa.ID); err != nil {
		t.Fatalf("renew after: %v", err)
	}
	if got := memberAnnotationNow(t, kubeStore{g: a.g}, "r0"); !strings.Contains(got, "(leaving)") {
		t.Errorf("member record %q; want it marked leaving", got)
	}

	// An end mark whose answer was lost, but which landed: nothing goes
	// on past it.
	s := a.live(sa.ID)
	late.armed.Store(true)
	if err := s.markEnded(ctx); err == nil {
		t.Fatalf("the mark given up on answered nil")
	}
	<-late.sent
	if err := <-late.answered; err != nil {
		t.Fatalf("the late mark: %v", err)
	}
	if _, err := a.Renew(ctx, sa.ID); !errors.Is(err, ha.ErrSessionEnded) {
		t.Errorf("renew after the session's end mark landed: %v, want ha.ErrSessionEnded", err)
	}
}
