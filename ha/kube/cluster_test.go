// The cluster the tests share: an etcd and a kube-apiserver started once
// per test binary in a temporary directory, clients for the administrator
// and for the replicas, and the processes' lifecycle.

package kube

import (
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// testCluster is the tests' cluster; nil when it could not start (then
// clusterErr says why).
var (
	testCluster *cluster
	clusterErr  error
)

func TestMain(m *testing.M) {
	flag.Parse()
	if raw := os.Getenv(childEnv); raw != "" {
		childMain(raw) // a replica process of procs_test.go; never returns
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

// cluster is an etcd and a kube-apiserver storing into it.
type cluster struct {
	release string
	dir     string
	etcd    *process
	etcdURL string // etcd's client URL
	api     *apiServer
	apiBin  string // the kube-apiserver binary, for a test that starts another

	// admin acts as a member of system:masters, replica as the
	// ServiceAccount deploy/rbac.yaml binds. Their HTTP clients are
	// the tests' own, so that stop can close their connections.
	admin, replica *kubernetes.Clientset

	mu          sync.Mutex
	httpClients []*http.Client // guarded by mu: every HTTP client made for the tests (parallel tests add theirs)
}

// track records hc, for stop to close its connections.
func (c *cluster) track(hc *http.Client) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.httpClients = append(c.httpClients, hc)
}

// startCluster gets the releases asked for and starts them, trying three
// times, as a free port may be taken meanwhile.
func startCluster() (*cluster, error) {
	release, err := wantedKube()
	if err != nil {
		return nil, err
	}
	etcdBin, err := etcdBinary(*etcdVersion)
	if err != nil {
		return nil, err
	}
	apiBin, err := apiServerBinary(release)
	if err != nil {
		return nil, err
	}
	var errs []error
	for range 3 {
		c, err := startClusterOnce(release, etcdBin, apiBin)
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

func startClusterOnce(release, etcdBin, apiBin string) (c *cluster, err error) {
	base := ""
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		base = "/dev/shm" // etcd fsyncs every write: memory is faster than a disk
	}
	dir, err := os.MkdirTemp(base, "ha-kube-")
	if err != nil {
		return nil, err
	}
	c = &cluster{release: release, dir: dir}
	defer func() {
		if err != nil {
			c.stop()
		}
	}()
	etcdURL, etcd, err := startEtcd(etcdBin, *etcdVersion, dir)
	if err != nil {
		return nil, err
	}
	c.etcd, c.etcdURL, c.apiBin = etcd, etcdURL, apiBin
	if c.api, err = startAPIServer(apiBin, release, etcdURL, dir); err != nil {
		return nil, err
	}
	if c.admin, err = c.client(c.api.adminToken); err != nil {
		return nil, err
	}
	if c.replica, err = c.client(c.api.replicaToken); err != nil {
		return nil, err
	}
	return c, nil
}

// client returns a clientset that authenticates with token and trusts the
// server's CA alone.
func (c *cluster) client(token string) (*kubernetes.Clientset, error) {
	cfg := &rest.Config{
		Host:            c.api.url,
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

// stop stops the kube-apiserver, then its etcd, and removes their files.
func (c *cluster) stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, hc := range c.httpClients {
		hc.CloseIdleConnections()
	}
	if c.api != nil {
		c.api.proc.stop()
	}
	if c.etcd != nil {
		c.etcd.stop()
	}
	os.RemoveAll(c.dir)
}

// process is a server the tests started, logging to a file.
type process struct {
	cmd    *exec.Cmd
	log    *os.File
	exited chan error // cmd.Wait's result, once; owned by the goroutine startProcess starts
}

// startProcess starts bin with args, its output to logPath, without the
// environment's variables that start with dropEnv (when not "").
func startProcess(bin, logPath, dropEnv string, args ...string) (*process, error) {
	cmd := exec.Command(bin, args...)
	for _, kv := range os.Environ() {
		if dropEnv == "" || !strings.HasPrefix(kv, dropEnv) {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	p := &process{cmd: cmd, log: logf, exited: make(chan error, 1)}
	go func() { p.exited <- cmd.Wait() }() // joined by stop
	return p, nil
}

// waitFor calls ready until it succeeds, the process exits or timeout
// passes, and says which, with the end of the process's log.
func (p *process) waitFor(timeout time.Duration, ready func() error) error {
	deadline := time.Now().Add(timeout)
	var err error
	for time.Now().Before(deadline) {
		select {
		case exit := <-p.exited:
			p.exited <- exit // for stop
			return fmt.Errorf("%s exited: %v: %s", p.cmd.Path, exit, p.logTail())
		default:
		}
		if err = ready(); err == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s not ready within %v: %v: %s", p.cmd.Path, timeout, err, p.logTail())
}

func (p *process) logTail() string {
	b, _ := os.ReadFile(p.log.Name())
	return tail(b, 2000)
}

// stop kills the process and waits for it.
func (p *process) stop() {
	_ = p.cmd.Process.Kill()
	<-p.exited
	p.log.Close()
}
