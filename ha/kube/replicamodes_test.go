// Leader mode, the replicas' status and their health on the Kubernetes
// store: the shared part's API answers on Kubernetes as on etcd.

package kube

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/bgctl/controller/ha"
)

// In Leader mode every name runs on the oldest live member, by the
// position its member Lease was created at; when it crashes the next
// oldest takes everything, and a replica that joins later moves nothing.
// GroupStatus reads every member's session from the observers' stamps,
// and the health handler answers 200 on a member.
func TestReplicasOnKubernetesLeader(t *testing.T) {
	t.Parallel() // each in a group of its own; their waits overlap
	g := newKubeReplicas(t, 20)
	g.mode = ha.Leader
	g.join("a")
	g.waitPlaced("a alone", 30*time.Second, "a")
	time.Sleep(100 * time.Millisecond) // a's member Lease is older than b's by a real server's time
	g.join("b")
	g.join("c")
	time.Sleep(2 * time.Second) // b and c settle: a join in Leader mode moves nothing
	g.waitPlaced("b and c joined", 10*time.Second, "a")

	st, err := g.rs["b"].GroupStatus(context.Background())
	if err != nil {
		t.Errorf("GroupStatus on b: %v", err)
	}
	if len(st.Members) != 3 {
		t.Errorf("b's GroupStatus shows %d members (%+v), want a, b and c", len(st.Members), st.Members)
	}
	for _, m := range st.Members {
		if m.Lease == "" || m.TTL == nil || time.Duration(*m.TTL) <= 0 || time.Duration(*m.TTL) > replicaTTL {
			t.Errorf("member %s in b's GroupStatus: lease %q, TTL %v; want a lease and a TTL within %v", m.ID, m.Lease, m.TTL, replicaTTL)
		}
	}
	rec := httptest.NewRecorder()
	ha.HealthHandler(g.rs["b"]).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
	if rec.Code != http.StatusOK {
		t.Errorf("b's health: %d %s, want 200", rec.Code, rec.Body)
	}

	g.cuts["a"].off.Store(true)
	crashed := time.Now()
	_ = g.rs["a"].Close()
	delete(g.rs, "a")
	g.waitPlaced("after the leader a crashed", replicaTTL+20*time.Second, "b")
	t.Logf("a, the leader, crashed: every name runs on b, the next oldest, %v later (D = %v)", time.Since(crashed), replicaTTL)
}
