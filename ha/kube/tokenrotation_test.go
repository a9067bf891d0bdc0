// Credentials that rotate: replicas whose rest.Config names a token file,
// as rest.InClusterConfig's does, laid out as the kubelet lays out a
// projected ServiceAccount token, with real ServiceAccount tokens from
// the TokenRequest API; the file is rewritten with a new token and the
// old one revoked at once, and the replicas work on.

package kube

import (
	"crypto/rand"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/bgctl/controller/ha/kube/internal/kubetest"
)

// boundToken returns a token of the replicas' ServiceAccount from the
// TokenRequest API (as the kubelet gets a Pod's), bound to a Secret made
// for it, so that deleting the Secret revokes that token alone; and a
// revoke function that deletes the Secret and returns once the server
// refuses the token (401).
func boundToken(t testing.TB, c *cluster) (token string, revoke func()) {
	t.Helper()
	ctx := t.Context()
	secrets := c.admin.CoreV1().Secrets(replicaNamespace)
	s, err := secrets.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "token-binding-" + strings.ToLower(rand.Text()[:10])}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := c.admin.CoreV1().ServiceAccounts(replicaNamespace).CreateToken(ctx, "my-service", &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: new(int64(600)), // the least the API allows
		BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Secret", APIVersion: "v1", Name: s.Name, UID: s.UID},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("TokenRequest: %v", err)
	}
	token = tr.Status.Token
	cs, err := c.client(token)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := kubetest.Allowed(ctx, cs, "update", "coordination.k8s.io", "leases", replicaNamespace); err != nil || !ok {
		t.Fatalf("the new token may update Leases: %v, %v; want true", ok, err)
	}
	return token, func() {
		t.Helper()
		if err := secrets.Delete(ctx, s.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) { // the server's authenticator learns of the deletion by a watch
			_, err := kubetest.Allowed(ctx, cs, "update", "coordination.k8s.io", "leases", replicaNamespace)
			if apierrors.IsUnauthorized(err) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("10 s after its Secret's deletion, a request with the revoked token got %v; want 401", err)
			}
		}
	}
}

// projectedVolume is a directory laid out as the kubelet lays out a
// projected ServiceAccount volume: each file a symlink into ..data, a
// symlink to a directory of this version's files, which a rotation
// replaces whole by renaming a new symlink over ..data. Not safe for
// concurrent writes.
type projectedVolume struct {
	dir     string
	version int
}

// write makes files (name → content) the volume's current version.
func (v *projectedVolume) write(files map[string]string) error {
	v.version++
	data := fmt.Sprintf("..%d_%d", time.Now().UnixNano(), v.version)
	if err := os.Mkdir(filepath.Join(v.dir, data), 0o755); err != nil {
		return err
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(v.dir, data, name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	old, _ := os.Readlink(filepath.Join(v.dir, "..data"))
	if err := os.Symlink(data, filepath.Join(v.dir, "..data_tmp")); err != nil {
		return err
	}
	if err := os.Rename(filepath.Join(v.dir, "..data_tmp"), filepath.Join(v.dir, "..data")); err != nil {
		return err
	}
	for name := range files {
		link := filepath.Join(v.dir, name)
		if _, err := os.Lstat(link); os.IsNotExist(err) {
			if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
				return err
			}
		}
	}
	if old != "" {
		return os.RemoveAll(filepath.Join(v.dir, old))
	}
	return nil
}

// statuses counts, by replica, the answers 401 its requests got. Guarded
// by mu.
type statuses struct {
	mu           sync.Mutex
	unauthorized map[string]int
}

// transport returns replica id's rt, counted in s.
func (s *statuses) transport(id string, rt http.RoundTripper) http.RoundTripper {
	return statusTransport{rt: rt, id: id, s: s}
}

// statusTransport counts the 401 answers of replica id in s. Immutable.
type statusTransport struct {
	rt http.RoundTripper
	id string
	s  *statuses
}

func (t statusTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.rt.RoundTrip(req)
	if err == nil && resp.StatusCode == http.StatusUnauthorized {
		t.s.mu.Lock()
		t.s.unauthorized[t.id]++
		t.s.mu.Unlock()
	}
	return resp, err
}

// waitRenewed waits, within 10 s, until the member Lease of each of ids
// in group of namespace has a resourceVersion other than the one it had
// when called: each session renewed since.
func waitRenewed(t testing.TB, c *cluster, namespace, group, what string, ids ...string) {
	t.Helper()
	leases := c.admin.CoordinationV1().Leases(namespace)
	was := map[string]string{}
	for _, id := range ids {
		l, err := leases.Get(t.Context(), group+memberInfix+id, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		was[id] = l.ResourceVersion
	}
	for deadline := time.Now().Add(10 * time.Second); len(was) > 0; time.Sleep(20 * time.Millisecond) { // a real server's time: polled, loosely bounded
		for id, rv := range was {
			l, err := leases.Get(t.Context(), group+memberInfix+id, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				t.Fatalf("%s: the member Lease of %s is gone: its session ended", what, id)
			}
			if err != nil {
				t.Fatal(err)
			}
			if l.ResourceVersion != rv {
				delete(was, id)
			}
		}
		if len(was) > 0 && time.Now().After(deadline) {
			t.Fatalf("%s: 10 s on, the member Leases of %v were not renewed", what, slices.Sorted(maps.Keys(was)))
		}
	}
}

// Three replicas whose rest.Config holds a token and names the file it
// came from, as rest.InClusterConfig makes it, each file a projected
// volume of its own: three times, each file is rewritten with a new
// token (twice as the kubelet does, then in place) and the old one is
// revoked at once, before client-go's own minute-long cache of the file
// would have read it again. No request of theirs is
// refused, each renews its session with the new token, no fence passes,
// and every name runs on where it ran.
func TestReplicasKeepWorkingWhenTheirTokenRotates(t *testing.T) {
	t.Parallel() // a group of its own
	g := newKubeReplicas(t, 30)
	ids := []string{"a", "b", "c"}
	volumes, revokes := map[string]*projectedVolume{}, map[string]func(){}
	for _, id := range ids {
		token, revoke := boundToken(t, g.c)
		volumes[id], revokes[id] = &projectedVolume{dir: t.TempDir()}, revoke
		if err := volumes[id].write(map[string]string{"token": token}); err != nil {
			t.Fatal(err)
		}
	}
	g.config = func(id string) *rest.Config {
		// As rest.InClusterConfig makes it: the token the file held then,
		// and the file.
		cfg := replicaConfig(g.c, nil)
		cfg.BearerTokenFile = filepath.Join(volumes[id].dir, "token")
		b, err := os.ReadFile(cfg.BearerTokenFile)
		if err != nil {
			t.Fatal(err)
		}
		cfg.BearerToken = string(b)
		return cfg
	}
	st := &statuses{unauthorized: map[string]int{}}
	g.wrap = st.transport
	for _, id := range ids {
		g.join(id)
	}
	_, where := g.waitPlaced("three replicas placing", 30*time.Second, ids...)
	g.runs.mu.Lock()
	starts := g.runs.starts
	g.runs.mu.Unlock()

	for round := range 3 {
		for _, id := range ids {
			token, revoke := boundToken(t, g.c)
			write := func() error { return volumes[id].write(map[string]string{"token": token}) }
			if round == 2 { // the file itself rewritten in place, as a program other than the kubelet may
				write = func() error { return os.WriteFile(filepath.Join(volumes[id].dir, "token"), []byte(token), 0o644) }
			}
			if err := write(); err != nil {
				t.Fatal(err)
			}
			revokes[id]()
			revokes[id] = revoke
		}
		waitRenewed(t, g.c, replicaNamespace, g.group, fmt.Sprintf("round %d, after the old tokens were revoked", round), ids...)
	}

	st.mu.Lock()
	if len(st.unauthorized) != 0 {
		t.Errorf("requests refused 401, by replica: %v; want none", st.unauthorized)
	}
	st.mu.Unlock()
	if n := g.fences.Load(); n != 0 {
		t.Errorf("%d fence passes; want none", n)
	}
	now, all := g.runs.placement(g.names)
	g.runs.mu.Lock()
	restarted := g.runs.starts - starts
	g.runs.mu.Unlock()
	if restarted != 0 || !all || len(now) != len(where) {
		t.Errorf("through the rotations: %d runs started, every name on one replica: %v; want the names to run on where they ran", restarted, all)
	}
	for n, id := range where {
		if now[n] != id {
			t.Errorf("%s ran on %s, then on %s; want it kept", n, id, now[n])
		}
	}
}
