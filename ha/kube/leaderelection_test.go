// What users run today: client-go's tools/leaderelection with a Lease
// lock, measured against the tests' kube-apiserver, so
// that the backend's figures can stand beside it; and the one thing of it
// that a test can show every run. The figures, and the command that
// measures them, are in doc.go.

package kube

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"
)

var (
	leMeasure = flag.Bool("kube.lemeasure", false, "measure client-go's tools/leaderelection (crash, partition, graceful leave, steady state) at controller-runtime's defaults and at a short setting; takes about 8 minutes")
	leRuns    = flag.Int("kube.lemeasure.runs", 3, "with -kube.lemeasure: how many times each case runs")
	leSteady  = flag.Duration("kube.lemeasure.steady", 30*time.Second, "with -kube.lemeasure: how long each steady-state window counts the Lease's writes")
)

// leSetting is a LeaderElectionConfig's three durations.
type leSetting struct {
	name                                      string
	leaseDuration, renewDeadline, retryPeriod time.Duration
}

func (s leSetting) String() string {
	return fmt.Sprintf("%s (LeaseDuration %v, RenewDeadline %v, RetryPeriod %v)", s.name, s.leaseDuration, s.renewDeadline, s.retryPeriod)
}

var (
	// controllerRuntimeDefaults are controller-runtime's manager's
	// defaults, and client-go's documented "core clients" values.
	controllerRuntimeDefaults = leSetting{"controller-runtime's defaults", 15 * time.Second, 10 * time.Second, 2 * time.Second}
	// shortSetting is what kube-vip's manifests set (vip_leaseduration 5,
	// vip_renewdeadline 3, vip_retryperiod 1): a short setting in wide
	// use. The Lease stores its duration in whole seconds, client-go wants
	// RenewDeadline above 1.2 RetryPeriod, and this keeps the one second
	// client-go's own arithmetic leaves between a cut-off leader giving up
	// (RetryPeriod + RenewDeadline after its last renewal) and the others
	// taking over (LeaseDuration after they saw it), where 4/3/1 leaves
	// none.
	shortSetting = leSetting{"short (kube-vip's)", 5 * time.Second, 3 * time.Second, 1 * time.Second}
)

// leEventKind says which of a candidate's callbacks fired.
type leEventKind int

const (
	leStarted      leEventKind = iota // OnStartedLeading was called
	leCodeReturned                    // the OnStartedLeading callback returned
	leStopped                         // OnStoppedLeading was called: Run is returning
	leNewLeader                       // OnNewLeader was called with leader
)

// leEvent is one callback of one candidate, and when it fired.
type leEvent struct {
	kind   leEventKind
	who    string // the candidate
	leader string // for leNewLeader
	at     time.Time
}

// leRecorder keeps every callback of a group's candidates, in order, for
// the test to wait on. The callbacks run on goroutines client-go starts.
type leRecorder struct {
	mu      sync.Mutex
	events  []leEvent     // guarded by mu
	changed chan struct{} // guarded by mu; closed and replaced by every add
}

func newLERecorder() *leRecorder { return &leRecorder{changed: make(chan struct{})} }

func (r *leRecorder) add(e leEvent) {
	e.at = time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
	close(r.changed)
	r.changed = make(chan struct{})
}

// waitUntil waits up to timeout for cond, given every event so far, to
// hold, and says whether it did.
func (r *leRecorder) waitUntil(timeout time.Duration, cond func([]leEvent) bool) bool {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		ok, changed := cond(r.events), r.changed
		r.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-changed:
		case <-deadline.C:
			return false
		}
	}
}

// waitFor returns the first event that matches, waiting up to timeout
// for it; false when none came.
func (r *leRecorder) waitFor(timeout time.Duration, match func(leEvent) bool) (leEvent, bool) {
	var found leEvent
	ok := r.waitUntil(timeout, func(events []leEvent) bool {
		i := slices.IndexFunc(events, match)
		if i >= 0 {
			found = events[i]
		}
		return i >= 0
	})
	return found, ok
}

// countOf is how many of events are of kind.
func countOf(events []leEvent, kind leEventKind) int {
	n := 0
	for _, e := range events {
		if e.kind == kind {
			n++
		}
	}
	return n
}

// requestCounts are the requests a candidate's clients sent, by verb.
type requestCounts struct{ gets, puts, posts atomic.Int64 }

// countingTransport counts each request in counts and sends it on.
type countingTransport struct {
	counts *requestCounts
	next   http.RoundTripper
}

func (c countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	switch req.Method {
	case http.MethodGet:
		c.counts.gets.Add(1)
	case http.MethodPut:
		c.counts.puts.Add(1)
	case http.MethodPost:
		c.counts.posts.Add(1)
	}
	return c.next.RoundTrip(req)
}

// candidate is one replica running client-go's elector: its own client,
// through its own proxy to the API server, and its current Run.
type candidate struct {
	id       string
	proxy    *blackHole
	config   *rest.Config // through proxy, as the replicas
	requests *requestCounts

	cancel context.CancelFunc // ends the current Run
	ran    chan struct{}      // closed when the current Run returned
}

// electionGroup is three candidates electing a leader on one Lease, the
// callbacks they made, and what ends them when the test does.
type electionGroup struct {
	t       testing.TB
	c       *cluster
	setting leSetting
	lease   string
	release bool // ReleaseOnCancel
	rec     *leRecorder
	cands   []*candidate

	// hold, when not nil, keeps a leader's OnStartedLeading callback from
	// returning after its context is done until hold is closed: code that
	// takes its time to stop.
	hold chan struct{}
}

// newElectionGroup makes three candidates for a Lease of its own, as the
// replicas (the ServiceAccount deploy/rbac.yaml binds), each through its
// own proxy; startAll runs them. The group is stopped when the test ends.
func newElectionGroup(t testing.TB, c *cluster, s leSetting, release bool) *electionGroup {
	t.Helper()
	g := &electionGroup{
		t: t, c: c, setting: s, release: release, rec: newLERecorder(),
		lease: fmt.Sprintf("clientgo-%08x", rand.Uint32()),
	}
	api := strings.TrimPrefix(c.api.url, "https://")
	for i := range 3 {
		cand := &candidate{id: fmt.Sprintf("candidate-%d", i+1), proxy: newBlackHole(t, api), requests: &requestCounts{}}
		cand.config = &rest.Config{
			Host:            "https://" + cand.proxy.addr(),
			BearerToken:     c.api.replicaToken,
			TLSClientConfig: rest.TLSClientConfig{CAFile: c.api.caFile},
			WrapTransport: func(rt http.RoundTripper) http.RoundTripper {
				return countingTransport{counts: cand.requests, next: rt}
			},
		}
		g.cands = append(g.cands, cand)
	}
	// Registered after the proxies' Cleanup, so it runs before they close.
	t.Cleanup(g.stop)
	return g
}

// run starts a Run of cand's elector, as a process of it starting would:
// a new lock and a new client, made the way client-go's NewFromKubeconfig
// makes them (a request timeout of RenewDeadline/2, at least a second).
func (g *electionGroup) run(cand *candidate) {
	g.t.Helper()
	lock, err := resourcelock.NewFromKubeconfig(resourcelock.LeasesResourceLock, replicaNamespace, g.lease,
		resourcelock.ResourceLockConfig{Identity: cand.id}, cand.config, g.setting.renewDeadline)
	if err != nil {
		g.t.Fatal(err)
	}
	id := cand.id
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   g.setting.leaseDuration,
		RenewDeadline:   g.setting.renewDeadline,
		RetryPeriod:     g.setting.retryPeriod,
		ReleaseOnCancel: g.release,
		Name:            g.lease,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				g.rec.add(leEvent{kind: leStarted, who: id})
				<-ctx.Done()
				if g.hold != nil {
					<-g.hold
				}
				g.rec.add(leEvent{kind: leCodeReturned, who: id})
			},
			OnStoppedLeading: func() { g.rec.add(leEvent{kind: leStopped, who: id}) },
			OnNewLeader:      func(leader string) { g.rec.add(leEvent{kind: leNewLeader, who: id, leader: leader}) },
		},
	})
	if err != nil {
		g.t.Fatal(err)
	}
	// client-go logs every failed renewal; the figures are the output.
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logr.Discard()))
	cand.cancel, cand.ran = cancel, make(chan struct{})
	ran := cand.ran
	go func() { // joined by stop, through ran
		defer close(ran)
		le.Run(ctx)
	}()
}

// startAll runs every candidate and returns the one that leads, once the
// others have seen it lead.
func (g *electionGroup) startAll() *candidate {
	g.t.Helper()
	for _, cand := range g.cands {
		g.run(cand)
	}
	timeout := 2 * g.setting.leaseDuration
	started, ok := g.rec.waitFor(timeout, func(e leEvent) bool { return e.kind == leStarted })
	if !ok {
		g.t.Fatalf("%s: no candidate started leading within %v", g.lease, timeout)
	}
	for _, cand := range g.cands {
		if _, ok := g.rec.waitFor(timeout, func(e leEvent) bool {
			return e.kind == leNewLeader && e.who == cand.id && e.leader == started.who
		}); !ok {
			g.t.Fatalf("%s: %s did not see %s lead within %v", g.lease, cand.id, started.who, timeout)
		}
	}
	return g.candidate(started.who)
}

func (g *electionGroup) candidate(id string) *candidate {
	for _, cand := range g.cands {
		if cand.id == id {
			return cand
		}
	}
	panic("no candidate " + id)
}

// settle waits two renewals and a random part of a third, so that what
// the test does next falls anywhere in the leader's renewal period, as a
// crash would.
func (g *electionGroup) settle() {
	time.Sleep(2*g.setting.retryPeriod + rand.N(g.setting.retryPeriod))
}

// nextLeader waits for a candidate other than old to start leading after
// since, up to timeout.
func (g *electionGroup) nextLeader(old *candidate, since time.Time, timeout time.Duration) (leEvent, bool) {
	return g.rec.waitFor(timeout, func(e leEvent) bool {
		return e.kind == leStarted && e.who != old.id && !e.at.Before(since)
	})
}

// stop ends every candidate's Run, lets held code return, waits until
// every leader's callback has returned, and deletes the Lease.
func (g *electionGroup) stop() {
	for _, cand := range g.cands {
		if cand.cancel != nil {
			cand.cancel()
		}
	}
	for _, cand := range g.cands {
		if cand.ran != nil {
			<-cand.ran // within RenewDeadline: a release's own timeout
		}
	}
	if g.hold != nil {
		select {
		case <-g.hold:
		default:
			close(g.hold)
		}
	}
	if !g.rec.waitUntil(10*time.Second, func(events []leEvent) bool {
		return countOf(events, leCodeReturned) == countOf(events, leStarted)
	}) {
		g.t.Errorf("%s: a leader's callback did not return within 10s of its Run", g.lease)
	}
	_ = g.c.admin.CoordinationV1().Leases(replicaNamespace).Delete(context.Background(), g.lease, metav1.DeleteOptions{})
}

// With client-go, a leader that leaves gracefully (ReleaseOnCancel, its
// context cancelled) hands the Lease on without waiting for its own code:
// another candidate starts leading, and the leaving one's Run returns,
// while the code it ran as leader is still stopping. client-go says so
// (ReleaseOnCancel asks the caller to have stopped that code before
// cancelling); ha's Leave keeps a name until its code has returned (rule
// 2 in ha's package documentation), and the Kubernetes backend must too.
func TestClientGoHandsOverBeforeTheLeavingLeadersCodeStops(t *testing.T) {
	c := needCluster(t)
	applyManifest(t, c)
	g := newElectionGroup(t, c, shortSetting, true)
	g.hold = make(chan struct{}) // the leaving leader's code stops only once the test has seen the next one start
	leader := g.startAll()

	leftAt := time.Now()
	leader.cancel()
	next, ok := g.nextLeader(leader, leftAt, 20*time.Second)
	if !ok {
		t.Fatalf("no other candidate started leading within 20s of %s leaving", leader.id)
	}
	select {
	case <-leader.ran:
	case <-time.After(20 * time.Second):
		t.Fatalf("%s's Run did not return within 20s of its context being cancelled", leader.id)
	}
	t.Logf("%s left; %s started leading %v later, while %s's code was still stopping", leader.id, next.who, next.at.Sub(leftAt).Round(time.Millisecond), leader.id)
	close(g.hold)
}

// TestClientGoLeaderElectionMeasurement measures client-go's elector at
// controller-runtime's defaults and at a short setting: a crash's
// takeover, a partition's (and whether the two leaders overlap), a
// graceful leave's, and the writes of a steady state. Off by default: a
// measurement, minutes long.
func TestClientGoLeaderElectionMeasurement(t *testing.T) {
	if !*leMeasure {
		t.Log("a measurement of about 8 minutes, off by default; run it with: go test -count=1 -v -timeout 30m -run '^TestClientGoLeaderElectionMeasurement$' -kube.lemeasure .")
		return
	}
	c := needCluster(t)
	applyManifest(t, c)
	var report []string
	for _, s := range []leSetting{controllerRuntimeDefaults, shortSetting} {
		var crash, takeover, overlap, follow, graceful []time.Duration
		var writes, reads []float64
		for run := range *leRuns {
			t.Run(fmt.Sprintf("%s/crash/%d", s.leaseDuration, run), func(t *testing.T) {
				crash = append(crash, measureCrash(t, c, s))
			})
			t.Run(fmt.Sprintf("%s/partition/%d", s.leaseDuration, run), func(t *testing.T) {
				to, ov, fo := measurePartition(t, c, s)
				takeover, overlap, follow = append(takeover, to), append(overlap, ov), append(follow, fo)
			})
			t.Run(fmt.Sprintf("%s/graceful/%d", s.leaseDuration, run), func(t *testing.T) {
				graceful = append(graceful, measureGraceful(t, c, s))
			})
			t.Run(fmt.Sprintf("%s/steady/%d", s.leaseDuration, run), func(t *testing.T) {
				w, r := measureSteady(t, c, s, *leSteady)
				writes, reads = append(writes, w), append(reads, r)
			})
		}
		line := func(what, figures string) string { return fmt.Sprintf("  %-62s %s", what+":", figures) }
		report = append(report, s.String()+":",
			line("crash takeover (crash to another's OnStartedLeading)", spread(crash, fmtDuration)),
			line("partition takeover (cut to another's OnStartedLeading)", spread(takeover, fmtDuration)),
			line("partition overlap (another started - cut one stopped)", spread(overlap, fmtDuration)),
			line("heal: the restarted old leader sees the new one", spread(follow, fmtDuration)),
			line("graceful leave (cancel to another's OnStartedLeading)", spread(graceful, fmtDuration)),
			line(fmt.Sprintf("steady state: Lease writes per second (over %v)", *leSteady), spread(writes, fmtRate)),
			line(fmt.Sprintf("steady state: requests per second, all three (over %v)", *leSteady), spread(reads, fmtRate)),
		)
	}
	t.Logf("client-go %s tools/leaderelection, LeaseLock, three candidates each through its own proxy, against kube-apiserver %s; %d runs, min / median / max:\n%s",
		clientGoVersion, c.release, *leRuns, strings.Join(report, "\n"))
}

// clientGoVersion is the client-go the module requires (go.mod).
const clientGoVersion = "v0.36.3"

// measureCrash kills the leader, as SIGKILL would (it stops, releases
// nothing, and nothing it sent afterwards arrives), and returns the time
// until another candidate leads.
func measureCrash(t *testing.T, c *cluster, s leSetting) time.Duration {
	g := newElectionGroup(t, c, s, false)
	leader := g.startAll()
	g.settle()
	crashedAt := time.Now()
	leader.proxy.cut()
	leader.cancel()
	next, ok := g.nextLeader(leader, crashedAt, 3*s.leaseDuration)
	if !ok {
		t.Fatalf("no candidate took over within %v of %s's crash", 3*s.leaseDuration, leader.id)
	}
	return next.at.Sub(crashedAt)
}

// measurePartition cuts the leader off and returns the time until
// another leads, that start less the cut one's OnStoppedLeading (negative:
// two leaders at once), and, once healed and restarted (its Run has
// returned, as controller-runtime's process exits), the time until the
// old leader follows the new one. It checks that the old one does not
// lead again.
func measurePartition(t *testing.T, c *cluster, s leSetting) (takeover, overlap, follow time.Duration) {
	g := newElectionGroup(t, c, s, false)
	leader := g.startAll()
	g.settle()
	cutAt := time.Now()
	leader.proxy.cut()
	next, ok := g.nextLeader(leader, cutAt, 3*s.leaseDuration)
	if !ok {
		t.Fatalf("no candidate took over within %v of %s being cut off", 3*s.leaseDuration, leader.id)
	}
	stopped, ok := g.rec.waitFor(3*s.leaseDuration, func(e leEvent) bool { return e.kind == leStopped && e.who == leader.id })
	if !ok {
		t.Fatalf("%s, cut off, did not stop leading within %v", leader.id, 3*s.leaseDuration)
	}
	<-leader.ran // OnStoppedLeading is Run's last act

	healedAt := time.Now()
	leader.proxy.heal()
	g.run(leader)
	follows, ok := g.rec.waitFor(3*s.leaseDuration, func(e leEvent) bool {
		return e.kind == leNewLeader && e.who == leader.id && e.leader == next.who && !e.at.Before(healedAt)
	})
	if !ok {
		t.Fatalf("%s, healed and restarted, did not see %s lead within %v", leader.id, next.who, 3*s.leaseDuration)
	}
	time.Sleep(2 * s.retryPeriod) // two of its tries at the Lease
	if g.rec.waitUntil(0, func(events []leEvent) bool {
		return slices.ContainsFunc(events, func(e leEvent) bool { return e.kind == leStarted && e.who == leader.id && !e.at.Before(healedAt) })
	}) {
		t.Errorf("%s, healed and restarted, led again while %s did", leader.id, next.who)
	}
	return next.at.Sub(cutAt), next.at.Sub(stopped.at), follows.at.Sub(healedAt)
}

// measureGraceful cancels the leader's context with ReleaseOnCancel and
// returns the time until another leads.
func measureGraceful(t *testing.T, c *cluster, s leSetting) time.Duration {
	g := newElectionGroup(t, c, s, true)
	leader := g.startAll()
	g.settle()
	leftAt := time.Now()
	leader.cancel()
	next, ok := g.nextLeader(leader, leftAt, 3*s.leaseDuration)
	if !ok {
		t.Fatalf("no candidate took over within %v of %s leaving", 3*s.leaseDuration, leader.id)
	}
	return next.at.Sub(leftAt)
}

// measureSteady counts, over window, the Lease's writes (its Modified
// events, watched as the administrator) and the requests the three
// candidates sent, and returns both per second.
func measureSteady(t *testing.T, c *cluster, s leSetting, window time.Duration) (writes, requests float64) {
	g := newElectionGroup(t, c, s, false)
	g.startAll()
	g.settle()
	leases := c.admin.CoordinationV1().Leases(replicaNamespace)
	cur, err := leases.Get(t.Context(), g.lease, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := leases.Watch(t.Context(), metav1.ListOptions{ResourceVersion: cur.ResourceVersion, FieldSelector: "metadata.name=" + g.lease})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	sent := func() (n int64) {
		for _, cand := range g.cands {
			n += cand.requests.gets.Load() + cand.requests.puts.Load() + cand.requests.posts.Load()
		}
		return n
	}
	before, start := sent(), time.Now()
	end := time.NewTimer(window)
	defer end.Stop()
	modified := 0
	for counting := true; counting; {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatal("the watch of the Lease ended")
			}
			if ev.Type == watch.Modified {
				modified++
			}
		case <-end.C:
			counting = false
		}
	}
	secs := time.Since(start).Seconds()
	return float64(modified) / secs, float64(sent()-before) / secs
}

// spread is values' minimum, median and maximum, formatted.
func spread[T int64 | float64 | time.Duration](values []T, format func(T) string) string {
	if len(values) == 0 {
		return "none"
	}
	v := slices.Clone(values)
	slices.Sort(v)
	return format(v[0]) + " / " + format(v[len(v)/2]) + " / " + format(v[len(v)-1])
}

func fmtDuration(d time.Duration) string { return d.Round(10 * time.Millisecond).String() }

func fmtRate(r float64) string { return fmt.Sprintf("%.2f", r) }
