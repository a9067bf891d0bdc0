// A replica that runs as in a Pod: rest.InClusterConfig, unchanged, reads
// the environment and the ServiceAccount files a Pod has, in a process
// whose /var/run/secrets is a projected volume of the test's, and the
// kubelet's rotation of its token, the old one revoked at once.

package kube

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A replica process made with rest.InClusterConfig, beside one made with
// a static token, joins and runs a share of the names; its ServiceAccount
// token is rotated twice as the kubelet rotates it (a new directory, then
// ..data swapped), the old token revoked at once; it renews with each new
// token, its fence never passes, and no name stops or runs twice at once.
func TestReplicaInClusterConfigWithARotatingToken(t *testing.T) {
	t.Parallel() // a group of its own
	var names []string
	for i := range 20 {
		names = append(names, fmt.Sprintf("name-%03d", i))
	}
	p := newProcReplicas(t, names...)
	ca, err := os.ReadFile(p.c.api.caFile)
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir() // the Pod's /run
	vol := &projectedVolume{dir: filepath.Join(root, "secrets", "kubernetes.io", "serviceaccount")}
	if err := os.MkdirAll(vol.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	token, revoke := boundToken(t, p.c)
	files := map[string]string{"token": token, "ca.crt": string(ca), "namespace": replicaNamespace}
	if err := vol.write(files); err != nil {
		t.Fatal(err)
	}
	p.startInCluster("a", root)
	p.start("b", false, false)
	_, where := p.runs.waitPlaced(t, names, "the in-cluster replica and another placing", 60*time.Second, "a", "b")
	share := 0
	for _, id := range where {
		if id == "a" {
			share++
		}
	}
	if share == 0 {
		t.Fatalf("the in-cluster replica runs none of %d names (%v); want a share", len(names), where)
	}
	p.runs.mu.Lock()
	starts := p.runs.starts
	p.runs.mu.Unlock()

	for round := range 2 {
		next, revokeNext := boundToken(t, p.c)
		files["token"] = next
		if err := vol.write(files); err != nil {
			t.Fatal(err)
		}
		revoke()
		revoke = revokeNext
		waitRenewed(t, p.c, replicaNamespace, p.group, fmt.Sprintf("round %d, after the old token was revoked", round), "a")
	}

	if fences := p.drained("a fence"); len(fences) != 0 {
		t.Errorf("the in-cluster replica's fence passed: %s", strings.Join(fences, "; "))
	}
	now, all := p.runs.placement(names)
	p.runs.mu.Lock()
	restarted := p.runs.starts - starts
	p.runs.mu.Unlock()
	if restarted != 0 || !all {
		t.Errorf("through the rotations: %d runs started, every name on one replica: %v; want the names to run on where they ran", restarted, all)
	}
	for n, id := range where {
		if now[n] != id {
			t.Errorf("%s ran on %s, then on %s; want it kept", n, id, now[n])
		}
	}
}

// drained takes every report line already there, and returns those that
// start with prefix; a child's error line fails the test.
func (p *procReplicas) drained(prefix string) []string {
	p.t.Helper()
	var out []string
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				return out
			}
			p.seen = append(p.seen, l)
			if f := strings.Fields(l); len(f) > 1 && f[1] == "error" {
				p.t.Fatalf("child: %s", l)
			}
			if strings.HasPrefix(l, prefix) {
				out = append(out, l)
			}
		default:
			return out
		}
	}
}
