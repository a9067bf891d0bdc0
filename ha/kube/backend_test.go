// The contract of ha's backend interface (ha/backend.go; ten of the cases
// of package ha/hatest, ported) held against kubeBackend on the real
// kube-apiserver, each replica on the replicas' credentials (the
// manifest's Role and nothing more). Where Kubernetes answers otherwise
// than etcd, the case says so: a session nobody renews ends when another
// replica's observer proves it; every free name of a claim is taken at
// once; names of one bucket share one write.

package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/version"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
)

// kubeStore is one fresh group on the API server: backendFor returns the
// backend of a replica with that ID, on clients of its own; a watcher,
// another replica with no session, runs the group's feed and its
// observer (kubeBackend.run) for the case's length, as the group's other
// replicas would.
type kubeStore struct {
	g          *group
	backendFor func(id string) *kubeBackend
}

// newKubeStore returns a store on a group of its own with 4 buckets and
// D = testD, its watcher running until the test ends.
func newKubeStore(t *testing.T, c *cluster) kubeStore {
	t.Helper()
	g := newTestGroup(t, c, 4, nil)
	st := kubeStore{g: g, backendFor: func(id string) *kubeBackend {
		return newKubeBackend(otherReplica(t, c, g, nil), id, slog.New(slog.DiscardHandler), nil, 5*time.Second)
	}}
	runBackend(t, st.backendFor("watcher"))
	return st
}

// runBackend runs b (kubeBackend.run) until the test ends.
func runBackend(t *testing.T, b *kubeBackend) {
	t.Helper()
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.run(ctx) }() // joined by the cleanup
	t.Cleanup(func() {
		stop()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("run: %v, want context.Canceled", err)
		}
	})
}

// kubeConformanceCases are ha's conformance cases, ported.
var kubeConformanceCases = []struct {
	name string
	test func(t *testing.T, st kubeStore)
}{
	{"BeginRenewEnd", kubeBeginRenewEnd},
	{"DuplicateIDRefusedWhileLive", kubeDuplicateID},
	{"BeginMovesTheRecordFromPrevOnly", kubeMoveFromPrev},
	{"UnrenewedSessionEnds", kubeExpiry},
	{"RenewalKeepsTheSession", kubeRenewalKeeps},
	{"MemberRecordWrittenOnlyUnderItsSession", kubeMemberRecord},
	{"ClaimTakesFreeNamesAtOnce", kubeClaimFree},
	{"ClaimOfHeldNamesReadsThem", kubeClaimHeld},
	{"ClaimsGoWithTheirSession", kubeClaimsGoWithSession},
	{"ReleaseEndsOnlyThatHolding", kubeRelease},
}

// Each case in a group of its own, side by side (the waits overlap),
// and beside the package's other parallel tests.
func TestBackendConformanceKube(t *testing.T) {
	t.Parallel()
	c := needCluster(t)
	for _, tc := range kubeConformanceCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.test(t, newKubeStore(t, c))
		})
	}
}

// kubeBegin begins a session of replica id, or fails the test.
func kubeBegin(t *testing.T, st kubeStore, id string) (*kubeBackend, seamSession) {
	t.Helper()
	b := st.backendFor(id)
	s, err := b.begin(t.Context(), 0, testD, "digest")
	if err != nil {
		t.Fatalf("begin %s: %v", id, err)
	}
	return b, s
}

// A session begins valid from a moment taken before its request, is
// renewed for D, is the member record's, and once ended is known to be:
// renew, end and timeLeft say errSessionEnded, and the record is gone.
func kubeBeginRenewEnd(t *testing.T, st kubeStore) {
	ctx := t.Context()
	b := st.backendFor("r0")
	before := time.Now()
	s, err := b.begin(ctx, 0, testD, "digest")
	if err != nil {
		t.Fatalf("begin: %v", err)
	}
	if s.id == 0 || s.sent.Before(before) || s.sent.After(time.Now()) || s.joinedAt == 0 {
		t.Errorf("begin = %+v: want a session ID, sent between the call and its return, a position", s)
	}
	if id, found, err := b.memberSession(ctx); err != nil || !found || id != s.id {
		t.Errorf("memberSession = %d, %v, %v; want %d, true", id, found, err, s.id)
	}
	if valid, err := b.renew(ctx, s.id); err != nil || valid != testD {
		t.Errorf("renew = %v, %v; want D, %v", valid, err, testD)
	}
	left, granted, err := b.timeLeft(ctx, s.id)
	if err != nil || granted != testD || left > granted || left < testD-time.Second {
		t.Errorf("timeLeft = %v of %v, %v; want about %v of %v", left, granted, err, testD, testD)
	}
	if err := b.end(ctx, s.id); err != nil {
		t.Fatalf("end: %v", err)
	}
	if _, err := b.renew(ctx, s.id); !errors.Is(err, errSessionEnded) {
		t.Errorf("renew after end: %v, want errSessionEnded", err)
	}
	if err := b.end(ctx, s.id); !errors.Is(err, errSessionEnded) {
		t.Errorf("end after end: %v, want errSessionEnded", err)
	}
	if _, _, err := b.timeLeft(ctx, s.id); !errors.Is(err, errSessionEnded) {
		t.Errorf("timeLeft after end: %v, want errSessionEnded", err)
	}
	if id, found, err := b.memberSession(ctx); err != nil || found {
		t.Errorf("memberSession after end = %d, %v, %v; want none", id, found, err)
	}
}

// A second replica with the same ID cannot begin while the first's
// session lives (errDuplicateSession, and the first keeps its record);
// it can once that session ended.
func kubeDuplicateID(t *testing.T, st kubeStore) {
	ctx := t.Context()
	first, second := st.backendFor("r0"), st.backendFor("r0")
	s, err := first.begin(ctx, 0, testD, "digest")
	if err != nil {
		t.Fatalf("begin: %v", err)
	}
	if _, err := second.begin(ctx, 0, testD, "digest"); !errors.Is(err, errDuplicateSession) {
		t.Fatalf("a second begin of r0: %v, want errDuplicateSession", err)
	}
	if id, found, _ := first.memberSession(ctx); !found || id != s.id {
		t.Errorf("after the refused begin the record is under %d (found %v), want %d", id, found, s.id)
	}
	if _, err := first.renew(ctx, s.id); err != nil {
		t.Errorf("the first session after the refused begin: %v", err)
	}
	if err := first.end(ctx, s.id); err != nil {
		t.Fatal(err)
	}
	s2, err := second.begin(ctx, 0, testD, "digest")
	if err != nil {
		t.Fatalf("begin after the first session ended: %v", err)
	}
	_ = second.end(ctx, s2.id)
}

// begin with prev moves the member record from prev to the new session
// (here: prev's Lease deleted on condition of its own last write, a new
// one created), but only while it is under prev: a record under another
// session refuses it.
func kubeMoveFromPrev(t *testing.T, st kubeStore) {
	ctx := t.Context()
	b, s1 := kubeBegin(t, st, "r0")
	s2, err := b.begin(ctx, s1.id, testD, "digest")
	if err != nil {
		t.Fatalf("begin from the previous session: %v", err)
	}
	if s2.id == s1.id {
		t.Fatalf("begin from %d returned the same session", s1.id)
	}
	if id, found, _ := b.memberSession(ctx); !found || id != s2.id {
		t.Errorf("the record is under %d (found %v), want the new session %d", id, found, s2.id)
	}
	if _, err := b.begin(ctx, s1.id, testD, "digest"); !errors.Is(err, errDuplicateSession) {
		t.Errorf("begin from %d while the record is under %d: %v, want errDuplicateSession", s1.id, s2.id, err)
	}
	if _, err := b.renew(ctx, s2.id); err != nil {
		t.Errorf("the new session after the refused begin: %v", err)
	}
	_ = b.end(ctx, s2.id)
}

// A session nobody renews is proven ended by another replica's observer
// (the store's watcher) D after it stamped the session's last version,
// and its record goes with it: another replica with its ID may begin.
func kubeExpiry(t *testing.T, st kubeStore) {
	ctx := t.Context()
	b, s := kubeBegin(t, st, "r0")
	time.Sleep(testD + time.Second)
	if _, err := b.renew(ctx, s.id); !errors.Is(err, errSessionEnded) {
		t.Errorf("renew %v after begin, unrenewed: %v, want errSessionEnded", testD+time.Second, err)
	}
	if _, found, err := b.memberSession(ctx); err != nil || found {
		t.Errorf("the member record of an expired session: found %v, %v", found, err)
	}
	s2, err := st.backendFor("r0").begin(ctx, 0, testD, "digest")
	if err != nil {
		t.Fatalf("begin after the session expired: %v", err)
	}
	_ = b.end(ctx, s2.id)
}

// A session renewed more often than D outlives it twice over, with an
// observer watching it all along.
func kubeRenewalKeeps(t *testing.T, st kubeStore) {
	ctx := t.Context()
	b, s := kubeBegin(t, st, "r0")
	for range 4 {
		time.Sleep(testD / 2)
		if _, err := b.renew(ctx, s.id); err != nil {
			t.Fatalf("renew every half D: %v", err)
		}
	}
	if id, found, _ := b.memberSession(ctx); !found || id != s.id {
		t.Errorf("after 2 D of renewals the record is under %d (found %v), want %d", id, found, s.id)
	}
	_ = b.end(ctx, s.id)
}

// putMember rewrites the record (the member Lease's annotation) only
// under the session named; ensureMember never writes here (the record is
// the session), and says whose the record is.
func kubeMemberRecord(t *testing.T, st kubeStore) {
	ctx := t.Context()
	b, s1 := kubeBegin(t, st, "r0")
	if ok, err := b.putMember(ctx, s1.id, "other", true); err != nil || !ok {
		t.Errorf("putMember under its own session = %v, %v; want written", ok, err)
	}
	if v := memberAnnotationNow(t, st, "r0"); v != "r0 names=other (leaving)" {
		t.Errorf("the member record after putMember: %q", v)
	}
	s2, err := b.begin(ctx, s1.id, testD, "digest") // the record moves to s2
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := b.putMember(ctx, s1.id, "stale", false); ok || (err != nil && !errors.Is(err, errSessionEnded)) {
		t.Errorf("putMember under the session the record left = %v, %v; want not written", ok, err)
	}
	if under, found, err := b.ensureMember(ctx, s1.id, "stale"); err != nil || !found || under != s2.id {
		t.Errorf("ensureMember from the old session = %d, %v, %v; want the record left under %d", under, found, err, s2.id)
	}
	if under, found, err := b.ensureMember(ctx, s2.id, "digest"); err != nil || !found || under != s2.id {
		t.Errorf("ensureMember under its session = %d, %v, %v; want %d", under, found, err, s2.id)
	}
	if v := memberAnnotationNow(t, st, "r0"); v != "r0 names=digest" {
		t.Errorf("the member record of the new session: %q, want its begin's", v)
	}
	_ = b.end(ctx, s2.id)
	if ok, err := b.putMember(ctx, s2.id, "digest", false); ok || (err != nil && !errors.Is(err, errSessionEnded)) {
		t.Errorf("putMember under an ended session = %v, %v; want not written", ok, err)
	}
	if under, found, err := b.ensureMember(ctx, s2.id, "digest"); found || !errors.Is(err, errSessionEnded) {
		t.Errorf("ensureMember under an ended session = %d, %v, %v; want errSessionEnded", under, found, err)
	}
}

// memberAnnotationNow returns the member record's value of member id as
// a quorum read finds it.
func memberAnnotationNow(t *testing.T, st kubeStore, id string) string {
	t.Helper()
	l, err := st.g.leases.Get(t.Context(), st.g.memberName(id), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return l.Annotations[memberAnnotation]
}

// kubeClaimedBy returns the outcomes in got by name.
func kubeClaimedBy(got []claimed) map[string]claimed {
	m := map[string]claimed{}
	for _, c := range got {
		m[c.name] = c
	}
	return m
}

// Free names of one bucket are all claimed in one write, at one
// position; claiming them again (an answer lost) finds them this
// session's, at that position. A name of another bucket is at its own
// bucket's write, later.
func kubeClaimFree(t *testing.T, st kubeStore) {
	ctx := t.Context()
	b, s := kubeBegin(t, st, "r0")
	defer func() { _ = b.end(ctx, s.id) }()
	names := namesIn(st.g, 1, 3)
	got, absent, err := b.claim(ctx, s.id, names)
	if err != nil || len(absent) != 0 || len(got) != 3 {
		t.Fatalf("claim of three free names = %v, absent %v, %v", got, absent, err)
	}
	rev := got[0].rev
	for _, c := range got {
		if !c.ok || c.rev != rev || c.rev == 0 {
			t.Errorf("claim of free names: %+v, want ours at one position (%d)", c, rev)
		}
	}
	again, absent, err := b.claim(ctx, s.id, names)
	if err != nil || len(absent) != 0 || len(again) != 3 {
		t.Fatalf("claim again = %v, absent %v, %v", again, absent, err)
	}
	for _, c := range again {
		if !c.ok || c.rev != rev {
			t.Errorf("claim again: %+v, want found ours at position %d", c, rev)
		}
	}
	other := namesIn(st.g, 2, 1)
	got, _, err = b.claim(ctx, s.id, other)
	if err != nil || len(got) != 1 || !got[0].ok || got[0].rev <= rev {
		t.Errorf("claim of a name of another bucket = %+v, %v; want ours after %d", got, err, rev)
	}
	// The earlier names keep their position through the later writes of
	// their bucket.
	more := namesIn(st.g, 1, 4)[3:]
	if _, _, err := b.claim(ctx, s.id, more); err != nil {
		t.Fatal(err)
	}
	again, _, err = b.claim(ctx, s.id, names)
	for _, c := range again {
		if err != nil || !c.ok || c.rev != rev {
			t.Errorf("claim again after another write of the bucket: %+v, %v; want ours at %d", c, err, rev)
		}
	}
}

// A held name is reported with its holder and position; the free names
// of the same claim are taken (here nothing is left to claim again).
func kubeClaimHeld(t *testing.T, st kubeStore) {
	ctx := t.Context()
	a, sa := kubeBegin(t, st, "r0")
	defer func() { _ = a.end(ctx, sa.id) }()
	names := namesIn(st.g, 0, 2)
	x, y := names[0], names[1]
	held, _, err := a.claim(ctx, sa.id, []string{x})
	if err != nil || len(held) != 1 {
		t.Fatal(held, err)
	}
	b, sb := kubeBegin(t, st, "r1")
	defer func() { _ = b.end(ctx, sb.id) }()
	got, absent, err := b.claim(ctx, sb.id, []string{x, y})
	if err != nil {
		t.Fatal(err)
	}
	byName := kubeClaimedBy(got)
	gx := byName[x]
	if gx.ok || gx.view == nil || gx.view.holder != "r0" || gx.view.lease != sa.id || gx.view.rev != held[0].rev || gx.hdr < gx.view.rev {
		t.Errorf("claim of held x by r1: %+v (view %+v), want held by r0 under %d at %d", gx, gx.view, sa.id, held[0].rev)
	}
	if gy := byName[y]; !gy.ok || len(absent) != 0 {
		t.Errorf("claim of free y by r1: %+v, absent %v; want ours, nothing to claim again", gy, absent)
	}
}

// A session's holdings end with it (end removes its entries), so another
// may claim them; a session that ended claims nothing.
func kubeClaimsGoWithSession(t *testing.T, st kubeStore) {
	ctx := t.Context()
	a, sa := kubeBegin(t, st, "r0")
	x, y := namesIn(st.g, 0, 1)[0], namesIn(st.g, 3, 1)[0]
	if _, _, err := a.claim(ctx, sa.id, []string{x}); err != nil {
		t.Fatal(err)
	}
	if err := a.end(ctx, sa.id); err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.claim(ctx, sa.id, []string{y}); !errors.Is(err, errSessionEnded) {
		t.Errorf("claim under an ended session: %v, want errSessionEnded", err)
	}
	if claims, _ := bucketNow(t, testCluster, st.g, 0); len(claims) != 0 {
		t.Errorf("bucket 0 after r0's end: %v, want no entries", claims)
	}
	b, sb := kubeBegin(t, st, "r1")
	defer func() { _ = b.end(ctx, sb.id) }()
	got, absent, err := b.claim(ctx, sb.id, []string{x, y})
	if err != nil || len(absent) != 0 || len(got) != 2 || !got[0].ok || !got[1].ok {
		t.Errorf("claim of the ended session's x and of y = %+v, absent %v, %v; want both ours", got, absent, err)
	}
}

// release ends the holding it names and no other: released again after
// another session claimed the name, it leaves that holding alone.
func kubeRelease(t *testing.T, st kubeStore) {
	ctx := t.Context()
	a, sa := kubeBegin(t, st, "r0")
	defer func() { _ = a.end(ctx, sa.id) }()
	x := namesIn(st.g, 0, 1)[0]
	got, _, err := a.claim(ctx, sa.id, []string{x})
	if err != nil || len(got) != 1 {
		t.Fatal(got, err)
	}
	old := Claim{Key: x, Revision: got[0].rev, Token: got[0].token}
	if err := a.release(ctx, old); err != nil {
		t.Fatalf("release: %v", err)
	}
	b, sb := kubeBegin(t, st, "r1")
	defer func() { _ = b.end(ctx, sb.id) }()
	got, _, err = b.claim(ctx, sb.id, []string{x})
	if err != nil || len(got) != 1 || !got[0].ok || got[0].rev <= old.Revision || got[0].token <= old.Token {
		t.Fatalf("claim of released x by r1 = %+v, %v; want ours at a later position and token than %+v", got, err, old)
	}
	if err := a.release(ctx, old); err != nil {
		t.Fatalf("release of a holding that ended: %v", err)
	}
	got, absent, err := a.claim(ctx, sa.id, []string{x})
	if err != nil || len(absent) != 0 || len(got) != 1 || got[0].ok || got[0].view == nil || got[0].view.holder != "r1" {
		t.Errorf("after r0 released its old holding again, x = %+v, absent %v, %v; want still r1's", got, absent, err)
	}
}

// checkServers asks the API server its release with the replicas'
// credentials, finds the tests' server recent enough and says nothing;
// a server before 1.35 is logged at Warn, once however often it is
// asked.
func TestCheckServersWarnsOnceOfAServerTooOld(t *testing.T) {
	c := needCluster(t)
	applyManifest(t, c)
	cfg := replicaConfig(c, nil)
	cl, err := coordinationv1client.NewForConfigAndClient(cfg, replicaHTTP(t, c, cfg))
	if err != nil {
		t.Fatal(err)
	}
	var logs recordedLogs
	g := newTestGroup(t, c, 4, nil)
	b := newKubeBackend(g, "r0", slog.New(&logs), serverVersion(cl.RESTClient()), 5*time.Second)
	b.checkServers(t.Context())
	if n := logs.count(slog.LevelDebug); n != 0 || logs.count(slog.LevelWarn) != 0 {
		t.Errorf("checkServers against %s logged %d debug, %d warn lines: %q", c.release, n, logs.count(slog.LevelWarn), logs.lines())
	}
	old := &version.Info{Major: "1", Minor: "34", GitVersion: "v1.34.2"}
	b = newKubeBackend(g, "r0", slog.New(&logs), func(context.Context) (*version.Info, error) { return old, nil }, 5*time.Second)
	b.checkServers(t.Context())
	b.checkServers(t.Context())
	if n := logs.count(slog.LevelWarn); n != 1 || !strings.Contains(logs.lines(), "v1.34.2") {
		t.Errorf("checkServers twice against v1.34.2 logged %d warnings: %q; want one naming it", n, logs.lines())
	}
}

// recordedLogs is a slog.Handler that keeps every record.
type recordedLogs struct {
	mu   sync.Mutex
	recs []slog.Record
}

// Enabled keeps every level.
func (r *recordedLogs) Enabled(context.Context, slog.Level) bool { return true }

// Handle keeps rec.
func (r *recordedLogs) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, rec)
	return nil
}

// WithAttrs and WithGroup keep the records in r, attributes and groups
// left out.
func (r *recordedLogs) WithAttrs([]slog.Attr) slog.Handler { return r }

// WithGroup: see WithAttrs.
func (r *recordedLogs) WithGroup(string) slog.Handler { return r }

// count returns how many records of level l were kept.
func (r *recordedLogs) count(l slog.Level) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, rec := range r.recs {
		if rec.Level == l {
			n++
		}
	}
	return n
}

// lines returns the messages kept, one a line.
func (r *recordedLogs) lines() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	for _, rec := range r.recs {
		b.WriteString(rec.Message + "\n")
	}
	return b.String()
}

// claimCost is never below what a name adds to its bucket's claims
// before compression, so that a batch kept under a byte bound by it
// never puts more than that into a bucket.
func TestClaimCostCoversAnEntry(t *testing.T) {
	b := newKubeBackend(&group{buckets: 4}, "r0", slog.New(slog.DiscardHandler), nil, time.Second)
	base := len(rawClaims(bucketClaims{}))
	c := bucketClaims{}
	cost := 0
	for k := range 200 {
		name := strings.Repeat("n", k*7) + fmt.Sprint(k)
		c[name] = entry{session: "r0/abc", token: 1 << 30}
		cost += b.claimCost(name)
		// The session's identity is written once, however many names.
		if size := len(rawClaims(c)) - len("r0/abc") - 1; size-base > cost {
			t.Fatalf("%d names take %d bytes in a bucket, claimCost sums to %d", k+1, size-base, cost)
		}
	}
}

// begin replaces a member Lease of its ID only once it has proven that
// Lease's session ended, by itself when no other replica runs: a live
// session, renewed, refuses every begin of its ID; once its renewals stop
// (a crash, then a restart of the same ID with no other replica to prove
// the end), a begin stamps the Lease and refuses, and the first begin D
// after that stamp deletes it on condition of the version stamped and
// creates its own. The old session's renewal is then refused.
func TestBackendBeginReplacesOnlyAProvenEndedSession(t *testing.T) {
	t.Parallel()
	c := needCluster(t)
	g := newTestGroup(t, c, 4, nil)
	backendFor := func() *kubeBackend {
		return newKubeBackend(otherReplica(t, c, g, nil), "r0", slog.New(slog.DiscardHandler), nil, 5*time.Second)
	}
	old, restarted := backendFor(), backendFor()
	s, err := old.begin(t.Context(), 0, testD, "digest")
	if err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(testD * 3 / 2); time.Now().Before(end); {
		if _, err := restarted.begin(t.Context(), 0, testD, "digest"); !errors.Is(err, errDuplicateSession) {
			t.Fatalf("begin while the session of r0 is renewed: %v, want errDuplicateSession", err)
		}
		if _, err := old.renew(t.Context(), s.id); err != nil {
			t.Fatalf("renew: %v", err)
		}
		time.Sleep(testD / 4)
	}
	// The last renewal's version is new to restarted's observer: this
	// begin stamps it, before it returns.
	if _, err := restarted.begin(t.Context(), 0, testD, "digest"); !errors.Is(err, errDuplicateSession) {
		t.Fatalf("begin just after the last renewal: %v, want errDuplicateSession", err)
	}
	stamped := time.Now()
	time.Sleep(testD / 2)
	if _, err := restarted.begin(t.Context(), 0, testD, "digest"); !errors.Is(err, errDuplicateSession) {
		t.Fatalf("begin D/2 after the stamp: %v, want errDuplicateSession", err)
	}
	sleepUntil(stamped.Add(testD))
	s2, err := restarted.begin(t.Context(), 0, testD, "digest")
	if err != nil {
		t.Fatalf("begin D after the stamp of an unrenewed session: %v", err)
	}
	if id, found, err := restarted.memberSession(t.Context()); err != nil || !found || id != s2.id {
		t.Errorf("memberSession = %d, %v, %v; want the new session %d", id, found, err, s2.id)
	}
	if _, err := old.renew(t.Context(), s.id); !errors.Is(err, errSessionEnded) {
		t.Errorf("the old session's renewal after the replacement: %v, want errSessionEnded", err)
	}
	_ = restarted.end(t.Context(), s2.id)
}

// A claim whose answer comes after the session's validity (the last
// renewal's send time + D) is refused, though its entries were written:
// by then the session may be proven ended and its names given to others,
// so the caller must not run them; a claim answered in time is ours.
func TestBackendClaimAnsweredPastValidityIsRefused(t *testing.T) {
	t.Parallel()
	c := needCluster(t)
	tp := &tap{}
	g := newTestGroup(t, c, 4, tp)
	b := newKubeBackend(g, "r0", slog.New(slog.DiscardHandler), nil, 5*time.Second)
	s, err := b.begin(t.Context(), 0, testD, "digest")
	if err != nil {
		t.Fatal(err)
	}
	names := namesIn(g, 0, 2)
	if got, _, err := b.claim(t.Context(), s.id, names[:1]); err != nil || len(got) != 1 || !got[0].ok {
		t.Fatalf("claim answered in time = %+v, %v; want ours", got, err)
	}
	tp.putDelay.Store(int64(testD)) // the bucket exists: the next claim is an update
	got, _, err := b.claim(t.Context(), s.id, names[1:])
	if err == nil {
		t.Errorf("claim answered %v after begin, unrenewed = %+v; want refused", testD, got)
	}
}
