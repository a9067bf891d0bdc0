// The cluster the tests share: an etcd and a kube-apiserver (package
// kubetest) started once per test binary in a temporary directory, and
// clients for the administrator and for the replicas.

package kube

import (
	"flag"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/bgctl/controller/ha/kube/internal/kubetest"
)

// testCluster is the tests' cluster; nil when it could not start (then
// clusterErr says why).
var (
	testCluster *cluster
	clusterErr  error
)

// parallelWaits is how many parallel tests run at once by default.
const parallelWaits = 4

func TestMain(m *testing.M) {
	flag.Parse()
	if raw := os.Getenv(childEnv); raw != "" {
		childMain(raw) // a replica process of procs_test.go; never returns
	}
	// The parallel tests mostly wait for leases to run out on the API
	// server's clock, not for a CPU: run more of them at once than
	// go test's default (GOMAXPROCS), unless -parallel says otherwise.
	parallelSet := false
	flag.Visit(func(f *flag.Flag) { parallelSet = parallelSet || f.Name == "test.parallel" })
	if !parallelSet {
		if err := flag.Set("test.parallel", strconv.Itoa(max(runtime.GOMAXPROCS(0), parallelWaits))); err != nil {
			panic(err)
		}
	}
	// Before m.Run, so that a first run's builds do not count against
	// the tests' -timeout.
	start := time.Now()
	testCluster, clusterErr = startCluster()
	if testCluster != nil {
		fmt.Fprintf(os.Stderr, "kube tests: kube-apiserver %s on etcd %s ready in %v\n", testCluster.release, *etcdVersion, time.Since(start).Round(10*time.Millisecond))
	}
	code := m.Run()
	if testCluster != nil {
		testCluster.stop()
	}
	if code == 0 {
		// The clients' connections ended with the servers; every watch
		// was stopped by its test, every process waited for by stop.
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "kube tests: goroutines left behind: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// needCluster returns the tests' cluster, and fails the test when none
// could start, in CI and out of it: a test that did not run has shown
// nothing. The servers are built with the go command and the Go module
// proxy, so either being unreachable is the usual cause.
func needCluster(t testing.TB) *cluster {
	t.Helper()
	if testCluster == nil {
		t.Fatalf("no kube-apiserver to test against: %v", clusterErr)
	}
	return testCluster
}

// cluster is the servers of package kubetest and the tests' clients.
type cluster struct {
	release string
	etcdURL string     // etcd's client URL
	api     *apiServer // the kube-apiserver
	apiBin  string     // the kube-apiserver binary, for a test that starts another
	servers *kubetest.Servers

	// admin acts as a member of system:masters, replica as the
	// ServiceAccount deploy/rbac.yaml binds. Their HTTP clients are
	// the tests' own, so that stop can close their connections.
	admin, replica *kubernetes.Clientset

	mu          sync.Mutex
	httpClients []*http.Client // guarded by mu: every HTTP client made for the tests (parallel tests add theirs)
}

// apiServer is a kubetest.APIServer under the tests' names.
type apiServer struct {
	url          string // https://127.0.0.1:<port>
	caFile       string // the CA of its self-signed serving certificate
	adminToken   string // user admin, group system:masters
	replicaToken string // the ServiceAccount of deploy/rbac.yaml
	proc         *kubetest.Process
}

func asAPIServer(s *kubetest.APIServer) *apiServer {
	return &apiServer{url: s.URL, caFile: s.CAFile, adminToken: s.AdminToken, replicaToken: s.ReplicaToken, proc: s.Proc}
}

// startAPIServer starts another kube-apiserver, as kubetest.StartAPIServer
// does.
func startAPIServer(bin, release, etcdURL, dir string, extra ...string) (*apiServer, error) {
	s, err := kubetest.StartAPIServer(bin, release, etcdURL, dir, extra...)
	if err != nil {
		return nil, err
	}
	return asAPIServer(s), nil
}

// The replicas' namespace, where deploy/rbac.yaml puts them.
const replicaNamespace = kubetest.ReplicaNamespace

// track records hc, for stop to close its connections.
func (c *cluster) track(hc *http.Client) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.httpClients = append(c.httpClients, hc)
}

// startCluster starts the releases asked for (kubetest.Start), the
// kube-apiserver with apiFlags added to its own, and the tests' clients.
func startCluster(apiFlags ...string) (c *cluster, err error) {
	release, err := wantedKube()
	if err != nil {
		return nil, err
	}
	servers, err := kubetest.Start(release, *etcdVersion, apiFlags...)
	if err != nil {
		return nil, err
	}
	c = &cluster{release: release, etcdURL: servers.EtcdURL, api: asAPIServer(servers.API), apiBin: servers.APIBin, servers: servers}
	defer func() {
		if err != nil {
			c.stop()
		}
	}()
	if c.admin, err = c.client(c.api.adminToken); err != nil {
		return nil, err
	}
	if c.replica, err = c.client(c.api.replicaToken); err != nil {
		return nil, err
	}
	return c, nil
}

// newCluster starts, for test t alone, an etcd and a kube-apiserver of
// their own, the kube-apiserver with apiFlags added to its own (settings
// the shared cluster must not take, as other tests run on it), and stops
// them when t ends.
func newCluster(t testing.TB, apiFlags ...string) *cluster {
	t.Helper()
	needCluster(t) // the binaries are built
	start := time.Now()
	c, err := startCluster(apiFlags...)
	if err != nil {
		t.Fatalf("a cluster of the test's own (%v): %v", apiFlags, err)
	}
	t.Cleanup(c.stop)
	t.Logf("a kube-apiserver of the test's own, %v, ready in %v", apiFlags, time.Since(start).Round(10*time.Millisecond))
	return c
}

// client returns a clientset that authenticates with token and trusts the
// server's CA alone.
func (c *cluster) client(token string) (*kubernetes.Clientset, error) {
	return c.clientAt(c.api.url, token)
}

// clientAt returns a clientset of the server at url (c's, or a peer of
// it: kubetest.APIServer.StartPeer), as client does.
func (c *cluster) clientAt(url, token string) (*kubernetes.Clientset, error) {
	cfg := &rest.Config{
		Host:            url,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAFile: c.api.caFile},
		// The default (5 per second) would pace the tests, not the server.
		QPS: 1000, Burst: 1000,
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	c.track(hc)
	return kubernetes.NewForConfigAndClient(cfg, hc)
}

// stop closes the tests' connections, stops the kube-apiserver, then its
// etcd, and removes their files.
func (c *cluster) stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, hc := range c.httpClients {
		hc.CloseIdleConnections()
	}
	c.servers.Stop()
}

var (
	kubeVersion = flag.String("kube.version", "", "the Kubernetes release whose kube-apiserver to test against, e.g. "+kubetest.CurrentKube+"; built from the Go module proxy into the user cache directory once (default: $"+kubeVersionEnv+", else "+kubetest.CurrentKube+")")
	etcdVersion = flag.String("kube.etcd", kubetest.CurrentEtcd, "the etcd release the kube-apiserver stores into; built from the Go module proxy into the user cache directory once")
)

// kubeVersionEnv names the release to test against when -kube.version is
// not given.
const kubeVersionEnv = "HA_KUBE_VERSION"

// wantedKube returns the release -kube.version, $HA_KUBE_VERSION or
// kubetest.CurrentKube names, checked.
func wantedKube() (string, error) {
	release, from := *kubeVersion, "-kube.version"
	if release == "" {
		release, from = os.Getenv(kubeVersionEnv), "$"+kubeVersionEnv
	}
	if release == "" {
		return kubetest.CurrentKube, nil
	}
	if err := kubetest.CheckRelease(release); err != nil {
		return "", fmt.Errorf("%s=%w", from, err)
	}
	return release, nil
}
