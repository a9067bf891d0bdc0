// Whole replicas in processes of their own, each through a proxy of its
// own to the real kube-apiserver, on the replicas' credentials: one is
// SIGKILLed while it holds names, and the others start them only once
// its session ended; one is SIGSTOPped until another took its name over,
// and once it resumes the writes its claim guards are refused.

package kube

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"

	controller "github.com/bgctl/controller"
	"github.com/bgctl/controller/ha"
)

// childEnv holds a child's childConfig as JSON. TestMain runs childMain
// instead of the tests when it is set.
const childEnv = "HA_KUBE_TEST_CHILD"

// childConfig says which replica a child process is and how to reach the
// API server. Immutable.
type childConfig struct {
	Host, Token, CAFile string // the child's proxy, the replicas' token, the server's CA
	Group, ID           string
	// Tag starts the child's report lines, and names it to the test:
	// ID unless set. Two runs of one ID (a restart) have tags of their
	// own.
	Tag    string
	Names  []string
	Leader bool // Options.Mode Leader, else Spread
	// InCluster: the child reaches the API server as a Pod does, with
	// rest.InClusterConfig (its environment and the ServiceAccount files
	// under /var/run/secrets/kubernetes.io/serviceaccount), and keeps its
	// group in the namespace those files name; Host, Token and CAFile
	// are unused.
	InCluster bool
	// Fenced DoFuncs write the group's data Lease (dataLease) every
	// 20ms through fencedWrite, ignoring their context, and report
	// each outcome; they report no runs. Otherwise a DoFunc runs until
	// cancelled and a StopFunc works a little, each reporting its run.
	Fenced bool
}

// The data Lease's annotations: the highest token written for each name,
// and the last writes, oldest first, as "<replica>:<token>" separated by
// spaces.
const (
	markAnnotation   = "test.bgctl.dev/mark."
	writesAnnotation = "test.bgctl.dev/writes"
	keptWrites       = 200
)

// dataLease is the name of the Lease the fenced DoFuncs of group write.
// It carries no group label, so the replicas never see it.
func dataLease(group string) string { return group + "-data" }

// childMain is a child process: it joins as cc says and reports on file
// descriptor 3, one line per write, each "<id> <what>":
//
//	joined
//	begin <name> <seq>     a run starts; it waits for "<seq>" on stdin
//	end <name>             the run has ended
//	claim <name> <token>   a fenced DoFunc's Claim
//	fence <err>            the replica's fence passed
//	write ok <token> | write refused <token> <mark> | write conflict | write error <err>
//	error <err>            the child gives up
//
// The descriptor is one pipe that every child shares with the test, and
// each line is one write shorter than the pipe's atomic size, so the test
// reads the lines of all children in the order they were written. A run
// starts only once the test has recorded its begin line and answered,
// and its end line is written after it has ended: the interval the test
// records holds the run's. The child never returns: the test kills it.
func childMain(raw string) {
	report := os.NewFile(3, "report")
	var cc childConfig
	var mu sync.Mutex // serializes say's writes
	say := func(format string, args ...any) {
		line := fmt.Sprintf(cc.Tag+" "+format, args...)
		line = strings.ReplaceAll(line[:min(len(line), 1000)], "\n", " ") + "\n"
		mu.Lock()
		defer mu.Unlock()
		_, _ = report.WriteString(line)
	}
	fail := func(err error) {
		say("error %v", err)
		os.Exit(1)
	}
	if err := json.Unmarshal([]byte(raw), &cc); err != nil {
		fail(err)
	}
	if cc.Tag == "" {
		cc.Tag = cc.ID
	}
	acks := &childAcks{waiting: map[int]chan struct{}{}}
	go acks.read(os.Stdin) // ends with the process
	run := func(name string) {
		seq, ack := acks.add()
		say("begin %s %d", name, seq)
		<-ack
	}
	cfg := &rest.Config{Host: cc.Host, BearerToken: cc.Token, TLSClientConfig: rest.TLSClientConfig{CAFile: cc.CAFile}, QPS: 1000, Burst: 1000}
	namespace := replicaNamespace
	if cc.InCluster {
		var err error
		if cfg, err = rest.InClusterConfig(); err != nil {
			fail(err)
		}
		cfg.QPS, cfg.Burst = 1000, 1000
		ns, err := os.ReadFile(serviceAccountDir + "/namespace")
		if err != nil {
			fail(err)
		}
		namespace = strings.TrimSpace(string(ns))
	}
	log := logrus.New() // to stderr, which the test shows when it fails
	log.SetLevel(logrus.WarnLevel)
	opts := ha.Options{Prefix: cc.Group, ID: cc.ID, TTL: replicaTTL, Settle: 500 * time.Millisecond, Logger: log}
	if cc.Leader {
		opts.Mode = ha.Leader
	}
	r, err := ha.New(Store(cfg, namespace, StoreOptions{Buckets: 16}), opts)
	if err != nil {
		fail(err)
	}
	go func() { // ends with the process
		for ev := range r.Events(context.Background()) {
			if ev.Kind == ha.FencePassed {
				say("fence %v", ev.Err)
			}
		}
	}()
	var leases coordinationv1client.LeaseInterface
	if cc.Fenced {
		cl, err := coordinationv1client.NewForConfig(cfg)
		if err != nil {
			fail(err)
		}
		leases = cl.Leases(replicaNamespace)
	}
	for _, name := range cc.Names {
		p := controller.ControllerParams{
			DoFunc: func(ctx context.Context) error {
				run(name)
				<-ctx.Done()
				say("end %s", name)
				return nil
			},
			StopFunc: func(context.Context) error {
				run(name)
				time.Sleep(5 * time.Millisecond) // a StopFunc's work, not an ordering
				say("end %s", name)
				return nil
			},
			RunInterval:            5 * time.Millisecond,
			ErrorRetryBaseDuration: 10 * time.Millisecond,
		}
		if cc.Fenced {
			p.StopFunc = nil
			p.DoFunc = func(ctx context.Context) error {
				claim, _ := ha.ClaimFrom(ctx)
				say("claim %s %d", name, claim.Token)
				for { // never looks at ctx: code that was frozen goes on where it stopped
					time.Sleep(20 * time.Millisecond)
					say("write %s", fencedWrite(leases, dataLease(cc.Group), cc.Tag, claim))
				}
			}
		}
		if err := r.UpdateController(name, p); err != nil {
			fail(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := r.Join(ctx); err != nil {
		fail(err)
	}
	say("joined")
	select {}
}

// fencedWrite is the fenced write DESIGN.md describes for a DoFunc on
// Kubernetes, on a Lease of the user's own: it reads the Lease, refuses
// when claim's token is below the highest one written for the name, and
// otherwise records the token and the write in an update guarded by the
// resourceVersion it read, which fails if anyone wrote in between. It
// returns the outcome as a report line.
func fencedWrite(leases coordinationv1client.LeaseInterface, lease, id string, claim ha.Claim) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	l, err := leases.Get(ctx, lease, metav1.GetOptions{})
	if err != nil {
		return "error " + err.Error()
	}
	key := markAnnotation + claim.Name
	mark, _ := strconv.ParseInt(l.Annotations[key], 10, 64)
	if claim.Token < mark {
		return fmt.Sprintf("refused %d %d", claim.Token, mark)
	}
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	l.Annotations[key] = strconv.FormatInt(claim.Token, 10)
	writes := append(strings.Fields(l.Annotations[writesAnnotation]), fmt.Sprintf("%s:%d", id, claim.Token))
	l.Annotations[writesAnnotation] = strings.Join(writes[max(0, len(writes)-keptWrites):], " ")
	switch _, err := leases.Update(ctx, l, metav1.UpdateOptions{}); {
	case apierrors.IsConflict(err):
		return "conflict"
	case err != nil:
		return "error " + err.Error()
	}
	return fmt.Sprintf("ok %d", claim.Token)
}

// childAcks are the runs of a child waiting for the test's answer, by
// sequence number. Guarded by mu.
type childAcks struct {
	mu      sync.Mutex
	next    int
	waiting map[int]chan struct{}
}

// add returns the next sequence number and the channel its answer closes.
func (a *childAcks) add() (int, chan struct{}) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.next++
	ch := make(chan struct{})
	a.waiting[a.next] = ch
	return a.next, ch
}

// read closes the channel of each sequence number the test answers on in.
func (a *childAcks) read(in io.Reader) {
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		seq, err := strconv.Atoi(sc.Text())
		if err != nil {
			continue
		}
		a.mu.Lock()
		if ch, ok := a.waiting[seq]; ok {
			close(ch)
			delete(a.waiting, seq)
		}
		a.mu.Unlock()
	}
}

// procReplicas is a group of replicas in child processes, the runs they
// report (an overlap recorder as the in-process replicas'), and their
// other report lines.
type procReplicas struct {
	t       *testing.T
	c       *cluster
	group   string
	names   []string
	runs    *runs
	reportW *os.File            // the report pipe's write end, each child's descriptor 3; closed by the cleanup
	lines   chan string         // the report lines other than begin and end, in order; closed by the reader
	seen    []string            // the lines the test took from lines, for the failure message; the test's goroutine only
	reading sync.WaitGroup      // the reader; joined by the cleanup
	mu      sync.Mutex          // serializes the reader's handling of a line with reap
	kids    map[string]*kid     // guarded by mu
	running map[string][]string // guarded by mu: the names each live child runs, once per run
}

// kid is one child process.
type kid struct {
	id     string
	cmd    *exec.Cmd
	proxy  *blackHole     // between the child and the API server
	stdin  io.WriteCloser // the answers to its begin lines; written by the reader, closed by Wait
	log    bytes.Buffer   // its stderr; read after exited is closed
	exited chan struct{}  // closed once Wait returned, by the goroutine start starts
	dead   bool           // guarded by procReplicas.mu: reaped; its lines are ignored
}

// newProcReplicas makes a group with names names and starts reading the
// report pipe. When the test ends it kills every child, and fails the
// test if any two runs of a name overlapped.
func newProcReplicas(t *testing.T, names ...string) *procReplicas {
	c := needCluster(t)
	applyManifest(t, c)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &procReplicas{t: t, c: c, group: "p" + strings.ToLower(rand.Text()[:10]), names: names, runs: newRuns(),
		reportW: w, lines: make(chan string, 1<<16), kids: map[string]*kid{}, running: map[string][]string{}}
	p.reading.Add(1)
	go p.read(r) // joined by the cleanup
	t.Cleanup(func() {
		for _, k := range p.kids {
			_ = k.cmd.Process.Signal(syscall.SIGKILL)
			<-k.exited
			if t.Failed() {
				t.Logf("child %s logged:\n%s", k.id, k.log.String())
			}
		}
		w.Close() // with every child gone, the reader sees the end
		p.reading.Wait()
		r.Close()
		if t.Failed() {
			t.Logf("the children reported:\n%s", strings.Join(p.seen, "\n"))
		}
		p.runs.mu.Lock()
		defer p.runs.mu.Unlock()
		if p.runs.overlaps != 0 {
			t.Errorf("%d starts while another run of the name was in progress; want none", p.runs.overlaps)
		}
		err := c.admin.CoordinationV1().Leases(replicaNamespace).DeleteCollection(context.Background(),
			metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: groupLabel + "=" + p.group})
		if err != nil {
			t.Errorf("deleting group %s: %v", p.group, err)
		}
	})
	return p
}

// read handles the report lines until every write end is closed: it
// records a begin and answers it, records an end, and passes the others
// on to lines.
func (p *procReplicas) read(r io.Reader) {
	defer p.reading.Done()
	defer close(p.lines)
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 3 && (f[1] == "begin" || f[1] == "end") {
			p.handleRun(f)
			continue
		}
		p.lines <- sc.Text()
	}
}

// handleRun records the begin or end line f of a live child.
func (p *procReplicas) handleRun(f []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	k := p.kids[f[0]]
	if k == nil || k.dead {
		// A begin the test reads only after reaping the child was never
		// answered: the run never started. An end was recorded by reap.
		return
	}
	id, name := f[0], f[2]
	if f[1] == "end" {
		if i := slices.Index(p.running[id], name); i >= 0 {
			p.runs.finish(name)
			p.running[id] = slices.Delete(p.running[id], i, i+1)
		}
		return
	}
	p.runs.begin(id, name)
	p.running[id] = append(p.running[id], name)
	if len(f) == 4 {
		_, _ = io.WriteString(k.stdin, f[3]+"\n") // a child stopped meanwhile answers nothing more
	}
}

// start starts child id as a replica of the group, through a proxy of its
// own.
func (p *procReplicas) start(id string, leader, fenced bool) {
	p.t.Helper()
	p.startAs(id, id, leader, fenced)
}

// startAs starts child tag as replica id of the group, through a proxy
// of its own: a tag of its own lets the test start a second run of an
// ID (a restart) and tell its lines from the first's.
func (p *procReplicas) startAs(tag, id string, leader, fenced bool) {
	p.t.Helper()
	k := &kid{id: tag, proxy: newBlackHole(p.t, strings.TrimPrefix(p.c.api.url, "https://")), exited: make(chan struct{})}
	k.cmd = exec.Command(os.Args[0], "-test.run=^$")
	p.run(k, childConfig{
		Host: "https://" + k.proxy.addr(), Token: p.c.api.replicaToken, CAFile: p.c.api.caFile,
		Group: p.group, ID: id, Tag: tag, Names: p.names, Leader: leader, Fenced: fenced,
	})
}

// serviceAccountDir is where rest.InClusterConfig reads a Pod's
// ServiceAccount token and CA, and where a Pod finds its namespace.
const serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// startInCluster starts child id as a replica of the group that runs as
// in a Pod: in a mount namespace of its own, where root is mounted on
// /run (the target of /var/run), so that root's
// secrets/kubernetes.io/serviceaccount is serviceAccountDir, and with the
// environment the kubelet gives a Pod for the API server's Service, here
// the server itself. It needs root, and unshare and mount on PATH.
func (p *procReplicas) startInCluster(id, root string) {
	p.t.Helper()
	host, port, ok := strings.Cut(strings.TrimPrefix(p.c.api.url, "https://"), ":")
	if !ok {
		p.t.Fatalf("no port in %s", p.c.api.url)
	}
	if out, err := exec.Command("unshare", "--mount", "--propagation", "private", "--", "true").CombinedOutput(); err != nil {
		p.t.Fatalf("a process as in a Pod needs a mount namespace of its own (root, and unshare on PATH): %v: %s", err, out)
	}
	k := &kid{id: id, exited: make(chan struct{})}
	k.cmd = exec.Command("unshare", "--mount", "--propagation", "private", "--",
		"sh", "-c", `mount --bind "$0" /run && exec "$@"`, root, os.Args[0], "-test.run=^$")
	k.cmd.Env = append(os.Environ(), "KUBERNETES_SERVICE_HOST="+host, "KUBERNETES_SERVICE_PORT="+port)
	p.run(k, childConfig{Group: p.group, ID: id, Names: p.names, InCluster: true})
}

// run starts k's command, made by the caller, as child k.id (cc.Tag, or
// cc.ID when it has no tag).
func (p *procReplicas) run(k *kid, cc childConfig) {
	p.t.Helper()
	raw, err := json.Marshal(cc)
	if err != nil {
		p.t.Fatal(err)
	}
	if k.cmd.Env == nil {
		k.cmd.Env = os.Environ()
	}
	k.cmd.Env = append(k.cmd.Env, childEnv+"="+string(raw))
	k.cmd.ExtraFiles = []*os.File{p.reportW}
	k.cmd.Stderr = &k.log
	if k.stdin, err = k.cmd.StdinPipe(); err != nil {
		p.t.Fatal(err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := k.cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	p.kids[k.id] = k
	go func() { // joined by reap or the cleanup, through exited
		_ = k.cmd.Wait()
		close(k.exited)
	}()
}

// kill kills child id with SIGKILL and returns once it is gone, its runs
// recorded as ended then.
func (p *procReplicas) kill(id string) {
	p.t.Helper()
	k := p.kids[id]
	if err := k.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		p.t.Fatal(err)
	}
	<-k.exited
	p.mu.Lock()
	defer p.mu.Unlock()
	k.dead = true
	for _, name := range p.running[id] {
		p.runs.finish(name)
	}
	delete(p.running, id)
}

// signal sends sig to child id.
func (p *procReplicas) signal(id string, sig syscall.Signal) {
	p.t.Helper()
	if err := p.kids[id].cmd.Process.Signal(sig); err != nil {
		p.t.Fatal(err)
	}
}

// expect returns the next report line that starts with prefix, within
// limit; a child's error line fails the test.
func (p *procReplicas) expect(prefix string, limit time.Duration) string {
	p.t.Helper()
	deadline := time.After(limit)
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				p.t.Fatalf("the report pipe ended before a line %q", prefix)
			}
			p.seen = append(p.seen, l)
			if f := strings.Fields(l); len(f) > 1 && f[1] == "error" {
				p.t.Fatalf("child: %s", l)
			}
			if strings.HasPrefix(l, prefix) {
				return l
			}
		case <-deadline:
			p.t.Fatalf("no line %q within %v", prefix, limit)
		}
	}
}

// startThreeProcesses starts replicas a, b and c in processes of their
// own on a group of 30 names, and waits until each name runs on one of
// them; it returns the group, the names, and those c runs, of which it
// fails the test if there are none.
func startThreeProcesses(t *testing.T) (p *procReplicas, names, held []string) {
	t.Helper()
	for i := range 30 {
		names = append(names, fmt.Sprintf("name-%03d", i))
	}
	p = newProcReplicas(t, names...)
	for _, id := range []string{"a", "b", "c"} {
		p.start(id, false, false)
	}
	took, where := p.runs.waitPlaced(t, names, "three processes placing", 60*time.Second, "a", "b", "c")
	for n, id := range where {
		if id == "c" {
			held = append(held, n)
		}
	}
	t.Logf("placed in %v; c runs %d names", took, len(held))
	if len(held) == 0 {
		t.Fatalf("c runs none of %d names (%v); want a share to kill it with", len(names), where)
	}
	return p, names, held
}

// A replica process killed with SIGKILL while it runs names never ends its
// session: the others start its names once their observers count the
// session ended, not before. Then one is partitioned by its proxy: its
// fence stops its names before the last one starts them. No name runs
// twice at once across the processes.
func TestReplicaProcessesOnKubernetesKilledAndPartitioned(t *testing.T) {
	t.Parallel() // each in a group of its own; their waits overlap
	p, names, held := startThreeProcesses(t)

	p.kill("c")
	killed := time.Now()
	p.runs.waitPlaced(t, names, "after c was killed", replicaTTL+20*time.Second, "a", "b")
	first, ok := p.runs.firstStartSince(held, killed)
	if !ok {
		t.Fatal("c's names run elsewhere, yet none started after the kill")
	}
	t.Logf("c's names start elsewhere %v after SIGKILL, all run there %v after it (D = %v)",
		first.Sub(killed).Round(time.Millisecond), time.Since(killed).Round(time.Millisecond), replicaTTL)
	if since := first.Sub(killed); since < replicaTTL-time.Second {
		t.Errorf("one of c's names started elsewhere %v after SIGKILL, before c's session of %v could have ended", since, replicaTTL)
	}

	_, where := p.runs.waitPlaced(t, names, "a and b", 10*time.Second, "a", "b")
	held = held[:0]
	for n, id := range where {
		if id == "b" {
			held = append(held, n)
		}
	}
	p.kids["b"].proxy.cut()
	cut := time.Now()
	p.runs.waitPlaced(t, names, "after b was cut off", replicaTTL+20*time.Second, "a")
	if first, ok = p.runs.firstStartSince(held, cut); !ok {
		t.Fatal("b's names run on a, yet none started after the cut")
	}
	t.Logf("b cut off: its names start on a %v later (D = %v)", first.Sub(cut).Round(time.Millisecond), replicaTTL)
	if since := first.Sub(cut); since < replicaTTL-time.Second {
		t.Errorf("one of b's names started on a %v after the cut, before b's session of %v could have ended", since, replicaTTL)
	}
}

// A replica process stopped with SIGSTOP while it holds a name loses it to
// another once its session is seen to have ended; resumed, its DoFunc,
// which never looks at its context, goes on writing, and the fenced write
// refuses it: the data Lease never shows its write after the new
// holder's.
func TestPausedReplicaProcessOnKubernetesCannotWriteThroughItsOldClaim(t *testing.T) {
	t.Parallel() // each in a group of its own; their waits overlap
	p, aToken := startFencedHolder(t)
	p.start("b", true, true)
	p.expect("b joined", 60*time.Second) // a member that waits: a is the oldest, the leader

	p.signal("a", syscall.SIGSTOP)
	stopped := time.Now()
	bToken := p.claimOf("b", replicaTTL+20*time.Second)
	took := time.Since(stopped)
	p.expect("b write ok", 10*time.Second)
	t.Logf("b took job over %v after a's SIGSTOP (D = %v); tokens a %d, b %d", took.Round(time.Millisecond), replicaTTL, aToken, bToken)
	if took < replicaTTL-time.Second {
		t.Errorf("b started job %v after a's SIGSTOP, before a's session of %v could have ended", took, replicaTTL)
	}
	p.resumeRefused("b", aToken, bToken)
}

// startFencedHolder starts fenced replica a in Leader mode in a process
// of its own, on a group of the one name "job" with its data Lease
// (makeData), and waits until a claimed job and wrote; it returns the
// group and a's token.
func startFencedHolder(t *testing.T) (*procReplicas, int64) {
	t.Helper()
	p := newProcReplicas(t, "job")
	p.makeData()
	p.start("a", true, true)
	token := p.claimOf("a", 60*time.Second)
	p.expect("a write ok", 10*time.Second)
	return p, token
}

// claimOf returns the token of child tag's claim of job, which it
// reports within limit.
func (p *procReplicas) claimOf(tag string, limit time.Duration) int64 {
	p.t.Helper()
	var token int64
	if _, err := fmt.Sscanf(p.expect(tag+" claim job", limit), tag+" claim job %d", &token); err != nil {
		p.t.Fatal(err)
	}
	return token
}

// makeData creates the group's data Lease (dataLease), which the fenced
// DoFuncs write; the test's cleanup deletes it.
func (p *procReplicas) makeData() {
	p.t.Helper()
	leases := p.c.admin.CoordinationV1().Leases(replicaNamespace)
	data := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: dataLease(p.group), Namespace: replicaNamespace}}
	if _, err := leases.Create(p.t.Context(), data, metav1.CreateOptions{}); err != nil {
		p.t.Fatal(err)
	}
	p.t.Cleanup(func() { _ = leases.Delete(context.Background(), data.Name, metav1.DeleteOptions{}) })
}

// resumeRefused checks that child tag took job from the frozen a with a
// larger token (token, after a's old), resumes a, and checks that a's
// next fenced write is refused and the group's data Lease shows no
// other child's write after tag's first, job's mark tag's token.
func (p *procReplicas) resumeRefused(tag string, old, token int64) {
	p.t.Helper()
	if token <= old {
		p.t.Errorf("%s holds job with token %d after a's %d; want it to grow", tag, token, old)
	}
	p.signal("a", syscall.SIGCONT)
	p.expect(fmt.Sprintf("a write refused %d %d", old, token), 10*time.Second)
	l, err := p.c.admin.CoordinationV1().Leases(replicaNamespace).Get(p.t.Context(), dataLease(p.group), metav1.GetOptions{})
	if err != nil {
		p.t.Fatal(err)
	}
	writes := strings.Fields(l.Annotations[writesAnnotation])
	first := slices.IndexFunc(writes, func(w string) bool { return strings.HasPrefix(w, tag+":") })
	if first < 0 {
		p.t.Fatalf("the data Lease shows no write of %s: %v", tag, writes)
	}
	for _, w := range writes[first:] {
		if !strings.HasPrefix(w, tag+":") {
			p.t.Errorf("the data Lease shows %s after %s's first write: %v", w, tag, writes)
		}
	}
	if got := l.Annotations[markAnnotation+"job"]; got != strconv.FormatInt(token, 10) {
		p.t.Errorf("job's mark is %s, want %s's token %d", got, tag, token)
	}
}
