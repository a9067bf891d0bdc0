// Tests of the store's metric: its name beside the core's, lint, and
// which answers and requests it counts as what. What it counts on a
// throttled API server is checked by TestReplicasHonourRetryAfter.

package kube

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/bgctl/controller"
)

// throttledCounts returns the values of the throttled requests' counter
// reg has, by "request answer".
func throttledCounts(t *testing.T, reg prometheus.Gatherer) map[string]int {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			out[labels["request"]+" "+labels["answer"]] = int(m.GetCounter().GetValue())
		}
	}
	return out
}

// The metric takes the core's namespace and constant labels, exports
// every request and answer from the start at 0, and passes the linter.
func TestMetricsNamesAndLint(t *testing.T) {
	opts := controller.MetricsOpts{Namespace: "svc", ConstLabels: prometheus.Labels{"cluster": "c1"}}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(controller.NewMetrics(opts), NewMetrics(opts))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	const name = "svc_controllers_replica_kube_requests_throttled_total"
	found := false
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		found = true
		if n := len(mf.GetMetric()); n != 8 {
			t.Errorf("%s has %d series; want 8 (4 requests × 2 answers)", name, n)
		}
		for _, m := range mf.GetMetric() {
			if m.GetCounter().GetValue() != 0 {
				t.Errorf("%s %v = %v at the start; want 0", name, m.GetLabel(), m.GetCounter().GetValue())
			}
		}
	}
	if !found {
		t.Fatalf("no %s in the registry", name)
	}
	counts := throttledCounts(t, reg)
	for _, request := range requestNames {
		for _, answer := range answerNames {
			if v, ok := counts[request+" "+answer]; !ok || v != 0 {
				t.Errorf("request=%s answer=%s: %d, exported %v; want 0, exported", request, answer, v, ok)
			}
		}
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

// The answers counted are a 429, with or without Retry-After, and a 5xx
// with it (client-go waits out and sends again those with Retry-After:
// TestThrottled429WithoutRetryAfterIsNotRetried).
func TestRetryLater(t *testing.T) {
	for _, tc := range []struct {
		status     int
		retryAfter string
		want       string // "" if not counted
	}{
		{http.StatusOK, "", ""},
		{http.StatusConflict, "", ""},
		{http.StatusTooManyRequests, "1", "429"},
		{http.StatusTooManyRequests, "", "429"},
		{http.StatusServiceUnavailable, "3", "5xx"},
		{http.StatusInternalServerError, "1", "5xx"},
		{http.StatusServiceUnavailable, "", ""},
		{http.StatusGatewayTimeout, "", ""},
	} {
		resp := &http.Response{StatusCode: tc.status, Header: http.Header{}}
		if tc.retryAfter != "" {
			resp.Header.Set("Retry-After", tc.retryAfter)
		}
		a, ok := retryLater(resp)
		got := ""
		if ok {
			got = answerNames[a]
		}
		if got != tc.want {
			t.Errorf("%d, Retry-After %q: counted as %q; want %q", tc.status, tc.retryAfter, got, tc.want)
		}
	}
}

// A request of the Lease client is a watch, a read or a write by its
// method and its watch parameter.
func TestKindOf(t *testing.T) {
	const leases = "https://127.0.0.1:6443/apis/coordination.k8s.io/v1/namespaces/ns/leases"
	for req, want := range map[string]string{
		"GET ?labelSelector=g&watch=true": "watch",
		"GET ?watch=1":                    "watch",
		"GET ?labelSelector=g":            "read",
		"GET /g-b-3":                      "read",
		"GET ?watch=false":                "read",
		"PUT /g-b-3":                      "write",
		"POST ":                           "write",
		"DELETE /g-m-a":                   "write",
	} {
		method, rest, _ := strings.Cut(req, " ")
		u, err := url.Parse(leases + rest)
		if err != nil {
			t.Fatal(err)
		}
		if got := requestNames[kindOf(&http.Request{Method: method, URL: u})]; got != want {
			t.Errorf("%s %s: %s; want %s", method, u, got, want)
		}
	}
}
