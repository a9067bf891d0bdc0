// Test helpers: a recorder of every DoFunc run across replicas, and a
// cluster of replicas that each reach etcd through their own proxy.

package etcd

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bgctl/controller"
	"github.com/bgctl/controller/ha"
	"github.com/bgctl/controller/ha/internal/place"
	"github.com/bgctl/controller/ha/internal/runlog"
	"github.com/sirupsen/logrus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// node is one replica of a test cluster with its client and proxy.
type node struct {
	id    string
	proxy *proxy
	cli   *clientv3.Client
	r     *ha.Replica
	made  *madeStore // the store r was made on
}

// cluster is the replicas of one test, sharing a prefix and a recorder.
type cluster struct {
	t      testing.TB
	prefix string
	opts   ha.Options
	names  []string
	rec    *runlog.Recorder
	nodes  map[string]*node // live ones, by ID
	// etcd is the test's etcd cluster (newClusterOn); nil: the tests'
	// single member, testEtcd.
	etcd *etcdCluster

	// params gives the ControllerParams a node registers name with;
	// nil: the recorder's.
	params func(n *node, name string) controller.ControllerParams
	// slowestStop is the longest Close or Leave of the test so far.
	slowestStop time.Duration
}

// testOptions are short enough for quick tests and long enough for -race
// on two cores: a fence window of 1.5s, keepalives every 375ms.
func testOptions() ha.Options {
	return ha.Options{TTL: 2 * time.Second, Margin: 500 * time.Millisecond, Logger: quietLogger()}
}

func quietLogger() logrus.FieldLogger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	l.SetLevel(logrus.WarnLevel) // what the tests count; Info costs a replica of 100,000 names seconds
	if *showLogs {
		l.SetOutput(logWriter{})
		l.SetLevel(logrus.InfoLevel)
	}
	l.AddHook(fencesPassed)
	return l
}

// fencesPassed counts the "fence passed" warnings of every replica of the
// test binary, for the measurements' reports.
var fencesPassed = &warnCounter{prefix: "fence passed"}

// warnCounter counts the log lines that start with prefix, at Warn, or at
// level when it is set.
type warnCounter struct {
	prefix string
	level  logrus.Level // 0 (Panic, never counted here): Warn
	n      atomic.Int64
}

func (w *warnCounter) Levels() []logrus.Level {
	if w.level == 0 {
		return []logrus.Level{logrus.WarnLevel}
	}
	return []logrus.Level{w.level}
}

func (w *warnCounter) Fire(e *logrus.Entry) error {
	if strings.HasPrefix(e.Message, w.prefix) {
		w.n.Add(1)
	}
	return nil
}

var showLogs = flag.Bool("ha.logs", false, "print the replicas' Info logs")

// logWriter sends the replicas' logs to stderr with -ha.logs.
type logWriter struct{}

func (logWriter) Write(b []byte) (int, error) { return fmt.Fprint(stderr, string(b)) }

func newCluster(t testing.TB, names int, opts ha.Options) *cluster {
	t.Helper()
	needEtcd(t)
	c := &cluster{
		t:      t,
		prefix: fmt.Sprintf("/test/%s/%d", strings.ReplaceAll(t.Name(), "/", "_"), time.Now().UnixNano()),
		opts:   opts,
		rec:    runlog.New(),
		nodes:  map[string]*node{},
	}
	for i := range names {
		c.names = append(c.names, fmt.Sprintf("name-%04d", i))
	}
	t.Cleanup(func() {
		for _, n := range c.nodes {
			c.crash(n)
		}
	})
	return c
}

func newClient(t testing.TB, addrs ...string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: addrs, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	return cli
}

// join starts a replica named id and registers every name on it.
func (c *cluster) join(id string) *node {
	c.t.Helper()
	n := c.joinEmpty(id)
	c.register(n)
	return n
}

// register registers every name on n.
func (c *cluster) register(n *node) {
	c.t.Helper()
	for _, name := range c.names {
		p := c.rec.Params(n.id, name)
		if c.params != nil {
			p = c.params(n, name)
		}
		if err := n.r.UpdateController(name, p); err != nil {
			c.t.Fatal(err)
		}
	}
}

// joinEmpty starts a replica named id with no names registered.
func (c *cluster) joinEmpty(id string) *node {
	c.t.Helper()
	return c.joinVia(id, c.etcdAddrs()...)
}

// etcdAddrs are the client addresses of the etcd the replicas use: the
// tests' one member, or every member of the test's etcd cluster.
func (c *cluster) etcdAddrs() []string {
	if c.etcd != nil {
		return c.etcd.clientAddrs()
	}
	return []string{testEtcd}
}

// joinVia starts a replica named id with no names registered, whose
// proxy forwards to addrs: etcd, or another proxy in front of it.
func (c *cluster) joinVia(id string, addrs ...string) *node {
	c.t.Helper()
	n := c.newNodeVia(id, addrs...)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.r.Join(ctx); err != nil {
		c.t.Fatalf("Join(%s): %v", id, err)
	}
	return n
}

// newNode makes a replica named id, with its proxy and client, that has
// not joined.
func (c *cluster) newNode(id string) *node {
	c.t.Helper()
	return c.newNodeVia(id, c.etcdAddrs()...)
}

// newNodeVia is newNode with a proxy that forwards to addrs: etcd, or
// another proxy in front of it. With several, the client gets them all,
// each through the proxy.
func (c *cluster) newNodeVia(id string, addrs ...string) *node {
	c.t.Helper()
	n := &node{id: id, proxy: newProxy(c.t, addrs...)}
	n.cli = newClient(c.t, n.proxy.addrs()...)
	return c.addNode(n)
}

// addNode makes n's replica, under the cluster's prefix and options, on
// n's client, and counts n among the cluster's nodes.
func (c *cluster) addNode(n *node) *node {
	c.t.Helper()
	opts := c.opts
	opts.Prefix, opts.ID = c.prefix, n.id
	st := &madeStore{Store: Store(n.cli)}
	r, err := ha.New(st, opts)
	if err != nil {
		c.t.Fatalf("New(%s): %v", n.id, err)
	}
	n.r, n.made = r, st
	c.nodes[n.id] = n
	return n
}

// etcd returns the etcd backend of n's replica, whose fields a test may
// set before Join.
func (n *node) etcd() *etcdBackend { return n.made.be }

// madeStore is a Store that keeps the backend it made last.
type madeStore struct {
	ha.Store
	be *etcdBackend // set by Backend, in New
}

// Backend makes the backend, and keeps it.
func (s *madeStore) Backend(c ha.BackendConfig) (ha.Backend, error) {
	b, err := s.Store.Backend(c)
	if err == nil {
		s.be = b.(*etcdBackend)
	}
	return b, err
}

// etcdRevision returns the store's current revision, as cli reads it: the
// etcd writes between two readings.
func etcdRevision(t testing.TB, cli *clientv3.Client) int64 {
	t.Helper()
	resp, err := cli.Get(context.Background(), "/none")
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}

// registerTogether registers every name on each of nodes, all at once.
func (c *cluster) registerTogether(nodes []*node) {
	var wg sync.WaitGroup
	for _, nd := range nodes {
		wg.Add(1)
		go func() { defer wg.Done(); c.register(nd) }() // joined below
	}
	wg.Wait()
}

// joinTogether joins nodes all at once, as replicas started together do.
func (c *cluster) joinTogether(nodes []*node) {
	var wg sync.WaitGroup
	for _, nd := range nodes {
		wg.Add(1)
		go func() { // joined below
			defer wg.Done()
			if err := nd.r.Join(context.Background()); err != nil {
				c.t.Errorf("Join(%s): %v", nd.id, err)
			}
		}()
	}
	wg.Wait()
}

// forget drops a node that has stopped, closing its client and proxy.
func (c *cluster) forget(n *node) {
	n.cli.Close()
	n.proxy.close()
	delete(c.nodes, n.id)
}

// crash closes the node's client without revoking its lease, then stops
// the replica without telling etcd anything.
// Close must return within TTL of the call whatever the controllers do;
// Leave when its context ends. The slack is for a loaded machine.
func (c *cluster) crash(n *node) {
	n.cli.Close()
	start := time.Now()
	if err := n.r.Close(); err != nil {
		c.t.Errorf("Close(%s): %v", n.id, err)
	}
	c.stopTook("Close", n, time.Since(start), c.opts.TTL)
	n.proxy.close()
	delete(c.nodes, n.id)
}

func (c *cluster) leave(n *node) {
	const limit = 10 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	start := time.Now()
	if err := n.r.Leave(ctx); err != nil {
		c.t.Errorf("Leave(%s): %v", n.id, err)
	}
	c.stopTook("Leave", n, time.Since(start), limit)
	n.cli.Close()
	n.proxy.close()
	delete(c.nodes, n.id)
}

// stopTook records how long a Close or Leave took, and fails the test
// when it passed its bound by more than a second.
func (c *cluster) stopTook(what string, n *node, took, bound time.Duration) {
	c.slowestStop = max(c.slowestStop, took)
	if took > bound+time.Second {
		c.t.Errorf("%s(%s) took %v, past its bound %v", what, n.id, took, bound)
	}
}

// startThree joins r0, r1 and r2, waits until the names are spread over
// them, and returns the placement and how long it took.
func (c *cluster) startThree() (map[string]string, time.Duration) {
	c.t.Helper()
	ids := []string{"r0", "r1", "r2"}
	for _, id := range ids {
		c.join(id)
	}
	want := c.expected(ids)
	return want, c.waitPlacement(want, 10*time.Second)
}

// expected returns where rendezvous hashing puts each name over members.
func (c *cluster) expected(members []string) map[string]string {
	slices.Sort(members)
	m := make(map[string]string, len(c.names))
	for _, name := range c.names {
		m[name] = place.Owner(name, members)
	}
	return m
}

// waitPlacement waits until every name runs exactly where want says, and
// returns how long that took; it fails the test after limit. It checks
// every 2 ms, and less often for many names, whose check holds the
// recorder's lock longer.
func (c *cluster) waitPlacement(want map[string]string, limit time.Duration) time.Duration {
	c.t.Helper()
	start := time.Now()
	every := 2*time.Millisecond + time.Duration(len(want))*100*time.Nanosecond
	for {
		diff := c.rec.Misplaced(want)
		if diff == 0 {
			return time.Since(start)
		}
		if time.Since(start) > limit {
			c.t.Fatalf("after %v, %d of %d names do not run where expected", limit, diff, len(want))
		}
		time.Sleep(every)
	}
}
