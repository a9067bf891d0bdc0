// The store's own Prometheus metric: its requests the API server
// answered "retry later" (429 Too Many Requests, or a 5xx with
// Retry-After), counted by a layer over the replica's HTTP transport.

package kube

import (
	"net/http"

	"github.com/bgctl/controller"
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics holds the Prometheus metric of one or more replicas' stores
// and implements [prometheus.Collector]. Make it with the options of the
// core's [controller.Metrics] and ha's [ha.Metrics], and register the
// three in the same registry, so that they share a namespace and
// constant labels:
//
//	opts := controller.MetricsOpts{Namespace: "svc"}
//	cm, hm, km := controller.NewMetrics(opts), ha.NewMetrics(opts), kube.NewMetrics(opts)
//	registry.MustRegister(cm, hm, km)
//	st := kube.Store(cfg, namespace, kube.StoreOptions{Metrics: km})
//
// The metric, with an empty Namespace:
//
//	controllers_replica_kube_requests_throttled_total{request,answer}  counter  requests the API server answered "retry later"
//
// answer is 429 (Too Many Requests: API Priority and Fairness rejected
// the request, or the server's inflight limits were reached) or 5xx (a
// server error that carries Retry-After). request says what the request
// was for: renewal (every request of the session's own client, which
// has a rate limiter of its own: its renewals, its begin and its end),
// write (every other write: claims, releases, hand-overs, published
// name sets, the observers' deletes of ended sessions), read (a get or
// a list), watch (a watch of the group's Leases). Every combination is
// exported from the start, at 0.
//
// client-go waits out a Retry-After and sends the request again, up to
// ten times; every answer is counted, so one request may count several
// times. A renewal throttled past the fence's margin passes the fence
// (controllers_replica_fence_passes_total): renewals that count here
// call for deploy/flowcontrol.yaml, which gives the replicas' Lease
// requests a priority level of their own; the others only slow claims
// and reads.
type Metrics struct {
	throttled *prometheus.CounterVec
	// counters are throttled's children by request and answer:
	// immutable after NewMetrics.
	counters [requestPurposes][answers]prometheus.Counter
}

// requestPurpose is what a request of the store is for, the values of
// the request label: requestNames[p].
type requestPurpose int

const (
	requestRenewal requestPurpose = iota
	requestWrite
	requestRead
	requestWatch
	requestPurposes // how many
)

var requestNames = [requestPurposes]string{"renewal", "write", "read", "watch"}

// The answers counted, the values of the answer label: answerNames[a].
const (
	answer429 = iota
	answer5xx
	answers // how many
)

var answerNames = [answers]string{"429", "5xx"}

// DefaultMetrics is used by every [Store] made without
// StoreOptions.Metrics. Nothing is registered until the program
// registers it, as with [controller.DefaultMetrics]:
//
//	prometheus.MustRegister(controller.DefaultMetrics, ha.DefaultMetrics, kube.DefaultMetrics)
var DefaultMetrics = NewMetrics(controller.MetricsOpts{})

// NewMetrics returns a new, unregistered Metrics named with
// opts.Namespace and labelled with opts.ConstLabels, as the core's
// [controller.NewMetrics] names its own. opts.DurationBuckets and
// opts.DisableGroupMetrics do not apply here.
func NewMetrics(opts controller.MetricsOpts) *Metrics {
	m := &Metrics{throttled: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: opts.Namespace, ConstLabels: opts.ConstLabels,
		Name: "controllers_replica_kube_requests_throttled_total",
		Help: `Number of the Kubernetes store's requests the API server answered "retry later", by request (renewal: the session's own member Lease; write; read; watch) and answer (429 Too Many Requests, or a 5xx with Retry-After). Each send of a request client-go retried counts.`,
	}, []string{"request", "answer"})}
	for k := range requestPurposes {
		for a := range answers {
			m.counters[k][a] = m.throttled.WithLabelValues(requestNames[k], answerNames[a])
		}
	}
	return m
}

// Describe implements [prometheus.Collector].
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) { m.throttled.Describe(ch) }

// Collect implements [prometheus.Collector].
func (m *Metrics) Collect(ch chan<- prometheus.Metric) { m.throttled.Collect(ch) }

// client returns hc, or, if m is not nil, a client on hc's transport
// (the same connections) that counts in m every answer that asks to
// retry later, as a renewal's if renewals is true, else by its
// request's kind (throttledTransport).
func (m *Metrics) client(hc *http.Client, renewals bool) *http.Client {
	if m == nil {
		return hc
	}
	out := *hc
	// A config with neither TLS nor credentials (a kubectl proxy's
	// http://localhost:8001) gets http.DefaultClient, whose Transport is
	// nil: the default transport.
	rt := hc.Transport
	if rt == nil {
		rt = http.DefaultTransport
	}
	out.Transport = throttledTransport{rt: rt, m: m, renewals: renewals}
	return &out
}

// throttledTransport counts in m the answers of rt that ask to retry
// later (retryLater). Immutable.
type throttledTransport struct {
	rt       http.RoundTripper
	m        *Metrics
	renewals bool // every request is a renewal: the session's client
}

func (t throttledTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.rt.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	if a, ok := retryLater(resp); ok {
		k := requestRenewal
		if !t.renewals {
			k = kindOf(req)
		}
		t.m.counters[k][a].Inc()
	}
	return resp, err
}

// retryLater returns which of the counted answers resp is, and whether
// it is one: a 429, or a 5xx with Retry-After. client-go waits out and
// sends again those that carry Retry-After (in seconds); a 429 without
// it fails the request at once, and counts all the same.
func retryLater(resp *http.Response) (int, bool) {
	switch {
	case resp.StatusCode == http.StatusTooManyRequests:
		return answer429, true
	case resp.StatusCode >= 500 && resp.StatusCode < 600 && resp.Header.Get("Retry-After") != "":
		return answer5xx, true
	}
	return 0, false
}

// kindOf returns what req, a request of the store's Lease client (not
// the session's), is for: a watch, a read (get or list), or a write.
func kindOf(req *http.Request) requestPurpose {
	if req.Method != http.MethodGet {
		return requestWrite
	}
	if w := req.URL.Query().Get("watch"); w == "true" || w == "1" {
		return requestWatch
	}
	return requestRead
}
