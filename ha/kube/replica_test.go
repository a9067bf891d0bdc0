// Whole replicas of package ha on the Kubernetes store, against the real
// kube-apiserver, each on the replicas' credentials (the manifest's Role
// and nothing more): the same promise as on etcd, each name on exactly
// one live replica and never two at once, DoFunc and StopFunc included.

package kube

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"k8s.io/client-go/rest"

	controller "github.com/bgctl/controller"
	"github.com/bgctl/controller/ha"
)

// runs records where each name runs: a DoFunc from its start to its
// return, a StopFunc likewise, and counts every moment two of one name
// ran at once. Guarded by mu.
type runs struct {
	mu       sync.Mutex
	active   map[string]int    // runs of each name in progress
	where    map[string]string // the replica running each name, while one does
	overlaps int               // starts while another run of the name was in progress
	starts   int
	// claims is, for each name, the Claim of each of its DoFunc runs, in
	// the order they started (ClaimFrom).
	claims map[string][]ha.Claim
	// began is, for each name, when each of its runs started, in order.
	began map[string][]time.Time
}

func newRuns() *runs {
	return &runs{active: map[string]int{}, where: map[string]string{}, claims: map[string][]ha.Claim{},
		began: map[string][]time.Time{}}
}

func (r *runs) begin(replica, name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.active[name]++
	r.starts++
	r.began[name] = append(r.began[name], time.Now())
	if r.active[name] > 1 {
		r.overlaps++
	}
	r.where[name] = replica
}

func (r *runs) finish(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.active[name]--
	if r.active[name] == 0 {
		delete(r.where, name)
	}
}

// params returns the controller of name on replica: a DoFunc that runs
// until cancelled, a StopFunc that works a little.
func (r *runs) params(replica, name string) controller.ControllerParams {
	return controller.ControllerParams{
		DoFunc: func(ctx context.Context) error {
			r.begin(replica, name)
			if c, ok := ha.ClaimFrom(ctx); ok {
				r.mu.Lock()
				r.claims[name] = append(r.claims[name], c)
				r.mu.Unlock()
			}
			<-ctx.Done()
			r.finish(name)
			return nil
		},
		StopFunc: func(context.Context) error {
			r.begin(replica, name)
			time.Sleep(5 * time.Millisecond) // a StopFunc's work, not an ordering
			r.finish(name)
			return nil
		},
		RunInterval:            5 * time.Millisecond,
		ErrorRetryBaseDuration: 10 * time.Millisecond,
	}
}

// startedBetween returns the first and the last start of the latest runs
// of names, and how many of names started after from.
func (r *runs) startedBetween(names []string, from time.Time) (first, last time.Time, n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, nm := range names {
		bs := r.began[nm]
		if len(bs) == 0 || !bs[len(bs)-1].After(from) {
			continue
		}
		at := bs[len(bs)-1]
		n++
		if first.IsZero() || at.Before(first) {
			first = at
		}
		if at.After(last) {
			last = at
		}
	}
	return first, last, n
}

// on returns how many names run on replica.
func (r *runs) on(replica string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, id := range r.where {
		if id == replica {
			n++
		}
	}
	return n
}

// placement returns where every name of names runs, and whether each
// runs on exactly one replica.
func (r *runs) placement(names []string) (map[string]string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]string, len(names))
	all := true
	for _, n := range names {
		if r.active[n] != 1 {
			all = false
		}
		out[n] = r.where[n]
	}
	return out, all
}

// cut is a transport that a test can cut off from the API server: every
// request fails while cut is set, as behind a partition.
type cut struct {
	rt  http.RoundTripper // immutable after the config wraps it
	off atomic.Bool
}

var errCut = errors.New("test: cut off from the API server")

func (c *cut) RoundTrip(req *http.Request) (*http.Response, error) {
	if c.off.Load() {
		return nil, errCut
	}
	return c.rt.RoundTrip(req)
}

// replicaTTL is the replicas' TTL, the sessions' lease duration D: short,
// so that a crash's names move within seconds.
const replicaTTL = 4 * time.Second

// kubeReplicas is a group of ha replicas on the test cluster.
type kubeReplicas struct {
	t     *testing.T
	c     *cluster
	group string
	names []string
	runs  *runs
	cuts  map[string]*cut
	rs    map[string]*ha.Replica
	mode  ha.Mode // the replicas' Options.Mode: Spread unless set before join
	// ttl is the replicas' TTL (replicaTTL if 0), and buckets their
	// Store's (16 if 0): set before join.
	ttl     time.Duration
	buckets int
	// params returns the controller of name on replica id, made as r;
	// the recorder's own (runs.params) if nil. Set before the first join.
	params func(r *ha.Replica, id, name string) controller.ControllerParams
	// holes are the black holes some replicas reach the API server
	// through, by ID: set before their join.
	holes map[string]*blackHole
	// namespace is where the group's Leases live: replicaNamespace if
	// "". Set before the first join.
	namespace string
	// wrap, if set, wraps replica id's transport beneath its cut (it
	// sees what crosses the cut): set before the join.
	wrap func(id string, rt http.RoundTripper) http.RoundTripper
	// config, if set, returns replica id's client configuration in place
	// of replicaConfig's: set before the join.
	config func(id string) *rest.Config
	// metrics, if set, is where the replicas' stores count their
	// throttled requests (StoreOptions.Metrics): set before the join.
	metrics *Metrics

	// fences counts the FencePassed events of every replica joined, and
	// fencesOf those of each replica ID (the map written by join alone,
	// on the test's goroutine; each counter by its replica's reader);
	// events owns the goroutines that read them: one per replica, ending
	// when its Events channel closes, after the replica stopped. The
	// cleanup closes every replica, then joins them.
	fences   atomic.Int64
	fencesOf map[string]*atomic.Int64
	events   sync.WaitGroup
}

func newKubeReplicas(t *testing.T, names int) *kubeReplicas {
	return newKubeReplicasOn(t, needCluster(t), names)
}

// newKubeReplicasOn returns a group of replicas on cluster c, with names
// names registered on each.
func newKubeReplicasOn(t *testing.T, c *cluster, names int) *kubeReplicas {
	applyManifest(t, c)
	g := &kubeReplicas{t: t, c: c, group: "r" + strings.ToLower(rand.Text()[:10]), runs: newRuns(),
		cuts: map[string]*cut{}, rs: map[string]*ha.Replica{}, fencesOf: map[string]*atomic.Int64{}}
	for i := range names {
		g.names = append(g.names, fmt.Sprintf("name-%03d", i))
	}
	t.Cleanup(func() {
		for _, r := range g.rs {
			_ = r.Close()
		}
		g.events.Wait()
		g.runs.mu.Lock()
		defer g.runs.mu.Unlock()
		if g.runs.overlaps != 0 {
			t.Errorf("%d starts while another run of the name was in progress; want none", g.runs.overlaps)
		}
	})
	return g
}

// join makes replica id, registers every name on it and joins it.
func (g *kubeReplicas) join(id string) *ha.Replica {
	g.t.Helper()
	cfg := replicaConfig(g.c, nil)
	if g.config != nil {
		cfg = g.config(id)
	}
	if h := g.holes[id]; h != nil {
		cfg.Host = "https://" + h.addr()
	}
	ct := &cut{}
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		if g.wrap != nil {
			rt = g.wrap(id, rt)
		}
		ct.rt = rt
		return ct
	}
	log := logrus.New()
	log.SetLevel(logrus.WarnLevel)
	r, err := ha.New(Store(cfg, cmp.Or(g.namespace, replicaNamespace), StoreOptions{Buckets: cmp.Or(g.buckets, 16), Metrics: g.metrics}), ha.Options{
		Prefix: g.group, ID: id, TTL: cmp.Or(g.ttl, replicaTTL), Settle: 500 * time.Millisecond, Logger: log, Mode: g.mode,
	})
	if err != nil {
		g.t.Fatalf("New(%s): %v", id, err)
	}
	for _, n := range g.names {
		p := g.runs.params(id, n)
		if g.params != nil {
			p = g.params(r, id, n)
		}
		if err := r.UpdateController(n, p); err != nil {
			g.t.Fatalf("UpdateController(%s, %s): %v", id, n, err)
		}
	}
	events := r.Events(context.Background()) // closed once r has stopped
	if g.fencesOf[id] == nil {
		g.fencesOf[id] = &atomic.Int64{}
	}
	fenced := g.fencesOf[id]
	g.events.Go(func() {
		for ev := range events {
			if ev.Kind == ha.FencePassed {
				g.fences.Add(1)
				fenced.Add(1)
				g.t.Logf("replica %s: fence passed: %v", id, ev.Err)
			}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := r.Join(ctx); err != nil {
		_ = r.Close()
		g.t.Fatalf("Join(%s): %v", id, err)
	}
	g.cuts[id], g.rs[id] = ct, r
	return r
}

// waitPlaced waits, within limit, until every name runs on exactly one
// replica, all of them among on, and returns how long it took and where
// each runs.
func (g *kubeReplicas) waitPlaced(what string, limit time.Duration, on ...string) (time.Duration, map[string]string) {
	g.t.Helper()
	return g.runs.waitPlaced(g.t, g.names, what, limit, on...)
}

// waitPlaced waits, within limit, until every name of names runs on
// exactly one replica, all of them among on, and returns how long it took
// and where each runs.
func (r *runs) waitPlaced(t testing.TB, names []string, what string, limit time.Duration, on ...string) (time.Duration, map[string]string) {
	t.Helper()
	start := time.Now()
	ok := map[string]bool{}
	for _, id := range on {
		ok[id] = true
	}
	for {
		where, all := r.placement(names)
		if all {
			good := true
			for _, id := range where {
				good = good && ok[id]
			}
			if good {
				return time.Since(start), where
			}
		}
		if time.Since(start) > limit {
			t.Fatalf("%s: after %v, names run %v; want each on exactly one of %v", what, limit, where, on)
		}
		time.Sleep(20 * time.Millisecond) // a real server's time: polled, loosely bounded
	}
}

// runsMark is where the names ran, and how many runs had started, at
// one moment (kubeReplicas.mark).
type runsMark struct {
	where    map[string]string
	starts   int
	startsOf map[string]int // each name's runs started
}

// mark returns where the names run now, and how many runs started.
func (g *kubeReplicas) mark() runsMark {
	where, _ := g.runs.placement(g.names)
	g.runs.mu.Lock()
	defer g.runs.mu.Unlock()
	m := runsMark{where: where, starts: g.runs.starts, startsOf: map[string]int{}}
	for _, n := range g.names {
		m.startsOf[n] = len(g.runs.began[n])
	}
	return m
}

// keptSince returns how many runs started since m, and whether every
// name runs now, once, on the replica it ran on at m.
func (g *kubeReplicas) keptSince(m runsMark) (restarted int, kept bool) {
	now, all := g.runs.placement(g.names)
	g.runs.mu.Lock()
	defer g.runs.mu.Unlock()
	return g.runs.starts - m.starts, all && maps.Equal(now, m.where)
}

// firstStartSince returns the earliest start of a run of any of names at
// or after since, and whether there was one.
func (r *runs) firstStartSince(names []string, since time.Time) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var first time.Time
	for _, n := range names {
		for _, at := range r.began[n] {
			if !at.Before(since) && (first.IsZero() || at.Before(first)) {
				first = at
			}
		}
	}
	return first, !first.IsZero()
}

// checkTokens checks what ClaimFrom gave every run: the name, its bucket
// Lease as the key, and a token that grew from each holding of the name
// to the next.
func (g *kubeReplicas) checkTokens() {
	g.t.Helper()
	g.runs.mu.Lock()
	defer g.runs.mu.Unlock()
	moved := 0
	for _, n := range g.names {
		cs := g.runs.claims[n]
		if len(cs) == 0 {
			g.t.Errorf("%s ran without a Claim in its context", n)
		}
		for i, c := range cs {
			if c.Name != n || !strings.HasPrefix(c.Key, g.group+"-b-") {
				g.t.Errorf("%s's claim %+v: want its name and its bucket Lease %s-b-<i> as the key", n, c, g.group)
			}
			if i > 0 && c.Revision != cs[i-1].Revision {
				moved++
				if c.Token <= cs[i-1].Token {
					g.t.Errorf("%s held anew with token %d after token %d; want it to grow", n, c.Token, cs[i-1].Token)
				}
			}
		}
	}
	if moved == 0 {
		g.t.Errorf("no name was held anew; want the crash and the leave to move some")
	}
}

// Three replicas spread the names, a crashed one's names move to the
// others once its session ended, a leaving one's at once, and no name
// ever runs twice at once.
func TestReplicasOnKubernetesSpreadCrashAndLeave(t *testing.T) {
	t.Parallel() // each in a group of its own; their waits overlap
	g := newKubeReplicas(t, 60)
	for _, id := range []string{"a", "b", "c"} {
		g.join(id)
	}
	took, where := g.waitPlaced("three replicas placing", 30*time.Second, "a", "b", "c")
	per := map[string]int{}
	for _, id := range where {
		per[id]++
	}
	t.Logf("placed in %v: %v", took, per)
	for _, id := range []string{"a", "b", "c"} {
		if per[id] == 0 {
			t.Errorf("replica %s runs none of 60 names (%v); want a share", id, per)
		}
	}

	// A crash: c is cut off and closed, so it never ends its session.
	g.cuts["c"].off.Store(true)
	crashed := time.Now()
	if err := g.rs["c"].Close(); err != nil {
		t.Logf("Close(c) cut off: %v", err)
	}
	delete(g.rs, "c")
	g.waitPlaced("after c crashed", replicaTTL+20*time.Second, "a", "b")
	t.Logf("c's names run elsewhere %v after its crash (D = %v)", time.Since(crashed), replicaTTL)
	if since := time.Since(crashed); since < replicaTTL-time.Second {
		t.Errorf("c's names ran elsewhere %v after its crash, before its session of %v could have ended", since, replicaTTL)
	}

	// A graceful leave: b's names move to a without waiting for D.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	left := time.Now()
	if err := g.rs["b"].Leave(ctx); err != nil {
		t.Errorf("Leave(b): %v", err)
	}
	delete(g.rs, "b")
	took, _ = g.waitPlaced("after b left", 20*time.Second, "a")
	g.checkTokens()
	t.Logf("b's names run on a %v after its Leave returned (%v from the call)", took, time.Since(left))
	if took > replicaTTL/2 {
		t.Errorf("b's names ran on a %v after b's Leave returned; want them handed over at once, well within its session's %v", took, replicaTTL)
	}
}

// A replica cut off from the API server stops its names by its fence, the
// others start them only once their observers count its session ended,
// and, healed, it joins again and gets a share back; no name ever runs
// twice at once.
func TestReplicaOnKubernetesPartitioned(t *testing.T) {
	t.Parallel() // each in a group of its own; their waits overlap
	g := newKubeReplicas(t, 60)
	for _, id := range []string{"a", "b", "c"} {
		g.join(id)
	}
	g.waitPlaced("three replicas placing", 30*time.Second, "a", "b", "c")

	g.cuts["b"].off.Store(true)
	cutAt := time.Now()
	g.waitPlaced("after b was cut off", replicaTTL+20*time.Second, "a", "c")
	t.Logf("b cut off: its names run elsewhere %v later (D = %v)", time.Since(cutAt), replicaTTL)
	if since := time.Since(cutAt); since < replicaTTL-time.Second {
		t.Errorf("b's names ran elsewhere %v after the cut, before its session of %v could have ended", since, replicaTTL)
	}

	g.cuts["b"].off.Store(false)
	healed := time.Now()
	for {
		where, all := g.runs.placement(g.names)
		n := 0
		for _, id := range where {
			if id == "b" {
				n++
			}
		}
		if all && n > 0 {
			t.Logf("healed: b runs %d names again %v later", n, time.Since(healed))
			break
		}
		if time.Since(healed) > 30*time.Second {
			t.Fatalf("30s after the heal b runs %d names (every name on one replica: %v); want a share back", n, all)
		}
		time.Sleep(20 * time.Millisecond) // a real server's time: polled, loosely bounded
	}
}

// A replica whose requests go unanswered (a black hole: its connections
// stay open, no byte crosses) stops its names by its fence, which counts
// from each renewal's send, though no request of its fails; the others
// start them only once their observers count its session ended, and,
// healed, it gets a share back; no name ever runs twice at once.
func TestReplicaOnKubernetesBlackHoled(t *testing.T) {
	t.Parallel() // each in a group of its own; their waits overlap
	g := newKubeReplicas(t, 60)
	g.holes = map[string]*blackHole{"b": newBlackHole(t, strings.TrimPrefix(g.c.api.url, "https://"))}
	for _, id := range []string{"a", "b", "c"} {
		g.join(id)
	}
	g.waitPlaced("three replicas placing", 30*time.Second, "a", "b", "c")

	g.holes["b"].cut()
	cutAt := time.Now()
	g.waitPlaced("after b was black-holed", replicaTTL+20*time.Second, "a", "c")
	if since := time.Since(cutAt); since < replicaTTL-time.Second {
		t.Errorf("b's names ran elsewhere %v after the cut, before its session of %v could have ended", since, replicaTTL)
	}
	t.Logf("b black-holed: its names run elsewhere %v later (D = %v)", time.Since(cutAt), replicaTTL)

	g.holes["b"].heal()
	healed := time.Now()
	for g.runs.on("b") == 0 {
		if time.Since(healed) > 60*time.Second {
			t.Fatalf("60s after the heal b runs no name; want a share back")
		}
		time.Sleep(20 * time.Millisecond) // a real server's time: polled, loosely bounded
	}
	g.waitPlaced("b healed", 30*time.Second, "a", "b", "c")
	t.Logf("healed: b runs %d names again %v later", g.runs.on("b"), time.Since(healed))
}
