// Review tests of the throttled-requests layer (metrics.go, clients.go)
// against an httptest server that answers "retry later": what client-go's
// retries count, how each request is labelled, that the layer leaves
// bodies whole and a user's WrapTransport in place.

package kube

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/bgctl/controller"
	"github.com/bgctl/controller/ha"
)

// throttlingServer answers every request with status and Retry-After: 0
// for the first refusals sends, then a Lease l (or, for a watch, an
// empty stream that ends). It records each body sent.
type throttlingServer struct {
	status   int
	refusals int64
	// noRetryAfter: refuse without Retry-After
	noRetryAfter bool
	sends        atomic.Int64
	mu           sync.Mutex
	bodies       []string // guarded by mu
}

func (s *throttlingServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	s.bodies = append(s.bodies, string(b))
	s.mu.Unlock()
	if s.sends.Add(1) <= s.refusals {
		if !s.noRetryAfter {
			w.Header().Set("Retry-After", "0")
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(s.status)
		_ = json.NewEncoder(w).Encode(metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure, Code: int32(s.status), Reason: metav1.StatusReasonTooManyRequests})
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if r.URL.Query().Get("watch") == "true" {
		return // an empty watch that ends at once
	}
	_ = json.NewEncoder(w).Encode(&coordinationv1.Lease{TypeMeta: metav1.TypeMeta{Kind: "Lease", APIVersion: "coordination.k8s.io/v1"}, ObjectMeta: metav1.ObjectMeta{Name: "g-b-0", ResourceVersion: "7"}})
}

// throttledClients returns the two Lease clients of leaseClients on a
// server that refuses the first refusals sends with status, counting in
// a fresh Metrics, and the number of sends a WrapTransport saw.
func throttledClients(t *testing.T, status int, refusals int64) (*throttlingServer, *Metrics, *atomic.Int64, leasePair) {
	t.Helper()
	srv := &throttlingServer{status: status, refusals: refusals}
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	wrapped := &atomic.Int64{}
	cfg := &rest.Config{Host: hs.URL, QPS: -1, WrapTransport: func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) { wrapped.Add(1); return rt.RoundTrip(r) })
	}}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	m := NewMetrics(controller.MetricsOpts{})
	leases, renewals, err := leaseClients(cfg, hc, "ns", m)
	if err != nil {
		t.Fatal(err)
	}
	return srv, m, wrapped, leasePair{leases, renewals}
}

type leasePair struct {
	leases, renewals coordinationv1client.LeaseInterface
}

// Every send client-go retries passes through the layer once: a request
// refused twice then served counts 2, no more, under its own label, and
// the user's WrapTransport sees every send too. The layer leaves the
// served answer's body whole (the Lease decodes) and the request's body
// too (each retried PUT arrives whole).
func TestThrottledCountsEachSendOnce(t *testing.T) {
	ctx := context.Background()
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "g-b-0", ResourceVersion: "6"}}
	for _, tc := range []struct {
		request string
		status  int
		do      func(p leasePair) error
	}{
		{"read", http.StatusTooManyRequests, func(p leasePair) error { _, err := p.leases.Get(ctx, "g-b-0", metav1.GetOptions{}); return err }},
		{"read", http.StatusServiceUnavailable, func(p leasePair) error { _, err := p.leases.List(ctx, metav1.ListOptions{}); return err }},
		{"watch", http.StatusTooManyRequests, func(p leasePair) error {
			w, err := p.leases.Watch(ctx, metav1.ListOptions{ResourceVersion: "5"})
			if err == nil {
				for range w.ResultChan() {
				}
			}
			return err
		}},
		{"write", http.StatusTooManyRequests, func(p leasePair) error { _, err := p.leases.Update(ctx, l, metav1.UpdateOptions{}); return err }},
		{"renewal", http.StatusTooManyRequests, func(p leasePair) error { _, err := p.renewals.Update(ctx, l, metav1.UpdateOptions{}); return err }},
		{"renewal", http.StatusTooManyRequests, func(p leasePair) error { _, err := p.renewals.Get(ctx, "g-m-a", metav1.GetOptions{}); return err }},
	} {
		srv, m, wrapped, p := throttledClients(t, tc.status, 2)
		if err := tc.do(p); err != nil {
			t.Fatalf("%s answered %d twice: %v; want served on the third send", tc.request, tc.status, err)
		}
		answer := "429"
		if tc.status != http.StatusTooManyRequests {
			answer = "5xx"
		}
		counts := throttledCounts(t, gatherer(t, m))
		for k, v := range counts {
			want := 0
			if k == tc.request+" "+answer {
				want = 2
			}
			if v != want {
				t.Errorf("%s refused twice with %d: %q = %d; want %d (all: %v)", tc.request, tc.status, k, v, want, counts)
			}
		}
		if n, w := srv.sends.Load(), wrapped.Load(); n != 3 || w != 3 {
			t.Errorf("%s: the server had %d sends, WrapTransport %d; want 3 and 3", tc.request, n, w)
		}
		srv.mu.Lock()
		for i, b := range srv.bodies {
			if b != srv.bodies[0] {
				t.Errorf("%s: send %d had body %q; the first %q", tc.request, i, b, srv.bodies[0])
			}
		}
		srv.mu.Unlock()
	}
}

// client-go waits out and sends again a 429 only if it carries
// Retry-After, as a 5xx: a 429 without it fails the request on the first
// send, which counts once all the same.
func TestThrottled429WithoutRetryAfterIsNotRetried(t *testing.T) {
	srv, m, _, p := throttledClients(t, http.StatusTooManyRequests, 1<<30)
	srv.noRetryAfter = true
	if _, err := p.leases.Get(context.Background(), "g-b-0", metav1.GetOptions{}); err == nil {
		t.Fatal("a Get refused with 429 succeeded")
	}
	if got, n := throttledCounts(t, gatherer(t, m))["read 429"], srv.sends.Load(); got != 1 || n != 1 {
		t.Errorf("read 429 = %d over %d sends; want 1 over 1", got, n)
	}
}

// One request refused on every send counts as many times as client-go
// sends it: 11 (the first and ten retries), as the docs say.
func TestThrottledTenRetriesCountEleven(t *testing.T) {
	srv, m, _, p := throttledClients(t, http.StatusTooManyRequests, 1<<30)
	if _, err := p.leases.Get(context.Background(), "g-b-0", metav1.GetOptions{}); err == nil {
		t.Fatal("a Get refused on every send succeeded")
	}
	if got, n := throttledCounts(t, gatherer(t, m))["read 429"], srv.sends.Load(); got != 11 || n != 11 {
		t.Errorf("read 429 = %d over %d sends; want 11 over 11", got, n)
	}
}

// gatherer returns a registry that holds m alone.
func gatherer(t *testing.T, m *Metrics) prometheus.Gatherer {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	return reg
}

// The store's one request outside its two Lease clients, the GET of
// /version that CheckServers makes, is a request of the store like any
// other: refused twice with 429, it counts twice (as a read).
func TestThrottledCountsTheVersionRequest(t *testing.T) {
	var sends atomic.Int64
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/version" && sends.Add(1) <= 2 {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]string{"major": "1", "minor": "36", "gitVersion": "v1.36.0"})
	}))
	defer hs.Close()
	m := NewMetrics(controller.MetricsOpts{})
	b, err := Store(&rest.Config{Host: hs.URL, QPS: -1}, "ns", StoreOptions{Metrics: m}).Backend(ha.BackendConfig{Group: "g", ID: "a", TTL: 4 * time.Second, RequestTimeout: 5 * time.Second, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.(*kubeBackend).server(context.Background()); err != nil {
		t.Fatalf("/version refused twice: %v; want served on the third send", err)
	}
	if n := sends.Load(); n != 3 {
		t.Fatalf("/version sent %d times; want 3", n)
	}
	counts := throttledCounts(t, gatherer(t, m))
	total := 0
	for _, v := range counts {
		total += v
	}
	if total != 2 {
		t.Errorf("/version refused twice with 429: %d counted (%v); want 2", total, counts)
	}
}

// DESIGN.md ("Several API servers") counts on a server whose watch cache
// is behind the version a watch asks for to hold that watch until it
// catches up, not to refuse it: a watch from far ahead of this server's
// cache opens, delivers nothing, and counts nothing. (A GET or LIST naming
// such a version is answered 504 with Retry-After, which would count as
// 5xx; the store names none.)
func TestThrottledNotAWatchAhead(t *testing.T) {
	cfg := replicaConfig(testCluster, nil)
	cfg.BearerToken = testCluster.api.adminToken
	m := NewMetrics(controller.MetricsOpts{})
	leases, _, err := leaseClients(cfg, replicaHTTP(t, testCluster, cfg), replicaNamespace, m)
	if err != nil {
		t.Fatal(err)
	}
	selector := groupLabel + "=review-watch-ahead"
	l, err := leases.List(t.Context(), metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		t.Fatal(err)
	}
	rv, err := strconv.ParseInt(l.ResourceVersion, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Second)
	defer cancel()
	w, err := leases.Watch(ctx, metav1.ListOptions{LabelSelector: selector, ResourceVersion: strconv.FormatInt(rv+100000, 10)})
	if err != nil {
		t.Fatalf("a watch from %d, ahead of the cache's %d: %v; want held open", rv+100000, rv, err)
	}
	for ev := range w.ResultChan() {
		t.Errorf("a watch from ahead of the cache delivered %s %v; want nothing until it catches up", ev.Type, ev.Object)
	}
	for k, v := range throttledCounts(t, gatherer(t, m)) {
		if v != 0 {
			t.Errorf("%q = %d after a watch from ahead; want 0", k, v)
		}
	}
}
