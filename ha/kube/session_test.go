// Member sessions and observers' expiry against the real kube-apiserver,
// with the replicas' credentials: validity counted from send times, the
// guarded delete and a renewal in flight in both orders, a stalled feed,
// and duplicate sessions.

package kube

import (
	"context"
	"crypto/rand"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bgctl/controller/ha"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

// testD is the tests' member lease duration: short, so that expiry is
// seen in seconds; the waits for it are loose (a few D).
const testD = 2 * time.Second

// tap sits in a replica's HTTP transport: it counts requests by method,
// and holds each PUT's answer back by putDelay before handing it over,
// so that the time a renewal is sent and the time its answer arrives
// are far apart.
type tap struct {
	rt       http.RoundTripper // immutable
	putDelay atomic.Int64      // nanoseconds
	deletes  atomic.Int64      // DELETE requests sent
}

// RoundTrip sends req, then counts it and delays a PUT's answer.
func (tp *tap) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := tp.rt.RoundTrip(req)
	switch req.Method {
	case http.MethodPut:
		time.Sleep(time.Duration(tp.putDelay.Load()))
	case http.MethodDelete:
		tp.deletes.Add(1)
	}
	return resp, err
}

// replicaConfig returns the configuration of a replica's clients: the
// replicas' token (the manifest's ServiceAccount), the server's CA, and
// the transport wrapped in tp if not nil.
func replicaConfig(c *cluster, tp *tap) *rest.Config {
	cfg := &rest.Config{
		Host:            c.api.url,
		BearerToken:     c.api.replicaToken,
		TLSClientConfig: rest.TLSClientConfig{CAFile: c.api.caFile},
		QPS:             1000, Burst: 1000,
	}
	if tp != nil {
		cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { tp.rt = rt; return tp }
	}
	return cfg
}

// replicaHTTP returns an HTTP client for cfg, whose connections the
// cluster closes as it stops.
func replicaHTTP(t testing.TB, c *cluster, cfg *rest.Config) *http.Client {
	t.Helper()
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c.track(hc)
	return hc
}

// newTestGroup applies the manifest and returns a group of a name of its
// own (the tests run several times against one server) with buckets
// buckets and D = testD, for a replica of its own clients (leaseClients,
// tp as in replicaConfig). The administrator deletes the group's Leases
// when the test ends.
func newTestGroup(t *testing.T, c *cluster, buckets int, tp *tap) *group {
	t.Helper()
	return newTestGroupOf(t, c, buckets, testD, tp)
}

// newTestGroupOf is newTestGroup with D = d.
func newTestGroupOf(t *testing.T, c *cluster, buckets int, d time.Duration, tp *tap) *group {
	t.Helper()
	applyManifest(t, c)
	name := "g" + strings.ToLower(rand.Text()[:10])
	g, err := newGroup(nil, nil, name, buckets, d)
	if err != nil {
		t.Fatal(err)
	}
	deleteGroupAtEnd(t, c, name)
	return groupOn(t, c, g, replicaConfig(c, tp))
}

// otherReplica returns g as another replica sees it: the same group, on
// clients of its own (tp as in replicaConfig).
func otherReplica(t *testing.T, c *cluster, g *group, tp *tap) *group {
	t.Helper()
	return groupOn(t, c, g, replicaConfig(c, tp))
}

// groupOn returns g on the clients leaseClients makes of cfg.
func groupOn(t *testing.T, c *cluster, g *group, cfg *rest.Config) *group {
	t.Helper()
	other := *g
	var err error
	other.leases, other.renewals, err = leaseClients(cfg, replicaHTTP(t, c, cfg), replicaNamespace, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &other
}

// mustBegin begins a session of id in g, failing the test if it cannot.
func mustBegin(t *testing.T, g *group, id string) (*session, time.Time) {
	t.Helper()
	s, valid, err := g.begin(t.Context(), id)
	if err != nil {
		t.Fatalf("begin %s: %v", id, err)
	}
	return s, valid
}

// seeNow makes o stamp the member Lease of s as a quorum read finds it now.
func seeNow(t *testing.T, o *observer, s *session) {
	t.Helper()
	l, err := o.g.leases.Get(t.Context(), s.name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	o.see(l, time.Now())
}

// renewing renews s every D/4 on a goroutine of its own until stop is
// called or a renewal fails. stop ends and joins the goroutine, and
// returns the validUntil of the last successful renewal and the error of
// the failed one. A renewal under way when stop is called finishes
// first: one cut short might commit after the client gave up, leaving
// the session's resourceVersion behind the Lease's.
func renewing(s *session) (stop func() (time.Time, error)) {
	quit := make(chan struct{})
	var last time.Time
	var failed error
	done := make(chan struct{})
	go func() { // joined by stop
		defer close(done)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			valid, err := s.renew(ctx)
			cancel()
			if err != nil {
				failed = err
				return
			}
			last = valid
			select {
			case <-quit:
				return
			case <-time.After(testD / 4):
			}
		}
	}()
	return func() (time.Time, error) {
		close(quit)
		<-done
		return last, failed
	}
}

// watchedSession begins session r1 in a group of its own, and has an
// observer of another replica (its transport in otp, if not nil) stamp
// it; it returns the session's validity too.
func watchedSession(t *testing.T, c *cluster, otp *tap) (*group, *observer, *session, time.Time) {
	t.Helper()
	g := newTestGroup(t, c, 4, nil)
	o := newObserver(otherReplica(t, c, g, otp))
	s, valid := mustBegin(t, g, "r1")
	seeNow(t, o, s)
	return g, o, s, valid
}

// sleepUntil sleeps until the monotonic time at.
func sleepUntil(at time.Time) { time.Sleep(time.Until(at)) }

// A renewal answers validUntil = sent + D with sent read before the
// request went out, not when its answer came: with the answer held back a
// second, validUntil still counts from before the request.
func TestRenewalIsValidFromItsSendTime(t *testing.T) {
	c := needCluster(t)
	tp := &tap{}
	g := newTestGroup(t, c, 4, tp)
	s, _ := mustBegin(t, g, "r1")
	const delay = time.Second
	tp.putDelay.Store(int64(delay))
	before := time.Now()
	valid, err := s.renew(t.Context())
	after := time.Now()
	if err != nil {
		t.Fatal(err)
	}
	if after.Sub(before) < delay {
		t.Fatalf("the renewal took %v: the answer was not held back %v", after.Sub(before), delay)
	}
	// before <= sent <= after − delay (the request went out before its
	// answer was held back), so before + D <= validUntil <= after − delay + D.
	if valid.Before(before.Add(testD)) || valid.After(after.Add(testD-delay)) {
		t.Fatalf("validUntil is %v after the renewal was called (answered %v after), want within [D, D + %v] = [%v, %v]",
			valid.Sub(before), after.Sub(before), after.Sub(before)-delay, testD, testD+after.Sub(before)-delay)
	}
}

// An observer deletes a member Lease only once it has seen it unchanged
// for D on its own clock, and by a delete guarded by the version it saw:
// after that delete the holder's validity has ended and its renewal in
// flight fails as session lost; a renewal that commits first makes the
// delete fail, and the session lives on. A stalled feed (the observer sees
// nothing after its first stamp) costs no delete at all: the quorum read
// before it finds the renewal.
func TestObserverDeleteAndRenewalRace(t *testing.T) {
	c := needCluster(t)

	t.Run("delete first", func(t *testing.T) {
		t.Parallel() // each on a group of its own
		g, o, s, valid := watchedSession(t, c, nil)
		if ended, err := o.expire(t.Context(), s.identity); ended || err != nil {
			t.Fatalf("expire before D: ended %v, %v; want not ended", ended, err)
		}
		if _, err := g.leases.Get(t.Context(), s.name, metav1.GetOptions{}); err != nil {
			t.Fatalf("the member Lease after an early expire: %v", err)
		}
		st, _ := o.stampOf(s.identity)
		sleepUntil(st.due())
		ended, err := o.expire(t.Context(), s.identity)
		deleted := time.Now()
		if !ended || err != nil {
			t.Fatalf("expire at seen + D: ended %v, %v; want ended", ended, err)
		}
		if !deleted.After(valid) {
			t.Fatalf("the observer deleted the member Lease %v before the holder's validity ended", valid.Sub(deleted))
		}
		if _, err := s.renew(t.Context()); !errors.Is(err, errSessionLost) {
			t.Fatalf("renewal after the observer's delete: %v, want errSessionLost", err)
		}
		if err := s.end(t.Context()); !errors.Is(err, errSessionLost) {
			t.Fatalf("end after the session was lost: %v, want errSessionLost", err)
		}
	})

	t.Run("renewal first", func(t *testing.T) {
		t.Parallel() // each on a group of its own
		otp := &tap{}
		_, o, s, _ := watchedSession(t, c, otp)
		old, _ := o.stampOf(s.identity)
		sleepUntil(old.due())
		// The holder's renewal commits after the version the observer
		// saw, before its delete.
		if _, err := s.renew(t.Context()); err != nil {
			t.Fatal(err)
		}
		ended, err := o.deleteIfUnchanged(t.Context(), s.identity)
		if ended || err != nil {
			t.Fatalf("delete on the version before the renewal: ended %v, %v; want refused", ended, err)
		}
		if n := otp.deletes.Load(); n != 1 {
			t.Fatalf("the observer sent %d deletes, want the 1 refused", n)
		}
		if st, _ := o.stampOf(s.identity); st.rv == old.rv || !st.seen.After(old.seen) {
			t.Fatalf("after the refused delete the observer's stamp is %+v, want the renewed version stamped anew (was %+v)", st, old)
		}
		if ended, err := o.expire(t.Context(), s.identity); ended || err != nil {
			t.Fatalf("expire of the renewed version at once: ended %v, %v; want not ended", ended, err)
		}
		if _, err := s.renew(t.Context()); err != nil {
			t.Fatalf("renewal after the refused delete: %v", err)
		}
		if err := s.end(t.Context()); err != nil {
			t.Fatalf("end: %v", err)
		}
	})

	// Another deleted the Lease between the observer's read and its
	// guarded delete (an administrator, another replica's observer): the
	// delete answers 404, which proves nothing of the holder's last
	// renewal; the session counts as ended D after that answer.
	t.Run("deleted by another first", func(t *testing.T) {
		t.Parallel() // each on a group of its own
		_, o, s, _ := watchedSession(t, c, nil)
		st, _ := o.stampOf(s.identity)
		sleepUntil(st.due())
		if err := c.admin.CoordinationV1().Leases(replicaNamespace).Delete(t.Context(), s.name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		sent := time.Now() // the end counts from after the answer, so from after this
		if ended, err := o.deleteIfUnchanged(t.Context(), s.identity); ended || err != nil {
			t.Fatalf("a guarded delete answered 404: ended %v, %v; want not ended", ended, err)
		}
		for ; !o.ended(s.identity); time.Sleep(testD / 20) {
			if time.Since(sent) > 2*testD {
				t.Fatalf("the session is not ended 2D after the 404")
			}
		}
		if at := time.Since(sent); at < testD {
			t.Fatalf("the session is ended %v after the 404, before D = %v", at, testD)
		}
	})

	// Nobody but its session writes a member Lease; a write by anyone
	// else (here the administrator) in between is a sign the session is
	// not alone, and its next renewal, on its own last version, is
	// refused as session lost, not retried on the newer one.
	t.Run("written by another", func(t *testing.T) {
		t.Parallel() // each on a group of its own
		g := newTestGroup(t, c, 4, nil)
		s, _ := mustBegin(t, g, "r1")
		l, err := c.admin.CoordinationV1().Leases(replicaNamespace).Get(t.Context(), s.name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		l.Annotations = map[string]string{"written-by": "admin"}
		if _, err := c.admin.CoordinationV1().Leases(replicaNamespace).Update(t.Context(), l, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.renew(t.Context()); !errors.Is(err, errSessionLost) {
			t.Fatalf("renewal after another's write: %v, want errSessionLost", err)
		}
	})

	t.Run("stalled feed", func(t *testing.T) {
		t.Parallel() // each on a group of its own
		otp := &tap{}
		_, o, s, _ := watchedSession(t, c, otp) // and nothing more: the feed is stalled

		stop := renewing(s)
		deadline := time.Now().Add(3 * testD)
		for time.Now().Before(deadline) {
			if ended, err := o.expire(t.Context(), s.identity); ended || err != nil {
				t.Errorf("expire while the holder renews: ended %v, %v", ended, err)
				break
			}
			time.Sleep(testD / 8)
		}
		if _, err := stop(); err != nil {
			t.Fatalf("renewal: %v", err)
		}
		if n := otp.deletes.Load(); n != 0 {
			t.Fatalf("the observer sent %d deletes while the holder renewed, want none", n)
		}
		if err := s.end(t.Context()); err != nil {
			t.Fatalf("end: %v", err)
		}
	})
}

// A session of an ID that a live session holds is refused, however long
// the first one renews; once the first stops renewing, an observer
// proves it ended, and a new session of the ID begins, with another
// identity. One ended by its holder makes way at once.
func TestDuplicateSessionRefusedUntilProvenEnded(t *testing.T) {
	c := needCluster(t)
	g := newTestGroup(t, c, 4, nil)
	g2 := otherReplica(t, c, g, nil)
	o := newObserver(g2)
	first, _ := mustBegin(t, g, "dup")
	if first.identity == "dup" || !strings.HasPrefix(first.identity, "dup/") {
		t.Fatalf("identity %q, want dup/<incarnation>", first.identity)
	}

	stop := renewing(first)
	seeNow(t, o, first)
	for deadline := time.Now().Add(2 * testD); time.Now().Before(deadline); time.Sleep(testD / 8) {
		if _, _, err := g2.begin(t.Context(), "dup"); !errors.Is(err, ha.ErrDuplicateID) {
			t.Fatalf("begin while the first session renews: %v, want ha.ErrDuplicateID", err)
		}
		if ended, err := o.expire(t.Context(), first.identity); ended || err != nil {
			t.Fatalf("expire while the first session renews: ended %v, %v", ended, err)
		}
	}
	if _, err := stop(); err != nil {
		t.Fatalf("renewal: %v", err)
	}

	// The first session renews no more: an observer proves it ended.
	for deadline := time.Now().Add(3 * testD); ; time.Sleep(testD / 8) {
		ended, err := o.expire(t.Context(), first.identity)
		if err != nil {
			t.Fatal(err)
		}
		if ended {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the first session was not proven ended within %v of its last renewal", 3*testD)
		}
	}
	second, _ := mustBegin(t, g2, "dup")
	if second.identity == first.identity {
		t.Fatalf("the second session has the first's identity %q", first.identity)
	}
	if _, err := first.renew(t.Context()); !errors.Is(err, errSessionLost) {
		t.Fatalf("the first session's renewal: %v, want errSessionLost", err)
	}

	// Ended by its holder: a new session begins at once.
	if err := second.end(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := second.renew(t.Context()); !errors.Is(err, ha.ErrSessionEnded) {
		t.Fatalf("renewal after end: %v, want ha.ErrSessionEnded", err)
	}
	mustBegin(t, g, "dup")
}

// A group name with an infix of the Lease names ("-m-", "-b-"), or
// ending with one cut at its last dash, and a member ID with an infix,
// are refused, naming them, before any request: group "a-m"'s bucket 0
// and group "a"'s member "b-0" would both be the Lease "a-m-b-0".
func TestReservedInfixesAreRefused(t *testing.T) {
	for _, name := range []string{"a-m", "a-b", "a-m-c", "a-b-c"} {
		if _, err := newGroup(nil, nil, name, 4, testD); !errors.Is(err, errReservedInfix) || !strings.Contains(err.Error(), strconv.Quote(name)) {
			t.Errorf("newGroup(%q): %v, want errReservedInfix naming it", name, err)
		}
	}
	for _, ok := range []string{"a", "m-a", "b", "a-mb", "bm-a", "a-bb-c"} {
		if _, err := newGroup(nil, nil, ok, 4, testD); err != nil {
			t.Errorf("newGroup(%q): %v", ok, err)
		}
	}
	g, err := newGroup(nil, nil, "a", 4, testD)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"x-m-y", "x-b-0", "r-b-"} {
		if _, _, err := g.begin(t.Context(), id); !errors.Is(err, errReservedInfix) || !strings.Contains(err.Error(), strconv.Quote(id)) {
			t.Errorf("begin(%q): %v, want errReservedInfix naming it", id, err)
		}
	}
}
