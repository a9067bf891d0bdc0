// ha's feed on Kubernetes (kubeBackend.Watch) on the real API server, as
// the replicas: what each write shows, and a session's end in one batch
// only once the observer counts it ended.

package kube

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bgctl/controller/ha"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// feedRecord is a feed's deliveries as the test reads them: a line per
// position with changes (sorted within it), and when each line came.
type feedRecord struct {
	lines []string
	when  []time.Time
}

// readFeed receives f's batches until until says the lines so far are
// enough, or within fails the test. It fails the test as well on a
// failed batch, a change outside its batch's position or before an
// earlier one, and a position whose changes come in two batches.
func readFeed(t *testing.T, f ha.Feed, from int64, sessions map[ha.SessionID]string, within time.Duration, until func(lines []string) bool) feedRecord {
	t.Helper()
	var rec feedRecord
	batchOf := map[int64]int{}
	last := from
	timeout := time.After(within)
	for n := 0; !until(rec.lines); n++ {
		var fb ha.FeedBatch
		select {
		case fb = <-f.Batches():
		case <-timeout:
			t.Fatalf("the feed delivered, in %v:\n%s", within, strings.Join(rec.lines, "\n"))
		}
		if fb.Err != nil {
			t.Fatalf("the feed failed: %v", fb.Err)
		}
		for _, c := range fb.Changes {
			if c.At < last || c.At > fb.At {
				t.Errorf("change %+v at %d: after %d, in a batch up to %d", c, c.At, last, fb.At)
			}
			if b, ok := batchOf[c.At]; ok && b != n {
				t.Errorf("the changes at position %d came in batches %d and %d", c.At, b, n)
			}
			if _, ok := batchOf[c.At]; !ok {
				batchOf[c.At] = n
				rec.lines = append(rec.lines, "")
				rec.when = append(rec.when, time.Now())
			}
			last = c.At
			at := strings.Split(rec.lines[len(rec.lines)-1], ", ")
			at = append(at, recordLine(c, sessions))
			slices.Sort(at)
			rec.lines[len(rec.lines)-1] = strings.TrimPrefix(strings.Join(at, ", "), ", ")
		}
	}
	return rec
}

// watchFrom lists the group as b and starts b's feed there; the feed is
// stopped, and its goroutines joined, when the test ends.
func watchFrom(t *testing.T, b *kubeBackend) (ha.Feed, int64) {
	t.Helper()
	_, from, err := b.List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	f := b.Watch(from, &wg)
	t.Cleanup(func() {
		f.Stop()
		wg.Wait()
	})
	return f, from
}

// A feed from a listing shows a claim of two names of one bucket at one
// position, a hand-over as a put of the new holder, a release alone at
// its own position, and a crashed member's end (its member record, its
// two holdings in two buckets and its published chunk) in one batch at
// one position, once the watcher's observer proved it ended, D after it
// last saw the member's Lease: on Kubernetes entries stay in their
// buckets, and nothing else says they are gone.
func TestBackendFeedShowsClaimsAHandOverAReleaseAndAnEnd(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	g, a, sa, w := pairOf(t, "da")
	x, sx := begunIn(t, g, "r2", "dx")
	stop := renewing(a.live(sa.ID))
	defer stop()
	z, u := namesIn(g, 1, 1)[0], namesIn(g, 2, 1)[0]
	if _, _, err := x.Claim(ctx, sx.ID, []string{z, u}); err != nil {
		t.Fatal(err)
	}
	if err := x.Publish(ctx, sx.ID, "dx", "", [][]byte{[]byte("set")}); err != nil {
		t.Fatal(err)
	}
	crashed := time.Now() // r2 renews no more; the listing below stamps its Lease after this
	f, from := watchFrom(t, w)

	both := namesIn(g, 0, 2)
	if _, _, err := a.Claim(ctx, sa.ID, both); err != nil {
		t.Fatal(err)
	}
	given, err := a.g.change(ctx, a.o, 0, claimChange{give: map[string]string{both[0]: x.live(sx.ID).identity}}, a.live(sa.ID).writer(), nil)
	if err != nil {
		t.Fatal(err)
	}
	at := position(given.lease, given.claims[both[0]].token)
	if err := x.Release(ctx, ha.Claim{Name: both[0], Revision: at}); err != nil {
		t.Fatal(err)
	}
	sessions := map[ha.SessionID]string{sa.ID: "r0", sx.ID: "r2"}
	rec := readFeed(t, f, from, sessions, 10*testD, func(lines []string) bool {
		return len(lines) > 0 && strings.Contains(lines[len(lines)-1], "gone r2")
	})
	sameLines(t, "the feed, a line per position", rec.lines,
		fmt.Sprintf("claim %s by r0 of r0, claim %s by r0 of r0", both[0], both[1]),
		fmt.Sprintf("claim %s by r2 of r2", both[0]),
		"released "+both[0],
		fmt.Sprintf("chunk gone r2/dx 0/1, gone r2, released %s, released %s", min(u, z), max(u, z)))
	if end := rec.when[len(rec.when)-1]; end.Before(crashed.Add(testD)) {
		t.Errorf("r2's end came %v after its last write, before D", end.Sub(crashed))
	}
}

// An administrator's delete of a member Lease (kubectl delete, no
// precondition) is not the session's end: the holder may have renewed
// just before it. The feed shows the member gone only D after the
// watcher's observer last stamped the Lease, in one batch with the
// member's holding.
func TestBackendFeedShowsAnEarlyEndOnlyDAfterTheLastStamp(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	g, a, sa, w := pairOf(t, "da")
	name := namesIn(g, 3, 1)[0]
	if _, _, err := a.Claim(ctx, sa.ID, []string{name}); err != nil {
		t.Fatal(err)
	}
	f, from := watchFrom(t, w)
	stop := renewing(a.live(sa.ID))
	time.Sleep(testD / 2)
	identity := a.live(sa.ID).identity
	if err := needCluster(t).admin.CoordinationV1().Leases(replicaNamespace).Delete(ctx, g.memberName("r0"), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	rec := readFeed(t, f, from, map[ha.SessionID]string{sa.ID: "r0"}, 5*testD, func(lines []string) bool { return len(lines) > 0 })
	_, _ = stop()
	w.o.mu.Lock()
	e, ok := w.o.ends[identity]
	w.o.mu.Unlock()
	sameLines(t, "the feed", rec.lines, "gone r0, released "+name)
	if due := e.since.Add(e.duration); !ok || e.proven || rec.when[0].Before(due) || rec.when[0].After(due.Add(testD)) {
		t.Errorf("the end came at %v, the watcher counting it from %v (known %v, proven %v): want D after", rec.when[0], e.since, ok, e.proven)
	}
}

// A listing the watch made after its history expired (410) fails the
// feed, for ha to list again, rather than come as changes: its versions
// may each stand for several writes, and two releases of one bucket
// would come as two deletions at one position, a session's end to ha.
func TestBackendFeedFailsWhenItsWatchExpires(t *testing.T) {
	g := &group{name: "g", buckets: 4, duration: testD}
	v, err := newGroupView(g, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if chs, _, err := v.take(change{kind: changeSnapshot, rv: "7"}); !errors.Is(err, errHistoryExpired) {
		t.Errorf("a snapshot taken into the view: %+v, %v; want errHistoryExpired", chs, err)
	}
}

// A feed whose watch's history expired under it (410 Gone: etcd
// compacted past the listing it starts from) fails with one batch,
// errHistoryExpired, and delivers nothing after it, for ha to list
// again; its goroutines end once it is stopped. The watcher reads
// through a server without a watch cache, which answers a watch from a
// compacted version with 410 at once.
func TestBackendFeedFailsOnceWhenItsHistoryExpires(t *testing.T) {
	c := needCluster(t)
	ctx := t.Context()
	g, a, sa, _ := pairOf(t, "d")
	leases := uncachedServer(t, c).CoordinationV1().Leases(replicaNamespace)
	ug, err := newGroup(leases, leases, g.name, g.buckets, g.duration)
	if err != nil {
		t.Fatal(err)
	}
	w := newKubeBackend(ug, "r1", slog.New(slog.DiscardHandler), nil, 5*time.Second)
	_, from, err := w.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Renew(ctx, sa.ID); err != nil { // the other server took a while to start
		t.Fatal(err)
	}
	if _, _, err := a.Claim(ctx, sa.ID, namesIn(g, 1, 1)); err != nil {
		t.Fatal(err)
	}
	compactEtcd(t, c, a.known(1).lease.ResourceVersion)

	var wg sync.WaitGroup
	f := w.Watch(from, &wg)
	select {
	case fb := <-f.Batches():
		if !errors.Is(fb.Err, errHistoryExpired) {
			t.Errorf("the feed from a compacted listing delivered %+v, want errHistoryExpired", fb)
		}
	case <-time.After(5 * testD):
		t.Fatal("the feed from a compacted listing delivered nothing")
	}
	select {
	case fb := <-f.Batches():
		t.Errorf("the feed delivered %+v after it failed", fb)
	case <-time.After(testD / 2): // four of its ticks
	}
	f.Stop()
	joined := make(chan struct{})
	go func() { // ends with wg.Wait
		wg.Wait()
		close(joined)
	}()
	select {
	case <-joined:
	case <-time.After(5 * testD):
		t.Fatal("the failed feed's goroutines still run after stop")
	}
}
