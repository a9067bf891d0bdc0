// Review of the restart wait on Kubernetes (issue 36): the restarted
// run's own readings of its earlier run's member Lease (earlierLeft),
// with no other replica's observer to prove the end for it, and what it
// answers when another observer's delete races its proof.

package kube

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"

	controller "github.com/bgctl/controller"
	"github.com/bgctl/controller/ha"
)

// A replica restarted under its ID in a group where no other replica
// runs (no watcher: hatest's RestartWaitsForTheEarlierRunsSilentSession
// runs beside the harness's watcher, whose observer proves the end as
// well, so it passes on Kubernetes even if the restarted run never
// proves anything itself) reads its earlier run's session as live until
// D after its first reading, and then proves it ended itself: by its
// own delete of the member Lease, guarded by the version it stamped.
func TestRestartReviewRunAloneProvesItsEarlierSessionEnded(t *testing.T) {
	t.Parallel()
	c := needCluster(t)
	g := newTestGroup(t, c, 4, nil)
	earlier := newKubeBackend(otherReplica(t, c, g, nil), "r0", slog.New(slog.DiscardHandler), nil, 5*time.Second)
	s, err := earlier.Begin(t.Context(), 0, testD, "digest")
	if err != nil {
		t.Fatal(err)
	}
	renewed := time.Now()
	if _, err := earlier.Renew(t.Context(), s.ID); err != nil { // its last: it crashes after it
		t.Fatal(err)
	}
	tp := &tap{}
	later := newKubeBackend(otherReplica(t, c, g, tp), "r0", slog.New(slog.DiscardHandler), nil, 5*time.Second)
	var first time.Time
	for {
		left, _, err := later.TimeLeft(t.Context(), s.ID)
		now := time.Now()
		if first.IsZero() {
			first = now
		}
		if errors.Is(err, ha.ErrSessionEnded) {
			if now.Before(renewed.Add(testD)) {
				t.Errorf("ended %v before the earlier run's validity ran out", renewed.Add(testD).Sub(now))
			}
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if now.Sub(first) > testD+3*time.Second {
			t.Fatalf("the earlier run's session, silent, still lives %v after the first reading (%v left)", now.Sub(first), left)
		}
		time.Sleep(restartPollForTest)
	}
	if n := tp.deletes.Load(); n != 1 {
		t.Errorf("the restarted run sent %d deletes of its earlier run's member Lease; want its one guarded delete", n)
	}
	if _, err := earlier.g.leases.Get(t.Context(), g.memberName("r0"), metav1.GetOptions{}); err == nil {
		t.Error("the earlier run's member Lease is still there")
	}
}

// restartPollForTest is ha's restartPoll (ha/restart.go).
const restartPollForTest = 500 * time.Millisecond

// raceDelete is a replica's Lease client whose next Get, once armed,
// is answered and then followed, before the answer reaches the caller,
// by a delete of the Lease read, as another replica's observer proving
// the same silent session ended would delete it (guarded by the version
// read: the one it stamped).
type raceDelete struct {
	coordinationv1client.LeaseInterface
	admin coordinationv1client.LeaseInterface
	armed atomic.Bool
}

func (r *raceDelete) Get(ctx context.Context, name string, opts metav1.GetOptions) (*coordinationv1.Lease, error) {
	l, err := r.LeaseInterface.Get(ctx, name, opts)
	if err == nil && r.armed.Swap(false) {
		uid, rv := l.UID, l.ResourceVersion
		if derr := r.admin.Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}}); derr != nil {
			return nil, derr
		}
	}
	return l, err
}

// The restarted run's reading that finds, at its proof, the earlier
// run's member Lease deleted by another replica's observer (which
// stamped it earlier, from its feed, and proves the same end) answers
// that the session ended, as a reading that finds the Lease gone at
// once does, or at least no end later than the one it answered
// before: a moved end is what ha's restart wait counts as a renewal,
// two of which make Join fail with ErrDuplicateID.
func TestRestartReviewSessionDeletedByAnotherObserverAtTheProofIsNoRenewal(t *testing.T) {
	t.Parallel()
	c := needCluster(t)
	g := newTestGroup(t, c, 4, nil)
	earlier := newKubeBackend(otherReplica(t, c, g, nil), "r0", slog.New(slog.DiscardHandler), nil, 5*time.Second)
	s, err := earlier.Begin(t.Context(), 0, testD, "digest")
	if err != nil {
		t.Fatal(err)
	}
	lg := otherReplica(t, c, g, nil)
	rd := &raceDelete{LeaseInterface: lg.leases, admin: c.admin.CoordinationV1().Leases(replicaNamespace)}
	lg.leases = rd
	later := newKubeBackend(lg, "r0", slog.New(slog.DiscardHandler), nil, 5*time.Second)

	sent := time.Now()
	left, _, err := later.TimeLeft(t.Context(), s.ID)
	if err != nil {
		t.Fatalf("the first reading: %v", err)
	}
	end := sent.Add(left) // the end the first reading implies
	time.Sleep(time.Until(end) + 50*time.Millisecond)
	rd.armed.Store(true) // the reading's own read is answered, then the other observer's delete lands
	sent = time.Now()
	left, _, err = later.TimeLeft(t.Context(), s.ID)
	switch {
	case errors.Is(err, ha.ErrSessionEnded):
	case err != nil:
		t.Fatalf("the reading at the proof: %v", err)
	case sent.Add(left).After(end.Add(time.Second)):
		t.Errorf("the reading at the proof, the Lease deleted by another observer meanwhile, answered %v left: an end %v later than the first reading's, which ha counts as a renewal of a live duplicate; want ha.ErrSessionEnded",
			left.Round(time.Millisecond), sent.Add(left).Sub(end).Round(time.Millisecond))
	}
	if rd.armed.Load() {
		t.Fatal("the race was not set up: no read after arming")
	}
}

// memberGets sits in a replica's HTTP transport: it records when each GET
// of member Lease name was answered, and the first such GET sent at or
// after fireAt (once set) is followed, before its answer reaches the
// replica, by a delete of the Lease: another replica's observer, which
// stamped the same version earlier, proving the session ended while the
// replica's own proof is under way.
type memberGets struct {
	rt     http.RoundTripper
	path   string // the member Lease's URL path
	delete func() error

	mu     sync.Mutex
	recv   []time.Time // guarded by mu: when each GET of path was answered
	fireAt time.Time   // guarded by mu: zero: never
	fired  bool        // guarded by mu
}

func (m *memberGets) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method != http.MethodGet || req.URL.Path != m.path {
		return m.rt.RoundTrip(req)
	}
	m.mu.Lock()
	fire := !m.fired && !m.fireAt.IsZero() && !time.Now().Before(m.fireAt)
	m.fired = m.fired || fire
	m.mu.Unlock()
	resp, err := m.rt.RoundTrip(req)
	at := time.Now()
	if fire && err == nil {
		if derr := m.delete(); derr != nil {
			return nil, derr
		}
	}
	m.mu.Lock()
	m.recv = append(m.recv, at)
	m.mu.Unlock()
	return resp, err
}

// A replica restarted under its ID after a crash, whose earlier run
// made one last write that landed late (a renewal in flight as the
// process died, queued by the API server: it lands 1.6s after the
// restarted run's first reading), and whose member Lease another
// replica's observer deletes just as the restarted run's own proof is
// under way, joins: the earlier run is silent, no live duplicate. ha's
// restart wait counts a renewal for each reading whose end lies wholly
// past the last; the late write is one, and earlierLeft answering a
// full D left when its proof finds the Lease deleted by another is a
// second, so Join fails with ErrDuplicateID.
func TestRestartReviewJoinAfterALateWriteAndARacingProofIsNoDuplicate(t *testing.T) {
	t.Parallel()
	const d = 4 * time.Second
	c := needCluster(t)
	g := newTestGroupOf(t, c, 16, d, nil)
	earlier := newKubeBackend(g, "r", slog.New(slog.DiscardHandler), nil, 5*time.Second)
	s, err := earlier.Begin(t.Context(), 0, d, "")
	if err != nil {
		t.Fatal(err)
	}
	admin := c.admin.CoordinationV1().Leases(replicaNamespace)
	mg := &memberGets{
		path:   "/apis/coordination.k8s.io/v1/namespaces/" + replicaNamespace + "/leases/" + g.memberName("r"),
		delete: func() error { return admin.Delete(context.Background(), g.memberName("r"), metav1.DeleteOptions{}) },
	}
	cfg := replicaConfig(c, nil)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		c.track(&http.Client{Transport: rt})
		mg.rt = rt
		return mg
	}
	log := logrus.New()
	log.SetLevel(logrus.WarnLevel)
	r, err := ha.New(Store(cfg, replicaNamespace, StoreOptions{Buckets: 16}), ha.Options{Prefix: g.name, ID: "r", TTL: d, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Close() }()
	joined := make(chan error, 1)
	go func() { // joined below, through joined
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		joined <- r.Join(ctx)
	}()
	gets := func() []time.Time {
		mg.mu.Lock()
		defer mg.mu.Unlock()
		return slices.Clone(mg.recv)
	}
	for len(gets()) < 2 { // MemberSession, then the first reading (TimeLeft)
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(time.Until(gets()[1].Add(1600 * time.Millisecond)))
	wrote := time.Now()
	if _, err := earlier.Renew(t.Context(), s.ID); err != nil { // the late write
		t.Fatal(err)
	}
	var restamped time.Time // the reading that saw the late write first
	for restamped.IsZero() {
		for _, at := range gets() {
			if at.After(wrote.Add(50 * time.Millisecond)) {
				restamped = at
				break
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	mg.mu.Lock()
	mg.fireAt = restamped.Add(d)
	mg.mu.Unlock()
	err = <-joined
	mg.mu.Lock()
	fired := mg.fired
	mg.mu.Unlock()
	t.Logf("Join: %v (the racing delete landed: %v)", err, fired)
	if errors.Is(err, ha.ErrDuplicateID) {
		t.Errorf("the restarted replica's Join, its earlier run crashed: %v; want it to join", err)
	} else if err != nil {
		t.Fatalf("Join: %v", err)
	}
}

// A second process started under the ID of a live replica (a real
// duplicate, not a restart), at D = 4s and at the default-like D = 15s
// (renewals every (TTL − Margin)/4, readings every 500ms), fails Join
// with ErrDuplicateID within a few renewals; and the
// live replica's session is never ended by the duplicate's readings: its
// fence never passes, and it keeps its lease.
func TestRestartReviewLiveDuplicateIsRefusedAndLeftAlone(t *testing.T) {
	t.Parallel()
	c := needCluster(t)
	for _, d := range []time.Duration{4 * time.Second, 15 * time.Second} {
		t.Run(d.String(), func(t *testing.T) {
			t.Parallel()
			g := newTestGroupOf(t, c, 16, d, nil)
			newReplica := func() *ha.Replica {
				log := logrus.New()
				log.SetLevel(logrus.WarnLevel)
				r, err := ha.New(Store(replicaConfig(c, nil), replicaNamespace, StoreOptions{Buckets: 16}), ha.Options{Prefix: g.name, ID: "r", TTL: d, Logger: log})
				if err != nil {
					t.Fatal(err)
				}
				return r
			}
			live := newReplica()
			defer func() { _ = live.Close() }()
			events := live.Events(t.Context())
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			if err := live.Join(ctx); err != nil {
				t.Fatal(err)
			}
			dup := newReplica()
			defer func() { _ = dup.Close() }()
			start := time.Now()
			err := dup.Join(ctx)
			took := time.Since(start)
			t.Logf("the duplicate's Join: %v, after %v (D = %v)", err, took.Round(time.Millisecond), d)
			if !errors.Is(err, ha.ErrDuplicateID) {
				t.Fatalf("the duplicate's Join: %v, want ErrDuplicateID", err)
			}
			if took > d+2*time.Second {
				t.Errorf("the duplicate was told after %v (D = %v); want within a few renewals", took, d)
			}
			time.Sleep(d) // a D more of the live replica, renewing
			for {
				select {
				case e := <-events:
					if e.Kind == ha.FencePassed || e.Kind == ha.LeaseLost {
						t.Errorf("the live replica: %v (%v)", e.Kind, e.Err)
					}
					continue
				default:
				}
				break
			}
			if err := live.Health(); err != nil {
				t.Errorf("the live replica's health: %v", err)
			}
		})
	}
}

// A replica restarted under its ID whose earlier run is frozen, not
// crashed, right after a renewal, and whose member Lease an
// administrator deletes by hand (kubectl delete) after the restarted
// run's first reading stamped an older version of it: the restarted run
// finds the Lease gone and joins at once (nothing to wait for, on the
// record), but starts none of the earlier run's names before the
// validity of that run's last renewal, whose fence may still be open.
func TestRestartReviewLeaseDeletedByHandStartsNoNameEarly(t *testing.T) {
	t.Parallel()
	const d = 4 * time.Second
	c := needCluster(t)
	g := newTestGroupOf(t, c, 16, d, nil)
	earlier := newKubeBackend(g, "r", slog.New(slog.DiscardHandler), nil, 5*time.Second)
	s, err := earlier.Begin(t.Context(), 0, d, "")
	if err != nil {
		t.Fatal(err)
	}
	if got, _, err := earlier.Claim(t.Context(), s.ID, []string{"job"}); err != nil || len(got) != 1 || !got[0].Mine {
		t.Fatalf("the earlier run's claim of job: %v, %v", got, err)
	}
	admin := c.admin.CoordinationV1().Leases(replicaNamespace)
	mg := &memberGets{path: "/apis/coordination.k8s.io/v1/namespaces/" + replicaNamespace + "/leases/" + g.memberName("r")}
	cfg := replicaConfig(c, nil)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		c.track(&http.Client{Transport: rt})
		mg.rt = rt
		return mg
	}
	log := logrus.New()
	log.SetLevel(logrus.WarnLevel)
	r, err := ha.New(Store(cfg, replicaNamespace, StoreOptions{Buckets: 16}), ha.Options{Prefix: g.name, ID: "r", TTL: d, Settle: -1, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Close() }()
	started := make(chan time.Time, 1)
	if err := r.UpdateController("job", controller.ControllerParams{DoFunc: func(ctx context.Context) error {
		select {
		case started <- time.Now():
		default:
		}
		<-ctx.Done()
		return nil
	}}); err != nil {
		t.Fatal(err)
	}
	joined := make(chan error, 1)
	go func() { // joined below, through joined
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		joined <- r.Join(ctx)
	}()
	for {
		mg.mu.Lock()
		n := len(mg.recv)
		mg.mu.Unlock()
		if n >= 2 { // MemberSession, then the first reading, which stamps the version
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	renewed := time.Now()
	if _, err := earlier.Renew(t.Context(), s.ID); err != nil { // its last: then it freezes
		t.Fatal(err)
	}
	if err := admin.Delete(t.Context(), g.memberName("r"), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := <-joined; err != nil {
		t.Fatalf("Join: %v", err)
	}
	joinedAt := time.Since(renewed)
	select {
	case at := <-started:
		t.Logf("joined %v and started job %v after the earlier run's last renewal (D = %v)", joinedAt.Round(time.Millisecond), at.Sub(renewed).Round(time.Millisecond), d)
		if at.Before(renewed.Add(d)) {
			t.Errorf("the restarted run started job %v after the earlier run's last renewal, before its validity (%v) ran out", at.Sub(renewed), d)
		}
	case <-time.After(4*d + 5*time.Second):
		t.Fatal("the restarted run never started job")
	}
}
