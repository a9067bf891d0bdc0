// A real paused process: a replica in a child process is stopped with
// SIGSTOP while it holds a name, another replica takes the name over, and
// the child's writes guarded by its claim are refused once it resumes.

package etcd

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bgctl/controller"
	"github.com/bgctl/controller/ha"
	"github.com/sirupsen/logrus"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The child's environment: the etcd address, the prefix, and the
// replica's ID ("paused" when unset). TestMain runs pausedChild instead of
// the tests when the address is set.
const (
	childEtcdEnv   = "HA_TEST_CHILD_ETCD"
	childPrefixEnv = "HA_TEST_CHILD_PREFIX"
	childIDEnv     = "HA_TEST_CHILD_ID"
)

// pausedChild joins as replica id in Leader mode and runs "job", whose
// DoFunc writes <prefix>/data guarded by its claim every 20ms and prints
// each outcome. It never looks at its context: the model of code that
// was frozen and goes on where it stopped. It prints "joined" once Join
// returned, within 60s (a restart under the ID of a run that crashed
// waits in Join for that run's session to end).
func pausedChild(addr, prefix, id string) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{addr}, DialTimeout: 5 * time.Second})
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	if id == "" {
		id = "paused"
	}
	opts := testOptions()
	opts.Prefix, opts.ID, opts.Mode = prefix, id, ha.Leader
	logger := logrus.New() // to stderr, which the test shows when it fails
	opts.Logger = logger
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	r, err := ha.Join(ctx, Store(cli), opts)
	cancel()
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	fmt.Println("joined")
	_ = r.UpdateController("job", controller.ControllerParams{DoFunc: func(ctx context.Context) error {
		claim, _ := ha.ClaimFrom(ctx)
		fmt.Println("claim", claim.Revision)
		for {
			time.Sleep(20 * time.Millisecond)
			wctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			resp, err := cli.Txn(wctx).If(Held(claim)).Then(clientv3.OpPut(prefix+"/data", "from "+id+" "+strconv.FormatInt(claim.Revision, 10))).Commit()
			cancel()
			switch {
			case err != nil:
				fmt.Println("write error", err)
			case resp.Succeeded:
				fmt.Println("write ok at revision", resp.Header.Revision)
			default:
				fmt.Println("write refused")
			}
		}
	}})
	select {} // until the test kills the process
}

// child is a replica process that pausedChild runs, and the lines it
// prints. Used by the test's goroutine alone.
type child struct {
	t     *testing.T
	cmd   *exec.Cmd
	log   bytes.Buffer // the child's logs; read after Wait
	lines chan string  // what it prints, closed by the reader once Wait closed the pipe
	seen  []string     // the lines expect took, for the failure message
	gone  bool         // waited for
}

// startChild starts replica id of the group under prefix in a process
// of its own (pausedChild); the test's cleanup kills it.
func startChild(t *testing.T, prefix, id string) *child {
	t.Helper()
	c := &child{t: t, cmd: exec.Command(os.Args[0], "-test.run=^$"), lines: make(chan string, 1024)}
	c.cmd.Env = append(os.Environ(), childEtcdEnv+"="+testEtcd, childPrefixEnv+"="+prefix, childIDEnv+"="+id)
	c.cmd.Stderr = &c.log
	out, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { // joined by kill, through lines, once Wait closed the pipe
		defer close(c.lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
	}()
	t.Cleanup(func() {
		c.kill()
		if t.Failed() {
			t.Logf("the child %s printed:\n%s\nand logged:\n%s", id, strings.Join(c.seen, "\n"), c.log.String())
		}
	})
	return c
}

// kill kills the child with SIGKILL (which ends a stopped process too)
// and waits for it and its reader.
func (c *child) kill() {
	if c.gone {
		return
	}
	c.gone = true
	_ = c.cmd.Process.Kill()
	_ = c.cmd.Wait()
	for l := range c.lines {
		c.seen = append(c.seen, "(unread) "+l)
	}
}

// signal sends sig to the child.
func (c *child) signal(sig syscall.Signal) {
	c.t.Helper()
	if err := c.cmd.Process.Signal(sig); err != nil {
		c.t.Fatal(err)
	}
}

// expect returns the child's next line that starts with prefix, within
// within; a line "error …" fails the test.
func (c *child) expect(prefix string, within time.Duration) string {
	c.t.Helper()
	deadline := time.After(within)
	for {
		select {
		case l, ok := <-c.lines:
			if !ok {
				c.t.Fatalf("the child ended before printing %q", prefix)
			}
			c.seen = append(c.seen, l)
			if strings.HasPrefix(l, prefix) {
				return l
			}
			if strings.HasPrefix(l, "error") {
				c.t.Fatalf("child: %s", l)
			}
		case <-deadline:
			c.t.Fatalf("the child printed no %q within %v", prefix, within)
		}
	}
}

// awaitRefused waits until a write of the child, resumed after another
// holder claimed its name at revision claimed, is refused: it goes on
// writing when it wakes, and etcd must refuse it. Lines from before the
// stop may still be in the pipe, and a request sent just before it may
// be answered after: a write that went through did so at a revision
// before the other's claim.
func (c *child) awaitRefused(claimed int64) {
	c.t.Helper()
	for {
		l := c.expect("write", 10*time.Second)
		if l == "write refused" {
			return
		}
		var rev int64
		if _, err := fmt.Sscanf(l, "write ok at revision %d", &rev); err != nil {
			c.t.Fatalf("child: %q", l)
		}
		if rev >= claimed {
			c.t.Fatalf("the child wrote at revision %d, after another claimed the name at %d", rev, claimed)
		}
	}
}

func TestPausedProcessCannotWriteThroughItsOldClaim(t *testing.T) {
	c := newCluster(t, 0, testOptions())
	child := startChild(t, c.prefix, "paused")
	expect := child.expect
	expect("claim", 10*time.Second)
	expect("write ok", 5*time.Second)

	opts := c.opts
	opts.Mode = ha.Leader
	c.opts = opts
	b := c.joinEmpty("b")
	bWrote := make(chan int64, 1) // the revision of b's claim; 0: the write failed
	err := b.r.UpdateController("job", controller.ControllerParams{DoFunc: func(ctx context.Context) error {
		claim, _ := ha.ClaimFrom(ctx)
		wctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := b.cli.Txn(wctx).If(Held(claim)).Then(clientv3.OpPut(c.prefix+"/data", "from b")).Commit()
		if err != nil || !resp.Succeeded {
			claim.Revision = 0
		}
		bWrote <- claim.Revision
		<-ctx.Done()
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // b is a member and waits: the child is the leader

	child.signal(syscall.SIGSTOP)
	stopped := time.Now()
	var bRev int64
	select {
	case bRev = <-bWrote:
		if bRev == 0 {
			t.Fatal("b's fenced write failed")
		}
	case <-time.After(c.opts.TTL + 5*time.Second):
		t.Fatal("b never took the name over from the stopped child")
	}
	t.Logf("b took over %v after SIGSTOP", time.Since(stopped).Round(time.Millisecond))
	child.signal(syscall.SIGCONT)
	child.awaitRefused(bRev)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	got, err := b.cli.Get(ctx, c.prefix+"/data")
	if err != nil || len(got.Kvs) != 1 || string(got.Kvs[0].Value) != "from b" {
		t.Fatalf("data = %v (err %v), want b's write", got.Kvs, err)
	}
}
