// A three-member etcd cluster for the tests that need one, with its faults:
// a member killed and restarted on its data, frozen and thawed, cut off
// from its peers and healed, two members down (quorum lost) and back.

package etcd

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// The cluster's raft timers are etcd's defaults, which users run: a
// leader's loss is noticed after one to two election timeouts (the
// followers' timers are randomized over [1×, 2×)), and a lease's TTL is
// at least 1.5 × the election timeout (so TTL 2s is the shortest these
// tests may use).
const (
	clusterHeartbeat = 100 * time.Millisecond
	clusterElection  = 1000 * time.Millisecond
)

// etcdCluster is three etcd members started for one test. Each member's
// peer listener sits behind a peerProxy, the URL the others reach it by,
// so that a member can be cut off from its peers while its clients still
// reach it. Its methods are called from the test's goroutine.
type etcdCluster struct {
	t       testing.TB
	dir     string
	members []*etcdMember
	links   *peerLinks
}

// etcdMember is one member: its flags are fixed at the start, so a
// restart comes back on the same ports and data directory.
type etcdMember struct {
	name   string
	client string // host:port of its client listener, reached directly
	args   []string
	log    string // its stdout and stderr, appended across restarts
	proxy  *peerProxy

	// Set by start, cleared by kill; used by the test's goroutine only.
	cmd    *exec.Cmd
	exited chan error // capacity 1: cmd.Wait's result, sent by the goroutine start starts
	frozen bool
}

// startEtcdCluster starts three members of the tests' etcd release and
// waits until each serves a write. It fails the test when they cannot
// start (never skips: a scenario that did not run has shown nothing), and
// stops them and removes their data when the test ends.
func startEtcdCluster(t testing.TB) *etcdCluster {
	t.Helper()
	if testEtcdBin == "" {
		t.Fatalf("no etcd binary to start a cluster with: %v", etcdStartErr)
	}
	var err error
	for range 3 { // a free port may be taken meanwhile
		var ec *etcdCluster
		if ec, err = tryEtcdCluster(t); err == nil {
			t.Cleanup(ec.stop)
			return ec
		}
	}
	t.Fatalf("starting a three-member etcd cluster: %v", err)
	return nil
}

func tryEtcdCluster(t testing.TB) (*etcdCluster, error) {
	base := ""
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		base = "/dev/shm" // etcd fsyncs every write: memory is faster than a disk
	}
	dir, err := os.MkdirTemp(base, "ha-etcd-cluster-")
	if err != nil {
		return nil, err
	}
	ec := &etcdCluster{t: t, dir: dir, links: newPeerLinks()}
	fail := func(err error) (*etcdCluster, error) {
		ec.stop()
		return nil, err
	}
	var initial []string
	peers := make([]string, 3)
	for i := range 3 {
		m := &etcdMember{name: fmt.Sprintf("m%d", i), log: filepath.Join(dir, fmt.Sprintf("m%d.log", i))}
		cport, err := freePort()
		if err != nil {
			return fail(err)
		}
		pport, err := freePort()
		if err != nil {
			return fail(err)
		}
		m.client = fmt.Sprintf("127.0.0.1:%d", cport)
		peers[i] = fmt.Sprintf("127.0.0.1:%d", pport)
		if m.proxy, err = ec.links.listen(m.name, peers[i]); err != nil {
			return fail(err)
		}
		initial = append(initial, fmt.Sprintf("%s=http://%s", m.name, m.proxy.addr()))
		ec.members = append(ec.members, m)
	}
	for i, m := range ec.members {
		client := "http://" + m.client
		m.args = []string{
			"--name", m.name,
			"--data-dir", filepath.Join(dir, m.name),
			"--listen-client-urls", client, "--advertise-client-urls", client,
			"--listen-peer-urls", "http://" + peers[i],
			// The others reach it through its proxy.
			"--initial-advertise-peer-urls", "http://" + m.proxy.addr(),
			"--initial-cluster", strings.Join(initial, ","),
			"--initial-cluster-token", filepath.Base(dir),
			"--initial-cluster-state", "new",
			"--heartbeat-interval", strconv.Itoa(int(clusterHeartbeat / time.Millisecond)),
			"--election-timeout", strconv.Itoa(int(clusterElection / time.Millisecond)),
			"--log-level", "warn", "--logger", "zap",
		}
		if err := ec.start(m); err != nil {
			return fail(err)
		}
	}
	if err := ec.waitHealthy(30 * time.Second); err != nil {
		return fail(err)
	}
	return ec, nil
}

// clientAddrs are the members' client addresses, each reached directly.
func (ec *etcdCluster) clientAddrs() []string {
	a := make([]string, len(ec.members))
	for i, m := range ec.members {
		a[i] = m.client
	}
	return a
}

// start starts m's process, on data it may have from before.
func (ec *etcdCluster) start(m *etcdMember) error {
	logf, err := os.OpenFile(m.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(testEtcdBin, m.args...)
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ETCD_") { // etcd reads ETCD_* as flags
			env = append(env, kv)
		}
	}
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = logf, logf
	err = cmd.Start()
	logf.Close() // the child has its own copy
	if err != nil {
		return err
	}
	m.cmd, m.exited, m.frozen = cmd, make(chan error, 1), false
	ec.links.setPID(m.name, cmd.Process.Pid)
	go func() { m.exited <- cmd.Wait() }() // joined by kill
	return nil
}

// kill kills m at once, as a crash would, and waits for it to exit.
func (ec *etcdCluster) kill(m *etcdMember) {
	if m.cmd == nil {
		return
	}
	_ = m.cmd.Process.Kill() // SIGKILL ends a stopped process too
	<-m.exited
	ec.links.setPID(m.name, 0)
	m.cmd, m.exited, m.frozen = nil, nil, false
}

// restart starts a killed member again on its data directory; it rejoins
// the cluster as itself.
func (ec *etcdCluster) restart(m *etcdMember) {
	ec.t.Helper()
	if m.cmd != nil {
		ec.t.Fatalf("etcd member %s restarted while running", m.name)
	}
	if err := ec.start(m); err != nil {
		ec.t.Fatalf("restarting etcd member %s: %v", m.name, err)
	}
}

// freeze stops m with SIGSTOP: its connections stay open, nothing answers.
func (ec *etcdCluster) freeze(m *etcdMember) {
	ec.t.Helper()
	if err := m.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		ec.t.Fatalf("freezing etcd member %s: %v", m.name, err)
	}
	m.frozen = true
}

func (ec *etcdCluster) thaw(m *etcdMember) {
	ec.t.Helper()
	if err := m.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		ec.t.Fatalf("thawing etcd member %s: %v", m.name, err)
	}
	m.frozen = false
}

// isolate cuts m off from its peers, both ways; its clients still reach
// it.
func (ec *etcdCluster) isolate(m *etcdMember) { ec.links.setIsolated(m.name, true) }

func (ec *etcdCluster) rejoin(m *etcdMember) { ec.links.setIsolated(m.name, false) }

// loseQuorum kills two members, the leader among them when there is one,
// and returns them for restoreQuorum.
func (ec *etcdCluster) loseQuorum() []*etcdMember {
	ec.t.Helper()
	leader := ec.leader(5 * time.Second)
	down := []*etcdMember{leader}
	for _, m := range ec.members {
		if m != leader && len(down) < 2 {
			down = append(down, m)
		}
	}
	for _, m := range down {
		ec.kill(m)
	}
	return down
}

func (ec *etcdCluster) restoreQuorum(down []*etcdMember) {
	ec.t.Helper()
	for _, m := range down {
		ec.restart(m)
	}
}

// leader returns the member that the running members agree leads,
// asking each one's maintenance Status until they agree or limit passes.
func (ec *etcdCluster) leader(limit time.Duration) *etcdMember {
	ec.t.Helper()
	deadline := time.Now().Add(limit)
	for {
		if m, err := ec.findLeader(); err == nil {
			return m
		} else if time.Now().After(deadline) {
			ec.t.Fatalf("no etcd leader within %v: %v", limit, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// follower returns a member that is running and does not lead.
func (ec *etcdCluster) follower() *etcdMember {
	ec.t.Helper()
	leader := ec.leader(5 * time.Second)
	for _, m := range ec.members {
		if m != leader && m.cmd != nil && !m.frozen {
			return m
		}
	}
	ec.t.Fatal("no running follower")
	return nil
}

func (ec *etcdCluster) findLeader() (*etcdMember, error) {
	var leaderID uint64
	ids := map[uint64]*etcdMember{}
	for _, m := range ec.members {
		if m.cmd == nil || m.frozen {
			continue
		}
		st, err := memberStatus(m.client)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", m.name, err)
		}
		ids[st.Header.MemberId] = m
		switch {
		case st.Leader == 0:
			return nil, fmt.Errorf("%s has no leader", m.name)
		case leaderID != 0 && st.Leader != leaderID:
			return nil, fmt.Errorf("members disagree on the leader: %x and %x", leaderID, st.Leader)
		}
		leaderID = st.Leader
	}
	if m := ids[leaderID]; m != nil {
		return m, nil
	}
	return nil, fmt.Errorf("leader %x is not among the running members", leaderID)
}

func memberStatus(addr string) (*clientv3.StatusResponse, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{addr}, DialTimeout: time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return cli.Status(ctx, addr)
}

// waitHealthy waits until every member runs, is connected to its peers,
// serves a write through itself, and all agree on a leader.
func (ec *etcdCluster) waitHealthy(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	var err error
	for time.Now().Before(deadline) {
		if err = ec.healthy(); err == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("the etcd cluster is not healthy after %v: %w", limit, err)
}

func (ec *etcdCluster) healthy() error {
	for _, m := range ec.members {
		select {
		case err := <-m.exited:
			m.exited <- err
			return fmt.Errorf("etcd member %s exited: %v: %s", m.name, err, ec.logTail(m, 2000))
		default:
		}
		switch {
		case m.cmd == nil:
			return fmt.Errorf("etcd member %s is down", m.name)
		case m.frozen:
			return fmt.Errorf("etcd member %s is frozen", m.name)
		case ec.links.isolated(m.name):
			return fmt.Errorf("etcd member %s is cut off", m.name)
		case !etcdServes(m.client):
			return fmt.Errorf("etcd member %s does not serve a write", m.name)
		}
	}
	_, err := ec.findLeader()
	return err
}

// restore ends every fault: thaws, rejoins and restarts the members, and
// waits until the cluster is healthy, failing the test when it does not
// become so.
func (ec *etcdCluster) restore() {
	ec.t.Helper()
	for _, m := range ec.members {
		switch {
		case m.cmd == nil:
			ec.restart(m)
		case m.frozen:
			ec.thaw(m)
		}
		ec.rejoin(m)
	}
	if err := ec.waitHealthy(30 * time.Second); err != nil {
		ec.t.Fatal(err)
	}
}

// stop kills every member, closes the peer proxies and removes the data.
// When the test failed, it logs the end of each member's log first.
func (ec *etcdCluster) stop() {
	for _, m := range ec.members {
		ec.kill(m)
		if ec.t.Failed() {
			ec.t.Logf("etcd member %s's log ends:\n%s", m.name, ec.logTail(m, 3000))
		}
	}
	ec.links.close()
	os.RemoveAll(ec.dir)
}

func (ec *etcdCluster) logTail(m *etcdMember, n int) string {
	b, _ := os.ReadFile(m.log)
	return tail(b, n)
}

// peerLinks are the peer proxies of one cluster and which members are cut
// off. A connection that reaches a member's proxy is told apart by the
// process that opened it (see socketOwner): etcd's peers talk over
// connections that either side opens (a member reads the messages sent to
// it on streams it opened to the sender), so cutting a member off from
// its peers holds the connections to its proxy and those it opened to the
// others'.
type peerLinks struct {
	mu       sync.Mutex
	pids     map[int]string  // guarded by mu; the running members' processes
	cut      map[string]bool // guarded by mu; members cut off from their peers
	changed  chan struct{}   // guarded by mu; closed and replaced at every change of cut, and at close
	closed   bool            // guarded by mu
	wg       sync.WaitGroup  // every proxy's accept loop and pipes; joined by close
	proxies  []*peerProxy    // guarded by mu
	lookupMu sync.Mutex      // one /proc scan at a time
}

func newPeerLinks() *peerLinks {
	return &peerLinks{pids: map[int]string{}, cut: map[string]bool{}, changed: make(chan struct{})}
}

// peerProxy forwards the connections to one member's peer listener.
type peerProxy struct {
	to     string       // the member behind it; immutable
	target string       // its peer listener; immutable
	ln     net.Listener // immutable

	mu    sync.Mutex
	conns map[net.Conn]bool // guarded by mu; every open connection, both sides
}

func (p *peerProxy) addr() string { return p.ln.Addr().String() }

func (l *peerLinks) listen(to, target string) (*peerProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &peerProxy{to: to, target: target, ln: ln, conns: map[net.Conn]bool{}}
	l.mu.Lock()
	l.proxies = append(l.proxies, p)
	l.mu.Unlock()
	l.wg.Add(1)
	go l.accept(p) // joined by close
	return p, nil
}

func (l *peerLinks) setPID(member string, pid int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for p, m := range l.pids {
		if m == member {
			delete(l.pids, p)
		}
	}
	if pid != 0 {
		l.pids[pid] = member
	}
}

func (l *peerLinks) setIsolated(member string, cut bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cut[member] == cut {
		return
	}
	l.cut[member] = cut
	close(l.changed)
	l.changed = make(chan struct{})
}

func (l *peerLinks) isolated(member string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cut[member]
}

// held reports whether bytes between from and to are held now, and the
// channel closed at the next change; closed when the links are closing.
func (l *peerLinks) held(from, to string) (held bool, changed <-chan struct{}, closed bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cut[from] || l.cut[to], l.changed, l.closed
}

func (l *peerLinks) close() {
	l.mu.Lock()
	if !l.closed {
		l.closed = true
		close(l.changed)
	}
	proxies := l.proxies
	l.mu.Unlock()
	for _, p := range proxies {
		p.ln.Close()
		p.mu.Lock()
		for c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
	}
	l.wg.Wait()
}

func (l *peerLinks) accept(p *peerProxy) {
	defer l.wg.Done()
	for {
		down, err := p.ln.Accept()
		if err != nil {
			return
		}
		from := l.owner(down)
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			down.Close()
			continue
		}
		p.mu.Lock()
		p.conns[down], p.conns[up] = true, true
		p.mu.Unlock()
		l.wg.Add(2)
		go l.pipe(p, from, up, down) // joined by close
		go l.pipe(p, from, down, up) // joined by close
	}
}

// pipe copies src to dst, holding every chunk while the link between from
// (the member that opened the connection; "" when unknown) and the proxy's
// member is cut.
func (l *peerLinks) pipe(p *peerProxy, from string, dst, src net.Conn) {
	defer l.wg.Done()
	defer func() {
		dst.Close()
		src.Close()
		p.mu.Lock()
		delete(p.conns, dst)
		delete(p.conns, src)
		p.mu.Unlock()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			for {
				held, changed, closed := l.held(from, p.to)
				if closed {
					return
				}
				if !held {
					break
				}
				<-changed
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // io.EOF or a closed connection
		}
	}
}

// owner returns the member whose process opened c, or "" when none of
// them did (or it has gone).
func (l *peerLinks) owner(c net.Conn) string {
	l.lookupMu.Lock()
	defer l.lookupMu.Unlock()
	l.mu.Lock()
	pids := make(map[int]string, len(l.pids))
	for p, m := range l.pids {
		pids[p] = m
	}
	l.mu.Unlock()
	pid, err := socketOwner(c.RemoteAddr().(*net.TCPAddr), c.LocalAddr().(*net.TCPAddr), pids)
	if err != nil {
		return ""
	}
	return pids[pid]
}

// socketOwner returns which of pids holds the socket whose local address
// is local and remote address remote (a loopback connection seen from its
// other end), from /proc: Linux's table of TCP sockets gives the socket's
// inode, and each process's fd directory the sockets it holds. The
// members' peer connections carry no address of their own (they all come
// from 127.0.0.1), and parsing their HTTP requests for the sender's
// member ID would miss the connections whose first request carries none
// (etcd's probes share the pool of its messages' connections).
func socketOwner(local, remote *net.TCPAddr, pids map[int]string) (int, error) {
	inode, err := socketInode(local, remote)
	if err != nil {
		return 0, err
	}
	want := "socket:[" + inode + "]"
	for pid := range pids {
		dir := fmt.Sprintf("/proc/%d/fd", pid)
		fds, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			if link, err := os.Readlink(filepath.Join(dir, fd.Name())); err == nil && link == want {
				return pid, nil
			}
		}
	}
	return 0, fmt.Errorf("no process of %v holds socket %s", pids, inode)
}

func socketInode(local, remote *net.TCPAddr) (string, error) {
	b, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		return "", err
	}
	hexAddr := func(a *net.TCPAddr) string {
		ip := a.IP.To4()
		if ip == nil {
			return ""
		}
		// The kernel prints the address as a little-endian word.
		return fmt.Sprintf("%02X%02X%02X%02X:%04X", ip[3], ip[2], ip[1], ip[0], a.Port)
	}
	l, r := hexAddr(local), hexAddr(remote)
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) > 9 && f[1] == l && f[2] == r {
			return f[9], nil
		}
	}
	return "", fmt.Errorf("no socket %v → %v in /proc/net/tcp", local, remote)
}

// The faults do what they say: an isolated member loses its leader while
// the others go on writing, a killed member comes back on its data, a
// frozen one stops answering, and two members down stop every write.
func TestEtcdClusterFaults(t *testing.T) {
	ec := startEtcdCluster(t)
	cli := newClient(t, ec.clientAddrs()...)
	defer cli.Close()
	writeVia := func(cli *clientv3.Client, limit time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), limit)
		defer cancel()
		_, err := cli.Put(ctx, "/faults", "x")
		return err
	}
	write := func(limit time.Duration) error { return writeVia(cli, limit) }

	f := ec.follower()
	// The others' writes go through a client of the others alone: the
	// client does not retry a Put that the cut-off member refused for
	// want of a leader, and would try it there a third of the time.
	var others []string
	for _, m := range ec.members {
		if m != f {
			others = append(others, m.client)
		}
	}
	othersCli := newClient(t, others...)
	defer othersCli.Close()
	ec.isolate(f)
	deadline := time.Now().Add(3*clusterElection + 5*time.Second)
	for {
		st, err := memberStatus(f.client)
		if err == nil && st.Leader == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s, cut off from its peers, still has a leader (%v)", f.name, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := writeVia(othersCli, 5*time.Second); err != nil {
		t.Errorf("writing to the others with %s cut off: %v", f.name, err)
	}
	ec.restore()

	l := ec.leader(5 * time.Second)
	ec.kill(l)
	if nl := ec.leader(10 * time.Second); nl == l {
		t.Errorf("killed leader %s still leads", l.name)
	}
	ec.restore()

	f = ec.follower()
	ec.freeze(f)
	if _, err := memberStatus(f.client); err == nil {
		t.Errorf("frozen %s answered", f.name)
	}
	ec.restore()

	down := ec.loseQuorum()
	if err := write(2 * time.Second); err == nil {
		t.Error("a write succeeded with two members down")
	}
	ec.restoreQuorum(down)
	ec.restore()
	if err := write(5 * time.Second); err != nil {
		t.Errorf("writing after quorum came back: %v", err)
	}
}
