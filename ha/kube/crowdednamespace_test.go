// A group in a namespace full of other Leases (as kube-node-lease holds
// one per node, or as other services' groups share a namespace): the
// replicas list and watch only their own Leases, by label selector, and
// join and renew as they do in an empty namespace.

package kube

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// unrelatedMarker starts the name of every unrelated Lease, and appears
// in nothing of the group's: an answer that holds it carried another's
// Lease to a replica.
const unrelatedMarker = "unrelated-lease-"

// unrelatedLeases is how many other Leases the crowded namespace holds.
const unrelatedLeases = 10_000

// traffic counts what a group's replicas send and receive through their
// connections, by kind of request: list, watch, get, write (any request
// but a GET) and other (the server's version). It keeps the label
// selector of every list and watch, and counts the answers that carried
// unrelatedMarker. All its fields are guarded by mu.
type traffic struct {
	mu        sync.Mutex
	requests  map[string]int   // kind → requests sent
	bytes     map[string]int64 // kind → bytes of the answers' bodies received (decompressed)
	selectors map[string]int   // the labelSelector of a list or a watch → requests
	marked    int              // answers whose body held unrelatedMarker
}

func newTraffic() *traffic {
	return &traffic{requests: map[string]int{}, bytes: map[string]int64{}, selectors: map[string]int{}}
}

// transport returns rt, counted in tr.
func (tr *traffic) transport(rt http.RoundTripper) http.RoundTripper {
	return trafficTransport{rt: rt, tr: tr}
}

// trafficTransport counts each request and its answer in tr. Immutable.
type trafficTransport struct {
	rt http.RoundTripper
	tr *traffic
}

// requestKind says what req is to the Lease API: a list or a watch of a
// collection, a get or a write of one Lease, or other.
func requestKind(req *http.Request) string {
	switch {
	case !strings.Contains(req.URL.Path, "/leases"):
		return "other"
	case req.Method != http.MethodGet:
		return "write"
	case req.URL.Query().Get("watch") == "true" || req.URL.Query().Get("watch") == "1":
		return "watch"
	case strings.HasSuffix(req.URL.Path, "/leases"):
		return "list"
	}
	return "get"
}

func (t trafficTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	kind := requestKind(req)
	t.tr.mu.Lock()
	t.tr.requests[kind]++
	if kind == "list" || kind == "watch" {
		t.tr.selectors[req.URL.Query().Get("labelSelector")]++
	}
	t.tr.mu.Unlock()
	resp, err := t.rt.RoundTrip(req)
	if err == nil {
		resp.Body = &countedBody{rc: resp.Body, tr: t.tr, kind: kind}
	}
	return resp, err
}

// countedBody counts the bytes read from an answer's body in tr, and
// whether they held unrelatedMarker, across reads (tail). Read by one
// goroutine at a time, as a body is.
type countedBody struct {
	rc     io.ReadCloser
	tr     *traffic
	kind   string
	tail   []byte // the last len(unrelatedMarker)-1 bytes read
	marked bool   // the marker was seen: counted once
}

func (b *countedBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if n > 0 {
		seen := append(b.tail, p[:n]...)
		found := !b.marked && bytes.Contains(seen, []byte(unrelatedMarker))
		b.tail = append(b.tail[:0], seen[max(0, len(seen)-len(unrelatedMarker)+1):]...)
		b.tr.mu.Lock()
		b.tr.bytes[b.kind] += int64(n)
		if found {
			b.marked = true
			b.tr.marked++
		}
		b.tr.mu.Unlock()
	}
	return n, err
}

func (b *countedBody) Close() error { return b.rc.Close() }

// snapshot returns a copy of the counts.
func (tr *traffic) snapshot() (requests map[string]int, received map[string]int64, selectors map[string]int, marked int) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return maps.Clone(tr.requests), maps.Clone(tr.bytes), maps.Clone(tr.selectors), tr.marked
}

// fillNamespace creates n unrelated Leases in ns as the administrator,
// with 32 creates in flight: half like kube-node-lease's (no labels), half
// labelled as members of another group of this package, so that a
// selector on the kind alone, or on the group's label key alone, would
// bring them. It returns how long it took.
func fillNamespace(t *testing.T, c *cluster, ns string, n int) time.Duration {
	t.Helper()
	start := time.Now()
	leases := c.admin.CoordinationV1().Leases(ns)
	next := make(chan int)
	errs := make(chan error, 32)
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() { // joined below, once next is closed
			for i := range next {
				l := unrelatedLease(i)
				if _, err := leases.Create(t.Context(), l, metav1.CreateOptions{}); err != nil {
					errs <- fmt.Errorf("creating %s: %w", l.Name, err)
					return
				}
			}
		})
	}
	var err error
feeding:
	for i := range n {
		select {
		case next <- i:
		case err = <-errs:
			break feeding
		}
	}
	close(next)
	wg.Wait()
	if err == nil && len(errs) > 0 {
		err = <-errs
	}
	if err != nil {
		t.Fatal(err)
	}
	return time.Since(start)
}

// unrelatedLease returns the i-th unrelated Lease: a node's, or a member
// of another group.
func unrelatedLease(i int) *coordinationv1.Lease {
	l := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s%05d", unrelatedMarker, i)},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       new(fmt.Sprintf("node-%05d", i)),
			LeaseDurationSeconds: new(int32(40)),
			RenewTime:            &metav1.MicroTime{Time: time.Now()},
		},
	}
	if i%2 == 1 {
		l.Labels = map[string]string{groupLabel: "another-group", kindLabel: kindMember}
	}
	return l
}

// churn renews unrelated Leases as the administrator, one every 20 ms
// (as a few hundred nodes renew theirs), until ctx ends: a watch that
// reads others' Leases sees their events.
func churn(ctx context.Context, c *cluster, ns string, n int) error {
	leases := c.admin.CoordinationV1().Leases(ns)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for i := 0; ; i = (i + 1) % n {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		l := unrelatedLease(i)
		cur, err := leases.Get(ctx, l.Name, metav1.GetOptions{})
		if err == nil {
			cur.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
			_, err = leases.Update(ctx, cur, metav1.UpdateOptions{})
		}
		if err != nil && ctx.Err() == nil {
			return fmt.Errorf("renewing %s: %w", l.Name, err)
		}
	}
}

// Ten thousand other Leases beside the group, a few of them renewed all
// along: the replicas list and watch with the group's label selector
// only, no byte of another Lease reaches them, and they join, place their
// names and renew as a group of the same size does at the same time in
// an empty namespace.
func TestReplicasInANamespaceFullOfOtherLeases(t *testing.T) {
	t.Parallel() // namespaces of its own
	c := needCluster(t)
	crowdedNS, emptyNS := newManifestNamespace(t, c, "crowded"), newManifestNamespace(t, c, "empty")
	took := fillNamespace(t, c, crowdedNS, unrelatedLeases)
	t.Logf("%d unrelated Leases created in %v", unrelatedLeases, took.Round(time.Millisecond))
	t.Cleanup(func() {
		// The namespace stays (no controller-manager here to finish its
		// deletion); its Leases go, not to weigh on the other tests.
		err := c.admin.CoordinationV1().Leases(crowdedNS).DeleteCollection(context.Background(), metav1.DeleteOptions{}, metav1.ListOptions{})
		if err != nil {
			t.Errorf("deleting the unrelated Leases: %v", err)
		}
	})
	// What one list without a selector brings a replica: every Lease of
	// the namespace, the marker among them (so the count below sees it
	// when it comes).
	whole := newTraffic()
	cfg := replicaConfig(c, nil)
	cfg.WrapTransport = whole.transport
	cs, err := kubernetes.NewForConfigAndClient(cfg, replicaHTTP(t, c, cfg))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoordinationV1().Leases(crowdedNS).List(t.Context(), metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	_, wholeBytes, _, wholeMarked := whole.snapshot()
	if wholeMarked != 1 {
		t.Fatalf("a list of every Lease of %s: %d answers held the unrelated Leases; want 1", crowdedNS, wholeMarked)
	}
	t.Logf("one list of the crowded namespace without a selector: %d bytes", wholeBytes["list"])

	ctx, stopChurn := context.WithCancel(t.Context())
	churned := make(chan error, 1)
	go func() { churned <- churn(ctx, c, crowdedNS, unrelatedLeases) }() // joined below, by stopChurn and <-churned

	crowded, empty := newKubeReplicas(t, 60), newKubeReplicas(t, 60)
	seen := map[*kubeReplicas]*traffic{crowded: newTraffic(), empty: newTraffic()}
	for g, ns := range map[*kubeReplicas]string{crowded: crowdedNS, empty: emptyNS} {
		g.namespace = ns
		tr := seen[g]
		g.wrap = func(_ string, rt http.RoundTripper) http.RoundTripper { return tr.transport(rt) }
	}
	// The joins alternate between the groups, so that both meet the same
	// load on this shared machine.
	joined := map[*kubeReplicas]time.Duration{}
	placed := map[*kubeReplicas]time.Duration{}
	started := time.Now()
	for _, id := range []string{"a", "b", "c"} {
		for _, g := range []*kubeReplicas{empty, crowded} {
			at := time.Now()
			g.join(id)
			joined[g] += time.Since(at)
		}
	}
	for _, g := range []*kubeReplicas{empty, crowded} {
		g.waitPlaced("three replicas placing", 30*time.Second, "a", "b", "c")
		placed[g] = time.Since(started)
	}
	t.Logf("joins (sum of the three Join calls): %v in the empty namespace, %v in the crowded one; every name placed %v and %v after the first join began",
		joined[empty].Round(time.Millisecond), joined[crowded].Round(time.Millisecond), placed[empty].Round(time.Millisecond), placed[crowded].Round(time.Millisecond))

	// Steady state: both groups at once, for 4 s (five renewal periods).
	before := map[*kubeReplicas]map[string]int{}
	for g, tr := range seen {
		before[g], _, _, _ = tr.snapshot()
	}
	const window = 4 * time.Second
	time.Sleep(window) // the steady window: nothing happens but renewals
	steady := map[*kubeReplicas]int{}
	for g, tr := range seen {
		after, _, _, _ := tr.snapshot()
		steady[g] = after["write"] - before[g]["write"]
	}
	stopChurn()
	if err := <-churned; err != nil {
		t.Error(err)
	}
	t.Logf("steady state over %v: %d writes in the empty namespace, %d in the crowded one", window, steady[empty], steady[crowded])

	for _, g := range []*kubeReplicas{empty, crowded} {
		requests, received, selectors, marked := seen[g].snapshot()
		t.Logf("%s namespace: requests %v, bytes received %v, selectors %v", g.namespace, requests, received, selectors)
		if marked != 0 {
			t.Errorf("%d answers to the replicas in %s held another's Lease; want none", marked, g.namespace)
		}
		want := groupLabel + "=" + g.group
		for sel := range selectors {
			if !slices.Contains(strings.Split(sel, ","), want) {
				t.Errorf("the replicas in %s listed or watched with labelSelector %q; want every list and watch to select %s", g.namespace, sel, want)
			}
		}
	}
	_, crowdedBytes, _, _ := seen[crowded].snapshot()
	_, emptyBytes, _, _ := seen[empty].snapshot()
	for _, kind := range []string{"list", "watch"} {
		if crowdedBytes[kind] > 2*emptyBytes[kind]+64<<10 {
			t.Errorf("the replicas received %d bytes of %s answers in the crowded namespace against %d in the empty one; want about as many", crowdedBytes[kind], kind, emptyBytes[kind])
		}
	}
	if got := crowdedBytes["list"] + crowdedBytes["watch"]; got >= wholeBytes["list"] {
		t.Errorf("the replicas received %d bytes of lists and watches in all, as much as one list of the namespace (%d); want far less", got, wholeBytes["list"])
	}
	// Loose bounds on time (a shared machine), close ones on writes: the
	// same group renews on the same timers wherever it is.
	if joined[crowded] > 2*joined[empty]+3*time.Second {
		t.Errorf("the joins took %v in the crowded namespace against %v in the empty one; want about as long", joined[crowded], joined[empty])
	}
	if placed[crowded] > 2*placed[empty]+3*time.Second {
		t.Errorf("the names were placed %v after the joins began in the crowded namespace against %v in the empty one; want about as soon", placed[crowded], placed[empty])
	}
	if d := steady[crowded] - steady[empty]; d > 3 || d < -3 {
		t.Errorf("%d writes in %v of steady state in the crowded namespace against %d in the empty one; want as many, give or take a renewal per replica", steady[crowded], window, steady[empty])
	}
	if n := crowded.fences.Load() + empty.fences.Load(); n != 0 {
		t.Errorf("%d fence passes; want none", n)
	}
}
