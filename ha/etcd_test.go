// The etcd the tests run against: started once per test binary on free
// loopback ports in a temporary directory, without the ETCD_* variables of
// the environment.

package ha

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"
)

// testEtcd is the address of the tests' etcd; "" when none could start
// (then etcdStartErr says why).
var (
	testEtcd     string
	etcdStartErr error
)

func TestMain(m *testing.M) {
	flag.Parse()
	if addr := os.Getenv(childEtcdEnv); addr != "" {
		pausedChild(addr, os.Getenv(childPrefixEnv))
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
		if err := goleak.Find(goleak.IgnoreAnyFunction("github.com/bgctl/controller/ha.startEtcdOnce.func1")); err != nil {
			fmt.Fprintf(os.Stderr, "ha tests: goroutines left behind: %v\n", err)
			code = 1
		}
	}
	if stop != nil {
		stop()
	}
	os.Exit(code)
}

// needEtcd fails a test when no etcd could start, in CI and out of it: a
// replica test that did not run has shown nothing. Installing etcd (Debian:
// etcd-server) or putting it on PATH mends it.
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

// startEtcd starts an etcd with short election timers and waits until it
// serves. It tries three times, as a free port may be taken meanwhile.
func startEtcd() (stop func(), err error) {
	bin, err := exec.LookPath("etcd")
	if err != nil {
		return nil, fmt.Errorf("no etcd binary on PATH (Debian: apt-get install etcd-server): %w", err)
	}
	for range 3 {
		stop, err = startEtcdOnce(bin)
		if err == nil {
			return stop, nil
		}
	}
	return nil, err
}

func startEtcdOnce(bin string) (func(), error) {
	base := ""
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		base = "/dev/shm" // etcd fsyncs every write: memory is faster than a disk
	}
	dir, err := os.MkdirTemp(base, "ha-etcd-")
	if err != nil {
		return nil, err
	}
	cport, err := freePort()
	if err != nil {
		return nil, err
	}
	pport, err := freePort()
	if err != nil {
		return nil, err
	}
	client := fmt.Sprintf("http://127.0.0.1:%d", cport)
	peer := fmt.Sprintf("http://127.0.0.1:%d", pport)
	cmd := exec.Command(bin,
		"--name", "ha-test",
		"--data-dir", filepath.Join(dir, "data"),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "ha-test="+peer,
		"--heartbeat-interval", "10", "--election-timeout", "100",
		"--log-level", "warn", "--logger", "zap",
	)
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ETCD_") { // etcd reads ETCD_* as flags
			env = append(env, kv)
		}
	}
	cmd.Env = env
	logf, err := os.Create(filepath.Join(dir, "etcd.log"))
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return nil, err
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
			return nil, fmt.Errorf("etcd exited: %v: %s", err, tail(logs, 2000))
		default:
		}
		if etcdServes(addr) {
			testEtcd = addr
			return stop, nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	return nil, fmt.Errorf("etcd at %s did not serve within 15s", addr)
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
