// The etcd the tests run against: a pinned release, built once from the Go
// module proxy into a cache (or found on PATH when it is that release),
// started once per test binary on free loopback ports in a temporary
// directory, without the ETCD_* variables of the environment.

package etcd

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/bgctl/controller/ha/internal/gobuild"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"
)

// testEtcd is the address of the tests' etcd; "" when none could start
// (then etcdStartErr says why). testEtcdVersion is the version it reports,
// testEtcdBin its binary, for tests that start one of their own.
var (
	testEtcd        string
	testEtcdVersion string
	testEtcdBin     string
	etcdStartErr    error
)

// currentEtcd is the etcd release the tests run against by default: the
// latest release of the current line, pinned in ha/internal/gobuild for
// ha/kube's tests too (./test builds it before the tests start). CI also
// runs them against the oldest supported release (supportedServers in
// version.go).
const currentEtcd = gobuild.CurrentEtcd

var etcdRelease = flag.String("ha.etcd", "", "the etcd release to test against, e.g. v3.5.23; built from the Go module proxy into the user cache directory once (default: $"+etcdReleaseEnv+", else "+currentEtcd+")")

// etcdReleaseEnv names the etcd release to test against when -ha.etcd is
// not given.
const etcdReleaseEnv = "HA_ETCD_VERSION"

func TestMain(m *testing.M) {
	flag.Parse()
	if addr := os.Getenv(childEtcdEnv); addr != "" {
		pausedChild(addr, os.Getenv(childPrefixEnv), os.Getenv(childIDEnv))
		return
	}
	stop, err := startEtcd()
	if err != nil {
		// The tests that need etcd fail with this reason (needEtcd);
		// the others still run.
		etcdStartErr = err
	}
	code := m.Run()
	if code == 0 {
		// Every replica joined its goroutines in Leave or Close; the
		// etcd clients' goroutines end soon after their Close.
		// The goroutine waiting for etcd to exit is joined by stop.
		if err := goleak.Find(goleak.IgnoreAnyFunction("github.com/bgctl/controller/ha/etcd.startEtcdOnce.func1")); err != nil {
			fmt.Fprintf(os.Stderr, "ha/etcd tests: goroutines left behind: %v\n", err)
			code = 1
		}
	}
	if stop != nil {
		stop()
	}
	os.Exit(code)
}

// needEtcd fails a test when no etcd could start, in CI and out of it: a
// replica test that did not run has shown nothing. The tests build their
// etcd with the go command and the Go module proxy (GOPROXY), so either
// being unreachable is the usual cause.
func needEtcd(t testing.TB) {
	t.Helper()
	if testEtcd == "" {
		t.Fatalf("no etcd to test against: %v", etcdStartErr)
	}
}

// freePort returns a loopback port that was free a moment ago.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// startEtcd gets the etcd release asked for, starts it with short election
// timers and waits until it serves and reports that release. It tries
// three times, as a free port may be taken meanwhile.
func startEtcd() (stop func(), err error) {
	release, err := wantedEtcd()
	if err != nil {
		return nil, err
	}
	bin, err := etcdBinary(release)
	if err != nil {
		return nil, err
	}
	testEtcdBin = bin
	for range 3 {
		testEtcd, stop, err = startEtcdOnce(bin)
		if err == nil {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	v, err := askEtcdVersion(testEtcd)
	if err == nil && "v"+v != release {
		err = fmt.Errorf("%s reports etcd %s, not %s", bin, v, release)
	}
	if err != nil {
		testEtcd = ""
		stop()
		return nil, err
	}
	testEtcdVersion = v
	return stop, nil
}

// wantedEtcd returns the release -ha.etcd, $HA_ETCD_VERSION or currentEtcd
// names, checked: the tests build go.etcd.io/etcd/server/v3, so only a v3
// release will do.
func wantedEtcd() (string, error) {
	release, from := *etcdRelease, "-ha.etcd"
	if release == "" {
		release, from = os.Getenv(etcdReleaseEnv), "$"+etcdReleaseEnv
	}
	if release == "" {
		return currentEtcd, nil
	}
	if !etcdReleasePattern.MatchString(release) {
		return "", fmt.Errorf("%s=%q: want an etcd v3 release such as %s", from, release, currentEtcd)
	}
	return release, nil
}

var etcdReleasePattern = regexp.MustCompile(`^v3\.[0-9]+\.[0-9]+$`)

// etcdBinary returns the path of an etcd binary of release: etcd on PATH
// when it is that release, else the one ha/internal/gobuild keeps in the
// user cache directory, built first if need be.
func etcdBinary(release string) (string, error) {
	if bin, err := exec.LookPath("etcd"); err == nil {
		if v, err := gobuild.EtcdRelease(bin); err == nil && v == release {
			return bin, nil
		}
	}
	return gobuild.Etcd(release)
}

// askEtcdVersion returns the version the etcd at addr reports in the
// maintenance Status call, as Join asks it.
func askEtcdVersion(addr string) (string, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{addr}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return "", err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cli.Status(ctx, addr)
	if err != nil {
		return "", fmt.Errorf("asking the etcd at %s for its version: %w", addr, err)
	}
	return resp.Version, nil
}

// startEtcdOnce starts the etcd at bin, with extra flags, and returns its
// client address.
func startEtcdOnce(bin string, extra ...string) (string, func(), error) {
	base := ""
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		base = "/dev/shm" // etcd fsyncs every write: memory is faster than a disk
	}
	dir, err := os.MkdirTemp(base, "ha-etcd-")
	if err != nil {
		return "", nil, err
	}
	cport, err := freePort()
	if err != nil {
		return "", nil, err
	}
	pport, err := freePort()
	if err != nil {
		return "", nil, err
	}
	client := fmt.Sprintf("http://127.0.0.1:%d", cport)
	peer := fmt.Sprintf("http://127.0.0.1:%d", pport)
	cmd := exec.Command(bin, append([]string{
		"--name", "ha-test",
		"--data-dir", filepath.Join(dir, "data"),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "ha-test=" + peer,
		"--heartbeat-interval", "10", "--election-timeout", "100",
		"--log-level", "warn", "--logger", "zap",
	}, extra...)...)
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ETCD_") { // etcd reads ETCD_* as flags
			env = append(env, kv)
		}
	}
	cmd.Env = env
	logf, err := os.Create(filepath.Join(dir, "etcd.log"))
	if err != nil {
		return "", nil, err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }() // joined by stop, or below
	stop := func() {
		_ = cmd.Process.Kill()
		<-exited
		logf.Close()
		os.RemoveAll(dir)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", cport)
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			exited <- err
			logs, _ := os.ReadFile(filepath.Join(dir, "etcd.log"))
			stop()
			return "", nil, fmt.Errorf("etcd exited: %v: %s", err, tail(logs, 2000))
		default:
		}
		if etcdServes(addr) {
			return addr, stop, nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	return "", nil, fmt.Errorf("etcd at %s did not serve within 15s", addr)
}

func etcdServes(addr string) bool {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{addr}, DialTimeout: time.Second, Logger: zap.NewNop()})
	if err != nil {
		return false
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err = cli.Put(ctx, "ha-test-ready", "1")
	return err == nil
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

var stderr = os.Stderr
