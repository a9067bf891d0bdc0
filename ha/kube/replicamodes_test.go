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
// The replicas join against the order of their IDs (c, b, a), which
// break ties: a store whose positions failed to tell the members' ages
// apart would elect a. GroupStatus reads every member's session from
// the observers' stamps, and the health handler answers 200 on a member.
func TestReplicasOnKubernetesLeader(t *testing.T) {
	t.Parallel() // each in a group of its own; their waits overlap
	g := newKubeReplicas(t, 20)
	g.mode = ha.Leader
	g.join("c")
	g.waitPlaced("c alone", 30*time.Second, "c")
	time.Sleep(100 * time.Millisecond) // c's member Lease is older than b's by a real server's time
	g.join("b")
	time.Sleep(100 * time.Millisecond)
	g.join("a")
	g.runs.mu.Lock()
	starts := g.runs.starts
	g.runs.mu.Unlock()
	time.Sleep(2 * time.Second) // b and a settle: a join in Leader mode moves nothing
	g.waitPlaced("b and a joined", 10*time.Second, "c")
	g.runs.mu.Lock()
	if moved := g.runs.starts - starts; moved != 0 {
		t.Errorf("%d runs started after b and a joined; want none: a join moves nothing in Leader mode", moved)
	}
	g.runs.mu.Unlock()

	st, err := g.rs["b"].GroupStatus(context.Background())
	if err != nil {
		t.Errorf("GroupStatus on b: %v", err)
	}
	if len(st.Members) != 3 {
		t.Errorf("b's GroupStatus shows %d members (%+v), want c, b and a", len(st.Members), st.Members)
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

	g.cuts["c"].off.Store(true)
	crashed := time.Now()
	_ = g.rs["c"].Close()
	delete(g.rs, "c")
	g.waitPlaced("after the leader c crashed", replicaTTL+20*time.Second, "b")
	t.Logf("c, the leader, crashed: every name runs on b, the next oldest, %v later (D = %v)", time.Since(crashed), replicaTTL)
}
