// The Kubernetes backend (kubeBackend) below the contract
// (conformance_test.go): what it leaves to the store, as this one does
// it, and the helpers of the tests that drive kubeBackend directly, each
// replica on the replicas' credentials (the manifest's Role and nothing
// more).

package kube

import (
	"context"
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

// kubeBegin begins a session of replica id, or fails the test.
func kubeBegin(t *testing.T, st kubeStore, id string) (*kubeBackend, ha.Session) {
	t.Helper()
	b := st.backendFor(id)
	s, err := b.Begin(t.Context(), 0, testD, "digest")
	if err != nil {
		t.Fatalf("begin %s: %v", id, err)
	}
	return b, s
}

// What the contract (TestBackendConformanceKube) leaves to the store, as
// Kubernetes does it: free names of one bucket are ha.Claimed in one write,
// at one position, which they keep through the bucket's later writes; a
// name of another bucket is at its own bucket's write; a held name is
// reported at its holder's position, read at the bucket's version or
// later.
func TestBackendClaimPositionsAreThoseOfTheirBuckets(t *testing.T) {
	t.Parallel()
	st := newKubeStore(t, needCluster(t))
	ctx := t.Context()
	b, s := kubeBegin(t, st, "r0")
	defer func() { _ = b.End(ctx, s.ID) }()
	names := namesIn(st.g, 1, 3)
	got, _, err := b.Claim(ctx, s.ID, names)
	if err != nil || len(got) != 3 {
		t.Fatalf("claim of three free names = %v, %v", got, err)
	}
	rev := got[0].Revision
	other := namesIn(st.g, 2, 1)
	if o, _, err := b.Claim(ctx, s.ID, other); err != nil || len(o) != 1 || !o[0].Mine || o[0].Revision <= rev {
		t.Errorf("claim of a name of another bucket = %+v, %v; want ours after %d", o, err, rev)
	}
	if _, _, err := b.Claim(ctx, s.ID, namesIn(st.g, 1, 4)[3:]); err != nil {
		t.Fatal(err)
	}
	again, _, err := b.Claim(ctx, s.ID, names)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range slices.Concat(got, again) {
		if !c.Mine || c.Revision != rev || c.Revision == 0 {
			t.Errorf("%+v: want ours at one position (%d), the first claim's, after another write of the bucket too", c, rev)
		}
	}
	r1, s1 := kubeBegin(t, st, "r1")
	defer func() { _ = r1.End(ctx, s1.ID) }()
	got, _, err = r1.Claim(ctx, s1.ID, names[:1])
	if err != nil || len(got) != 1 {
		t.Fatal(got, err)
	}
	if c := got[0]; c.Mine || c.Holder != "r0" || c.Session != s.ID || c.Revision != rev || c.At < c.Revision {
		t.Errorf("claim of r0's %s by r1: %+v, want held by r0 under %d at %d", names[0], c, s.ID, rev)
	}
}

// The member record is the member Lease's annotation, in ha's format:
// PutMember writes it under its session; a begin from prev writes its own
// digest into the new Lease.
func TestBackendMemberRecordIsTheLeasesAnnotation(t *testing.T) {
	t.Parallel()
	st := newKubeStore(t, needCluster(t))
	ctx := t.Context()
	b, s1 := kubeBegin(t, st, "r0")
	if ok, err := b.PutMember(ctx, s1.ID, "other", true); err != nil || !ok {
		t.Errorf("PutMember under its own session = %v, %v; want written", ok, err)
	}
	if v := memberAnnotationNow(t, st, "r0"); v != "r0 names=other (leaving)" {
		t.Errorf("the member record after PutMember: %q", v)
	}
	s2, err := b.Begin(ctx, s1.ID, testD, "digest")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = b.End(ctx, s2.ID) }()
	if v := memberAnnotationNow(t, st, "r0"); v != "r0 names=digest" {
		t.Errorf("the member record of the new session: %q, want its begin's", v)
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
func kubeClaimedBy(got []ha.Claimed) map[string]ha.Claimed {
	m := map[string]ha.Claimed{}
	for _, c := range got {
		m[c.Name] = c
	}
	return m
}

// end removes the session's entries from its buckets (best effort, but
// done when nothing fails): the buckets do not keep an ended session's
// names.
func TestBackendEndRemovesItsEntries(t *testing.T) {
	t.Parallel()
	st := newKubeStore(t, needCluster(t))
	ctx := t.Context()
	a, sa := kubeBegin(t, st, "r0")
	if _, _, err := a.Claim(ctx, sa.ID, namesIn(st.g, 0, 2)); err != nil {
		t.Fatal(err)
	}
	if err := a.End(ctx, sa.ID); err != nil {
		t.Fatal(err)
	}
	if claims, _ := bucketNow(t, testCluster, st.g, 0); len(claims) != 0 {
		t.Errorf("bucket 0 after r0's end: %v, want no entries", claims)
	}
}

// CheckServers asks the API server its release with the replicas'
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
	b.CheckServers(t.Context())
	if n := logs.count(slog.LevelDebug); n != 0 || logs.count(slog.LevelWarn) != 0 {
		t.Errorf("CheckServers against %s logged %d debug, %d warn lines: %q", c.release, n, logs.count(slog.LevelWarn), logs.lines())
	}
	old := &version.Info{Major: "1", Minor: "34", GitVersion: "v1.34.2"}
	b = newKubeBackend(g, "r0", slog.New(&logs), func(context.Context) (*version.Info, error) { return old, nil }, 5*time.Second)
	b.CheckServers(t.Context())
	b.CheckServers(t.Context())
	if n := logs.count(slog.LevelWarn); n != 1 || !strings.Contains(logs.lines(), "v1.34.2") {
		t.Errorf("CheckServers twice against v1.34.2 logged %d warnings: %q; want one naming it", n, logs.lines())
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

// ClaimCost is never below what a name adds to its bucket's claims
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
		cost += b.ClaimCost(name)
		// The session's identity is written once, however many names.
		if size := len(rawClaims(c)) - len("r0/abc") - 1; size-base > cost {
			t.Fatalf("%d names take %d bytes in a bucket, ClaimCost sums to %d", k+1, size-base, cost)
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
	s, err := old.Begin(t.Context(), 0, testD, "digest")
	if err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(testD * 3 / 2); time.Now().Before(end); {
		if _, err := restarted.Begin(t.Context(), 0, testD, "digest"); !errors.Is(err, ha.ErrDuplicateID) {
			t.Fatalf("begin while the session of r0 is renewed: %v, want ha.ErrDuplicateID", err)
		}
		if _, err := old.Renew(t.Context(), s.ID); err != nil {
			t.Fatalf("renew: %v", err)
		}
		time.Sleep(testD / 4)
	}
	// The last renewal's version is new to restarted's observer: this
	// begin stamps it, before it returns.
	if _, err := restarted.Begin(t.Context(), 0, testD, "digest"); !errors.Is(err, ha.ErrDuplicateID) {
		t.Fatalf("begin just after the last renewal: %v, want ha.ErrDuplicateID", err)
	}
	stamped := time.Now()
	time.Sleep(testD / 2)
	if _, err := restarted.Begin(t.Context(), 0, testD, "digest"); !errors.Is(err, ha.ErrDuplicateID) {
		t.Fatalf("begin D/2 after the stamp: %v, want ha.ErrDuplicateID", err)
	}
	sleepUntil(stamped.Add(testD))
	s2, err := restarted.Begin(t.Context(), 0, testD, "digest")
	if err != nil {
		t.Fatalf("begin D after the stamp of an unrenewed session: %v", err)
	}
	if id, found, err := restarted.MemberSession(t.Context()); err != nil || !found || id != s2.ID {
		t.Errorf("MemberSession = %d, %v, %v; want the new session %d", id, found, err, s2.ID)
	}
	if _, err := old.Renew(t.Context(), s.ID); !errors.Is(err, ha.ErrSessionEnded) {
		t.Errorf("the old session's renewal after the replacement: %v, want ha.ErrSessionEnded", err)
	}
	_ = restarted.End(t.Context(), s2.ID)
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
	s, err := b.Begin(t.Context(), 0, testD, "digest")
	if err != nil {
		t.Fatal(err)
	}
	names := namesIn(g, 0, 2)
	if got, _, err := b.Claim(t.Context(), s.ID, names[:1]); err != nil || len(got) != 1 || !got[0].Mine {
		t.Fatalf("claim answered in time = %+v, %v; want ours", got, err)
	}
	tp.putDelay.Store(int64(testD)) // the bucket exists: the next claim is an update
	got, _, err := b.Claim(t.Context(), s.ID, names[1:])
	if err == nil {
		t.Errorf("claim answered %v after begin, unrenewed = %+v; want refused", testD, got)
	}
}
