// Several kube-apiservers on one etcd, as a production control plane runs
// them behind a load balancer: replicas spread over them, each through a
// proxy the test moves from one server to another (blackHole.move), a
// server killed under load and restarted on its port, a storm of moves;
// and never two runs of a name at once, no fence passing on a replica
// that kept its server, the names running on through it all.

package kube

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/bgctl/controller/ha/kube/internal/kubetest"
)

var multiStranded = flag.Bool("kube.multiserver.stranded", false, "TestReplicasOnSeveralAPIServers also kills a server and leaves its replica on it until it restarts, longer than D: its fence passes, its names move and come back; about 40 s more")

// controlPlane is the shared cluster's kube-apiserver and peers of it
// the test started on the same etcd (kubetest.APIServer.StartPeer): they
// accept the same tokens and serve the same certificate, so that a
// client may be moved from one to another. Used by the test's goroutine
// alone.
type controlPlane struct {
	t *testing.T
	// servers are the running servers, by index: 0 is the shared one,
	// which the test never stops; nil while killed.
	servers []*kubetest.APIServer
	// addrs are their host:ports, kept while they are killed: a restart
	// takes the same.
	addrs []string
}

// newControlPlane starts peers peers of c's kube-apiserver, at once, and
// stops them when the test ends.
func newControlPlane(t *testing.T, c *cluster, peers int) *controlPlane {
	t.Helper()
	start := time.Now()
	cp := &controlPlane{t: t, servers: make([]*kubetest.APIServer, 1+peers)}
	cp.servers[0] = c.servers.API
	errs := make([]error, 1+peers)
	var wg sync.WaitGroup
	for i := 1; i <= peers; i++ {
		dir := t.TempDir() // removed after the cleanup below, which stops the servers
		wg.Go(func() { cp.servers[i], errs[i] = c.servers.API.StartPeer(c.etcdURL, dir) })
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, s := range cp.servers[1:] {
			if s != nil {
				s.Proc.Stop()
			}
		}
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("peers of the shared kube-apiserver: %v", err)
	}
	for _, s := range cp.servers {
		cp.addrs = append(cp.addrs, strings.TrimPrefix(s.URL, "https://"))
	}
	t.Logf("%d more kube-apiservers on the shared etcd, ready in %v", peers, time.Since(start).Round(10*time.Millisecond))
	return cp
}

// kill kills server i (SIGKILL), as a machine that dies: its clients'
// connections end.
func (cp *controlPlane) kill(i int) *kubetest.APIServer {
	cp.t.Helper()
	if i == 0 {
		cp.t.Fatal("the test may not stop the shared kube-apiserver")
	}
	s := cp.servers[i]
	s.Proc.Stop()
	cp.servers[i] = nil
	return s
}

// restart starts killed, server i, again on its port, and returns how
// long it took to be ready.
func (cp *controlPlane) restart(i int, killed *kubetest.APIServer) time.Duration {
	cp.t.Helper()
	start := time.Now()
	s, err := killed.Restart()
	if err != nil {
		cp.t.Fatalf("restarting kube-apiserver %d: %v", i, err)
	}
	cp.servers[i] = s
	return time.Since(start)
}

// waitRenewed waits, within limit, until each of ids had a renewal sent
// and answered (2xx) after since, and returns how long after since the
// last of them was answered: after a move or a kill, it tells that each
// replica's session goes on through its new connection, and that a
// fence the event was to pass has passed by then.
func (l *renewalLog) waitRenewed(t *testing.T, what string, since time.Time, limit time.Duration, ids ...string) time.Duration {
	t.Helper()
	for {
		l.mu.Lock()
		var late time.Time
		all := true
		for _, id := range ids {
			var at time.Time
			for _, s := range l.sends[id] {
				if s.at.After(since) && s.status/100 == 2 {
					at = s.answered
					break
				}
			}
			all = all && !at.IsZero()
			if at.After(late) {
				late = at
			}
		}
		l.mu.Unlock()
		if all {
			return late.Sub(since)
		}
		if time.Since(since) > limit {
			t.Fatalf("%s: no renewal of each of %v sent and answered within %v", what, ids, limit)
		}
		time.Sleep(20 * time.Millisecond) // a real server's time: polled, loosely bounded
	}
}

// loadServers keeps every server of cp busy until the test ends, as
// other clients of a production control plane do: on each, a client of
// the administrator writes a Lease of its own and lists the namespace's
// Leases, over and over, going on through a server's death.
func loadServers(t *testing.T, c *cluster, cp *controlPlane) {
	t.Helper()
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { stop(); wg.Wait() })
	for i, addr := range cp.addrs {
		cs, err := c.clientAt("https://"+addr, c.api.adminToken)
		if err != nil {
			t.Fatal(err)
		}
		leases := cs.CoordinationV1().Leases(replicaNamespace)
		name := fmt.Sprintf("load-%s-%d", strings.ToLower(t.Name()[:8]), i)
		wg.Go(func() { // joined by the cleanup above
			defer leases.Delete(context.Background(), name, metav1.DeleteOptions{})
			holder := "load"
			for ctx.Err() == nil {
				l, err := leases.Get(ctx, name, metav1.GetOptions{})
				switch {
				case err != nil:
					_, err = leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder}}, metav1.CreateOptions{})
				default:
					now := metav1.NewMicroTime(time.Now())
					l.Spec.RenewTime = &now
					_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
				}
				if err == nil {
					_, err = leases.List(ctx, metav1.ListOptions{Limit: 50})
				}
				if err != nil {
					select { // a killed server: try again soon
					case <-ctx.Done():
					case <-time.After(100 * time.Millisecond):
					}
				}
			}
		})
	}
}

// Three replicas, each through a proxy of its own to one of three
// kube-apiservers on one etcd: one is moved to another server; a server
// dies under load, its replica stranded until the proxy moves it (a load
// balancer's health check), and comes back on its port; then a storm of
// moves. After each, every replica renews through its new connection, no
// fence passes, and every name runs on where it ran: none stops, none
// starts again, none runs twice at once. With -kube.multiserver.stranded,
// a server also dies with its replica left on it until it restarts: that
// replica's fence passes, the others' do not, its names move within D
// and a few seconds, and it gets a share back once its server is up.
func TestReplicasOnSeveralAPIServers(t *testing.T) {
	t.Parallel() // servers of its own beside the shared one
	c := needCluster(t)
	cp := newControlPlane(t, c, 2)
	loadServers(t, c, cp)
	g := newKubeReplicasOn(t, c, 60)
	g.ttl = 8 * time.Second // loose: CPU starved by a server's start must not pass a fence
	rn := &renewalLog{sends: map[string][]renewalSend{}}
	g.wrap = rn.transport
	ids := []string{"a", "b", "c"}
	g.holes = map[string]*blackHole{}
	on := map[string]int{} // the server each replica's proxy sends it to
	for i, id := range ids {
		g.holes[id] = newBlackHole(t, cp.addrs[i])
		on[id] = i
	}
	moveTo := func(id string, i int) {
		g.holes[id].move(cp.addrs[i])
		on[id] = i
	}
	for _, id := range ids {
		g.join(id)
	}
	took, _ := g.waitPlaced("three replicas placing", 30*time.Second, ids...)
	t.Logf("placed over three servers in %v", took.Round(time.Millisecond))
	placed := g.mark()

	// kept checks, after event what at at, that every replica renewed
	// since (by then, a fence the event passed has passed), that none of
	// ids' fences passed, and that every name runs where it ran.
	kept := func(what string, at time.Time, ids ...string) {
		t.Helper()
		back := rn.waitRenewed(t, what, at, 2*g.ttl, "a", "b", "c")
		for _, id := range ids {
			if n := g.fencesOf[id].Load(); n != 0 {
				t.Errorf("%s: %d fence passes on %s; want none", what, n, id)
			}
		}
		restarted, same := g.keptSince(placed)
		t.Logf("%s: every replica renewed within %v; %d runs started since the names were placed, every name where it ran: %v", what, back.Round(time.Millisecond), restarted, same)
		if restarted != 0 || !same {
			t.Errorf("%s: %d runs started, every name kept on its replica: %v; want the names to run on where they ran", what, restarted, same)
		}
	}

	// (a) A move: b's connections end, its new ones go to server 0.
	at := time.Now()
	moveTo("b", 0)
	kept("b moved from server 1 to 0", at, ids...)

	// (b) Server 2 dies under load; c, on it, is stranded until its proxy
	// moves it a second later (a load balancer's health check), then
	// the server comes back on its port.
	at = time.Now()
	killed := cp.kill(2)
	time.Sleep(time.Second) // the health check's interval: the fault's length
	moveTo("c", 1)
	kept("server 2 killed, c moved to server 1 after 1 s", at, ids...)
	t.Logf("server 2 restarted on its port in %v", cp.restart(2, killed).Round(10*time.Millisecond))

	// (c) A storm: every 200 ms a replica is moved to another server.
	at = time.Now()
	rng := rand.New(rand.NewPCG(uint64(at.UnixNano()), 0))
	for range 25 {
		id := ids[rng.IntN(len(ids))]
		moveTo(id, (on[id]+1+rng.IntN(2))%3)
		time.Sleep(200 * time.Millisecond) // the storm's pace
	}
	kept("a storm of 25 moves in 5 s", at, ids...)

	if !*multiStranded {
		return
	}
	// A server dies with its replica left on it until it is back, which
	// the test makes longer than D: b's names move first.
	strandedOn := on["b"]
	if strandedOn == 0 {
		moveTo("b", 1)
		strandedOn = 1
	}
	for _, id := range []string{"a", "c"} {
		if on[id] == strandedOn {
			moveTo(id, 0)
		}
	}
	rn.waitRenewed(t, "a and c off b's server", time.Now(), 2*g.ttl, "a", "c")
	at = time.Now()
	killed = cp.kill(strandedOn)
	g.waitPlaced("b stranded on a dead server", g.ttl+20*time.Second, "a", "c")
	t.Logf("b stranded on a dead server: its names run on a and c %v after the kill (D = %v)", time.Since(at).Round(time.Millisecond), g.ttl)
	if g.fencesOf["b"].Load() == 0 {
		t.Errorf("b's names ran elsewhere with no fence passing on b")
	}
	t.Logf("server %d restarted on its port in %v", strandedOn, cp.restart(strandedOn, killed).Round(10*time.Millisecond))
	restarted := time.Now()
	for g.runs.on("b") == 0 {
		if time.Since(restarted) > 60*time.Second {
			t.Fatalf("60 s after its server restarted b runs no name; want a share back")
		}
		time.Sleep(20 * time.Millisecond) // a real server's time: polled, loosely bounded
	}
	g.waitPlaced("b back", 30*time.Second, ids...)
	t.Logf("b's server ready again: b runs names again, every name placed, %v later (%v after the kill)", time.Since(restarted).Round(time.Millisecond), time.Since(at).Round(time.Millisecond))
	for _, id := range []string{"a", "c"} {
		if n := g.fencesOf[id].Load(); n != 0 {
			t.Errorf("%d fence passes on %s, whose server stayed up; want none", n, id)
		}
	}
}
