// Throttling: deploy/flowcontrol.yaml applied as it is on a kube-apiserver
// with small inflight limits, flooded by another ServiceAccount's lists:
// the replicas' Lease requests are served at the manifest's priority
// level, and no fence passes; without it they share the flood's level,
// and nothing runs twice at once all the same.

package kube

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"maps"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"github.com/bgctl/controller"
	"github.com/bgctl/controller/ha/kube/internal/kubetest"
)

const flowControlManifest = "deploy/flowcontrol.yaml"

// applyFlowControl applies deploy/flowcontrol.yaml as the administrator,
// and returns the UID of its priority level.
func applyFlowControl(t *testing.T, c *cluster) string {
	t.Helper()
	b, err := os.ReadFile(flowControlManifest)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := kubetest.Decode(b)
	if err != nil {
		t.Fatalf("%s: %v", flowControlManifest, err)
	}
	var level string
	for _, obj := range objs {
		switch o := obj.(type) {
		case *flowcontrolv1.PriorityLevelConfiguration:
			err = kubetest.Apply(t.Context(), c.admin.FlowcontrolV1().PriorityLevelConfigurations(), o)
			level = o.Name
		case *flowcontrolv1.FlowSchema:
			err = kubetest.Apply(t.Context(), c.admin.FlowcontrolV1().FlowSchemas(), o)
		default:
			t.Fatalf("%s holds a %T", flowControlManifest, obj)
		}
		if err != nil {
			t.Fatalf("applying %s: %v", flowControlManifest, err)
		}
	}
	pl, err := c.admin.FlowcontrolV1().PriorityLevelConfigurations().Get(t.Context(), level, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return string(pl.UID)
}

// levelOf returns the UID of the priority level named name.
func levelOf(t *testing.T, c *cluster, name string) string {
	t.Helper()
	pl, err := c.admin.FlowcontrolV1().PriorityLevelConfigurations().Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return string(pl.UID)
}

// priorityHeader is where the API server says, in every answer, which
// priority level served the request.
const priorityHeader = "X-Kubernetes-PF-PriorityLevel-UID"

// served records, for a group's replicas, the priority levels their
// requests were served at, the answers 429 they got, and the longest a
// renewal (an update of a replica's own member Lease) took. Guarded by
// mu.
type served struct {
	mu       sync.Mutex
	levels   map[string]int // priority level UID → answers
	tooMany  int            // answers 429
	renewals int
	slowest  time.Duration // the longest renewal
}

// transport returns replica id's rt, recorded in s.
func (s *served) transport(id string, rt http.RoundTripper) http.RoundTripper {
	return servedTransport{rt: rt, id: id, s: s}
}

// servedTransport records replica id's answers in s. Immutable.
type servedTransport struct {
	rt http.RoundTripper
	id string
	s  *served
}

func (t servedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	sent := time.Now()
	resp, err := t.rt.RoundTrip(req)
	if err != nil || requestKind(req) == "other" {
		return resp, err
	}
	took := time.Since(sent)
	t.s.mu.Lock()
	defer t.s.mu.Unlock()
	t.s.levels[resp.Header.Get(priorityHeader)]++
	if resp.StatusCode == http.StatusTooManyRequests {
		t.s.tooMany++
	}
	if req.Method == http.MethodPut && strings.HasSuffix(req.URL.Path, memberInfix+t.id) {
		t.s.renewals++
		t.s.slowest = max(t.s.slowest, took)
	}
	return resp, err
}

// flood lists, as a ServiceAccount of its own, the n Leases of a
// namespace of its own, from workers goroutines at once with no client
// rate limit, until ctx ends; it returns the lists answered, and how
// many of them were 429 (Too Many Requests), and the priority levels it
// was served at.
type flood struct {
	cs      *kubernetes.Clientset // immutable after newFlood, as ns and workers
	ns      string
	workers int

	mu      sync.Mutex
	lists   int            // guarded by mu
	tooMany int            // guarded by mu
	levels  map[string]int // guarded by mu: priority level UID → answers
}

// newFlood makes the flooder's ServiceAccount, its namespace of n Leases
// and the Role that lets it list them, and its client.
func newFlood(t *testing.T, c *cluster, n, workers int) *flood {
	t.Helper()
	ctx := t.Context()
	ns := "flood-" + strings.ToLower(rand.Text()[:8])
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "flood", Namespace: ns}}
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "flood", Namespace: ns},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"list"}}}}
	binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "flood", Namespace: ns},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "flood"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "flood", Namespace: ns}}}
	for _, err := range []error{
		kubetest.Apply(ctx, c.admin.CoreV1().Namespaces(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}),
		kubetest.Apply(ctx, c.admin.CoreV1().ServiceAccounts(ns), sa),
		kubetest.Apply(ctx, c.admin.RbacV1().Roles(ns), role),
		kubetest.Apply(ctx, c.admin.RbacV1().RoleBindings(ns), binding),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	fillNamespace(t, c, ns, n)
	tr, err := c.admin.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "flood", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("TokenRequest: %v", err)
	}
	f := &flood{ns: ns, workers: workers, levels: map[string]int{}}
	cfg := &rest.Config{Host: c.api.url, BearerToken: tr.Status.Token, TLSClientConfig: rest.TLSClientConfig{CAFile: c.api.caFile}, QPS: -1}
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return floodTransport{rt: rt, f: f} }
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c.track(hc)
	if f.cs, err = kubernetes.NewForConfigAndClient(cfg, hc); err != nil {
		t.Fatal(err)
	}
	return f
}

// floodTransport counts the flood's answers. Immutable.
type floodTransport struct {
	rt http.RoundTripper
	f  *flood
}

func (t floodTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.rt.RoundTrip(req)
	if err == nil {
		t.f.mu.Lock()
		t.f.lists++
		t.f.levels[resp.Header.Get(priorityHeader)]++
		if resp.StatusCode == http.StatusTooManyRequests {
			t.f.tooMany++
		}
		t.f.mu.Unlock()
	}
	return resp, err
}

// run floods until ctx ends; its workers are joined before it returns.
// A worker sends its next list as soon as the last is answered, 429
// included: a client that ignores Retry-After.
func (f *flood) run(ctx context.Context) {
	var wg sync.WaitGroup
	for range f.workers {
		wg.Go(func() { // joined below
			for ctx.Err() == nil {
				_ = f.cs.CoordinationV1().RESTClient().Get().Namespace(f.ns).Resource("leases").MaxRetries(0).Do(ctx).Error()
			}
		})
	}
	wg.Wait()
}

// Three replicas on a kube-apiserver with six seats in all
// (--max-requests-inflight=4, --max-mutating-requests-inflight=2),
// flooded for 8 s by another ServiceAccount listing 500 Leases from 32
// goroutines at once. With deploy/flowcontrol.yaml applied, every
// request of the replicas is served at its priority level, not the
// flood's, and no fence passes and no name moves; without it, the
// replicas share workload-low with the flood, and whatever that costs,
// nothing runs twice at once and every name runs once the flood ends.
func TestReplicasUnderAFloodWithTheirFlowSchema(t *testing.T) {
	t.Parallel() // servers of its own
	for _, withSchema := range []bool{true, false} {
		t.Run("flowschema="+strconv.FormatBool(withSchema), func(t *testing.T) {
			t.Parallel() // servers of their own
			c := newCluster(t, "--max-requests-inflight=4", "--max-mutating-requests-inflight=2")
			want := levelOf(t, c, "workload-low")
			if withSchema {
				want = applyFlowControl(t, c)
			}
			f := newFlood(t, c, 500, 32)
			g := newKubeReplicasOn(t, c, 30)
			// A flood on this machine's two cores starves the server's CPU,
			// which no priority level can give back: renewals took up to 2 s.
			g.ttl = 10 * time.Second
			s := &served{levels: map[string]int{}}
			g.wrap = s.transport
			ids := []string{"a", "b", "c"}
			for _, id := range ids {
				g.join(id)
			}
			_, where := g.waitPlaced("three replicas placing", 30*time.Second, ids...)
			g.runs.mu.Lock()
			starts := g.runs.starts
			g.runs.mu.Unlock()

			ctx, stop := context.WithTimeout(t.Context(), 8*time.Second)
			f.run(ctx) // the flood's length
			stop()
			f.mu.Lock()
			t.Logf("the flood: %d lists answered, %d of them 429, by priority level %v", f.lists, f.tooMany, f.levels)
			f.mu.Unlock()
			s.mu.Lock()
			levels, tooMany, renewals, slowest := maps.Clone(s.levels), s.tooMany, s.renewals, s.slowest
			s.mu.Unlock()
			t.Logf("the replicas: answers by priority level %v (want %s), %d of them 429, %d renewals, the slowest %v, %d fence passes",
				levels, want, tooMany, renewals, slowest.Round(time.Millisecond), g.fences.Load())
			if len(levels) != 1 || levels[want] == 0 {
				t.Errorf("the replicas' requests were served at the priority levels %v; want all at %s", levels, want)
			}
			g.waitPlaced("after the flood", 30*time.Second, ids...)
			if !withSchema {
				return // what the flood cost is logged; no overlap is checked by the cleanup
			}
			if n := g.fences.Load(); n != 0 {
				t.Errorf("%d fence passes under the flood; want none", n)
			}
			now, _ := g.runs.placement(g.names)
			g.runs.mu.Lock()
			restarted := g.runs.starts - starts
			g.runs.mu.Unlock()
			if restarted != 0 || !maps.Equal(now, where) {
				t.Errorf("under the flood %d runs started, placement kept: %v; want every name to run on where it ran", restarted, maps.Equal(now, where))
			}
		})
	}
}

// renewalLog records, for a group's replicas, each renewal's send and
// answer times and, for one answered 429, the Retry-After it carried;
// and, over all their Lease requests, the answers that ask to retry
// later. Guarded by mu.
type renewalLog struct {
	mu    sync.Mutex
	sends map[string][]renewalSend // by replica, in the order sent
	// later counts the answers 429, and 5xx with Retry-After, to Lease
	// requests: "429|5xx get|list|watch|write" → answers (requestKind).
	later map[string]int
}

// renewalSend is one renewal request and its answer.
type renewalSend struct {
	session      string // the Lease's holderIdentity it wrote: "" if unread
	at, answered time.Time
	status       int           // 0 if the request failed
	retryAfter   time.Duration // of a 429
}

// throttled returns how many renewals were answered 429 and followed by
// another of the same replica.
func (l *renewalLog) throttled() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, sends := range l.sends {
		for _, s := range sends[:max(0, len(sends)-1)] {
			if s.status == http.StatusTooManyRequests {
				n++
			}
		}
	}
	return n
}

// transport returns replica id's rt, its renewals recorded in l.
func (l *renewalLog) transport(id string, rt http.RoundTripper) http.RoundTripper {
	return renewalTransport{rt: rt, id: id, l: l}
}

// renewalTransport records replica id's renewals in l. Immutable.
type renewalTransport struct {
	rt http.RoundTripper
	id string
	l  *renewalLog
}

func (t renewalTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	session := ""
	if req.Method == http.MethodPut && strings.HasSuffix(req.URL.Path, memberInfix+t.id) {
		session, req = sessionOf(req)
	}
	sent := time.Now()
	resp, err := t.rt.RoundTrip(req)
	if kind := requestKind(req); err == nil && kind != "other" {
		answer := ""
		switch {
		case resp.StatusCode == http.StatusTooManyRequests:
			answer = "429"
		case resp.StatusCode >= 500 && resp.Header.Get("Retry-After") != "":
			answer = "5xx"
		}
		if answer != "" {
			t.l.mu.Lock()
			t.l.later[answer+" "+kind]++
			t.l.mu.Unlock()
		}
	}
	if req.Method != http.MethodPut || !strings.HasSuffix(req.URL.Path, memberInfix+t.id) {
		return resp, err
	}
	s := renewalSend{session: session, at: sent, answered: time.Now()}
	if err == nil {
		s.status = resp.StatusCode
		if secs, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s.status == http.StatusTooManyRequests {
			s.retryAfter = time.Duration(secs) * time.Second
		}
	}
	t.l.mu.Lock()
	t.l.sends[t.id] = append(t.l.sends[t.id], s)
	t.l.mu.Unlock()
	return resp, err
}

// sessionOf returns the session a member Lease's update writes for (its
// holderIdentity), read from the request's body (protobuf or JSON), and the request
// to send in req's place, with a body of its own; "" if the session
// cannot be read.
func sessionOf(req *http.Request) (string, *http.Request) {
	if req.Body == nil {
		return "", req
	}
	b, err := io.ReadAll(req.Body)
	req.Body.Close()
	out := req.Clone(req.Context())
	out.Body = io.NopCloser(bytes.NewReader(b))
	if err != nil {
		return "", out
	}
	obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(b, nil, nil)
	l, ok := obj.(*coordinationv1.Lease)
	if err != nil || !ok {
		return "", out
	}
	return holder(l), out
}

// rejectingLevel routes the Lease requests of the replicas' ServiceAccount
// and of f's into a priority level of the test's that has one share of
// the server's concurrency and rejects (429) what it cannot serve at once,
// instead of queuing it: under the flood, the replicas' renewals are
// answered 429 with Retry-After. It returns a function that removes both.
func rejectingLevel(t *testing.T, c *cluster, f *flood) (remove func()) {
	t.Helper()
	name := "test-reject-" + strings.ToLower(rand.Text()[:8])
	pl := &flowcontrolv1.PriorityLevelConfiguration{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: flowcontrolv1.PriorityLevelConfigurationSpec{Type: flowcontrolv1.PriorityLevelEnablementLimited,
			Limited: &flowcontrolv1.LimitedPriorityLevelConfiguration{NominalConcurrencyShares: new(int32(1)), LendablePercent: new(int32(0)),
				LimitResponse: flowcontrolv1.LimitResponse{Type: flowcontrolv1.LimitResponseTypeReject}}}}
	fs := &flowcontrolv1.FlowSchema{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: flowcontrolv1.FlowSchemaSpec{PriorityLevelConfiguration: flowcontrolv1.PriorityLevelConfigurationReference{Name: name},
			MatchingPrecedence:  400,
			DistinguisherMethod: &flowcontrolv1.FlowDistinguisherMethod{Type: flowcontrolv1.FlowDistinguisherMethodByUserType},
			Rules: []flowcontrolv1.PolicyRulesWithSubjects{{
				Subjects: []flowcontrolv1.Subject{
					{Kind: flowcontrolv1.SubjectKindServiceAccount, ServiceAccount: &flowcontrolv1.ServiceAccountSubject{Name: "my-service", Namespace: replicaNamespace}},
					{Kind: flowcontrolv1.SubjectKindServiceAccount, ServiceAccount: &flowcontrolv1.ServiceAccountSubject{Name: "flood", Namespace: f.ns}},
				},
				ResourceRules: []flowcontrolv1.ResourcePolicyRule{{Verbs: []string{"*"}, APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Namespaces: []string{"*"}}},
			}}}}
	if err := kubetest.Apply(t.Context(), c.admin.FlowcontrolV1().PriorityLevelConfigurations(), pl); err != nil {
		t.Fatal(err)
	}
	if err := kubetest.Apply(t.Context(), c.admin.FlowcontrolV1().FlowSchemas(), fs); err != nil {
		t.Fatal(err)
	}
	return func() {
		t.Helper()
		if err := c.admin.FlowcontrolV1().FlowSchemas().Delete(t.Context(), name, metav1.DeleteOptions{}); err != nil {
			t.Error(err)
		}
		if err := c.admin.FlowcontrolV1().PriorityLevelConfigurations().Delete(t.Context(), name, metav1.DeleteOptions{}); err != nil {
			t.Error(err)
		}
	}
}

// Three replicas whose Lease requests share, with a flood, a priority
// level that rejects what it cannot serve: their renewals are answered
// 429 with Retry-After, and each replica sends its next renewal no
// sooner than the Retry-After said (client-go waits it out within the
// renewal, bounded by the fence), or than a quarter of its renewal
// period (ha hedges a renewal that has no answer yet so often, up to
// four in flight): never in a tight loop. (A session that ends meanwhile, its fence passed, is
// followed by a new one, whose first writes come at once: they are not
// the throttled renewal sent again.) Whatever the throttling costs
// (fence passes, names moving), nothing runs twice at once, and once the
// flood ends every name runs again. The stores' metric counts every answer that asked to retry
// later that the replicas' own transports saw, the renewals' among the
// renewals.
func TestReplicasHonourRetryAfter(t *testing.T) {
	t.Parallel() // servers of its own
	c := newCluster(t)
	f := newFlood(t, c, 500, 32)
	g := newKubeReplicasOn(t, c, 30)
	g.ttl = 4 * time.Second // a renewal every 0.75 s: many tries at a level the flood keeps busy
	l := &renewalLog{sends: map[string][]renewalSend{}, later: map[string]int{}}
	g.wrap = l.transport
	reg := prometheus.NewPedanticRegistry()
	g.metrics = NewMetrics(controller.MetricsOpts{})
	reg.MustRegister(g.metrics)
	ids := []string{"a", "b", "c"}
	for _, id := range ids {
		g.join(id)
	}
	g.waitPlaced("three replicas placing", 30*time.Second, ids...)

	// The flood goes on until three renewals have been answered 429 and
	// followed by another, 30 s at most.
	remove := rejectingLevel(t, c, f)
	ctx, stop := context.WithCancel(t.Context())
	flooded := make(chan struct{})
	go func() { f.run(ctx); close(flooded) }() // joined below
	for deadline := time.Now().Add(30 * time.Second); l.throttled() < 3 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond) // a real server's time: polled, loosely bounded
	}
	stop()
	<-flooded
	remove()
	f.mu.Lock()
	t.Logf("the flood: %d lists answered, %d of them 429, by priority level %v", f.lists, f.tooMany, f.levels)
	f.mu.Unlock()
	g.waitPlaced("after the flood", g.ttl+30*time.Second, ids...)
	for _, r := range g.rs {
		_ = r.Close() // no request from here on: the metric and the transports' counts stand still
	}
	checkThrottledMetric(t, reg, l)

	every := (g.ttl - g.ttl/4) / 4 // (D − Margin)/4, Margin its default D/4
	throttled := 0
	var waits []time.Duration // the Retry-Afters
	l.mu.Lock()
	defer l.mu.Unlock()
	for id, sends := range l.sends {
		for i, s := range sends[:len(sends)-1] {
			if s.session == "" {
				t.Errorf("replica %s: a renewal's session could not be read from its body", id)
			}
			if s.status != http.StatusTooManyRequests {
				continue
			}
			throttled++
			waits = append(waits, s.retryAfter)
			if next := sends[i+1].session; next != s.session {
				t.Logf("replica %s: a renewal of session %s answered 429 was followed by session %s's write", id, s.session, next)
				continue
			}
			// The next send of the session is client-go's retry of this
			// request, after the Retry-After, or another renewal ha sent
			// because this one had no answer yet: ha hedges an unanswered
			// renewal every quarter of its renewal period, up to four in
			// flight. Either way none comes sooner than that quarter: no
			// tight loop.
			gap, want := sends[i+1].at.Sub(s.answered), min(s.retryAfter, every/4)
			if gap < want-50*time.Millisecond {
				t.Errorf("replica %s: a renewal answered 429 with Retry-After %v was followed by another %v later; want no sooner than %v", id, s.retryAfter, gap.Round(time.Millisecond), want)
			}
		}
	}
	t.Logf("%d renewals answered 429, with Retry-After %v; %d fence passes", throttled, waits, g.fences.Load())
	if throttled == 0 {
		t.Errorf("no renewal was answered 429 in 30 s of the flood; the test shows nothing")
	}
}

// checkThrottledMetric checks the throttled requests' metric the
// replicas' stores counted into reg against what their transports, l,
// saw: as many answers 429, and 5xx with Retry-After, in all; every
// watch so answered counted as a watch; and at least every renewal
// answered 429 as a renewal (the session's other requests count there
// too).
func checkThrottledMetric(t *testing.T, reg prometheus.Gatherer, l *renewalLog) {
	t.Helper()
	got := throttledCounts(t, reg)
	l.mu.Lock()
	defer l.mu.Unlock()
	renewals := 0
	for _, sends := range l.sends {
		for _, s := range sends {
			if s.status == http.StatusTooManyRequests {
				renewals++
			}
		}
	}
	t.Logf("throttled requests: the metric %v; the transports %v, %d of them renewals", got, l.later, renewals)
	for _, answer := range []string{"429", "5xx"} {
		sum, seen := 0, 0
		for _, request := range []string{"renewal", "write", "read", "watch"} {
			sum += got[request+" "+answer]
		}
		for _, kind := range []string{"get", "list", "watch", "write"} {
			seen += l.later[answer+" "+kind]
		}
		if sum != seen {
			t.Errorf("the metric counts %d answers %s; the replicas' transports saw %d", sum, answer, seen)
		}
		if n, want := got["watch "+answer], l.later[answer+" watch"]; n != want {
			t.Errorf("the metric counts %d watches answered %s; the transports saw %d", n, answer, want)
		}
	}
	if n := got["renewal 429"]; n < renewals {
		t.Errorf("the metric counts %d renewals answered 429; the transports saw %d", n, renewals)
	}
}
