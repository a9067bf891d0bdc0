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
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bgctl/controller"
	"github.com/bgctl/controller/ha"
	"github.com/sirupsen/logrus"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The child's environment: the etcd address and the prefix. TestMain runs
// pausedChild instead of the tests when they are set.
const (
	childEtcdEnv   = "HA_TEST_CHILD_ETCD"
	childPrefixEnv = "HA_TEST_CHILD_PREFIX"
)

// pausedChild joins as the oldest replica in Leader mode and runs "job",
// whose DoFunc writes <prefix>/data guarded by its claim every 20ms and
// prints each outcome. It never looks at its context: the model of code
// that was frozen and goes on where it stopped.
func pausedChild(addr, prefix string) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{addr}, DialTimeout: 5 * time.Second})
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	opts := testOptions()
	opts.Prefix, opts.ID, opts.Mode = prefix, "paused", ha.Leader
	logger := logrus.New() // to stderr, which the test shows when it fails
	opts.Logger = logger
	r, err := ha.Join(context.Background(), Store(cli), opts)
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	_ = r.UpdateController("job", controller.ControllerParams{DoFunc: func(ctx context.Context) error {
		claim, _ := ha.ClaimFrom(ctx)
		fmt.Println("claim", claim.Revision)
		for {
			time.Sleep(20 * time.Millisecond)
			wctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			resp, err := cli.Txn(wctx).If(Held(claim)).Then(clientv3.OpPut(prefix+"/data", "from the child")).Commit()
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

func TestPausedProcessCannotWriteThroughItsOldClaim(t *testing.T) {
	c := newCluster(t, 0, testOptions())
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), childEtcdEnv+"="+testEtcd, childPrefixEnv+"="+c.prefix)
	var childLog bytes.Buffer // the child's logs; read after Wait
	child.Stderr = &childLog
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	var seen []string // the child's lines, for the failure message
	lines := make(chan string, 1024)
	defer func() {
		_ = child.Process.Kill()
		_ = child.Wait()
		for l := range lines { // joins the reader: Wait closed the pipe
			seen = append(seen, "(unread) "+l)
		}
		if t.Failed() {
			t.Logf("the child printed:\n%s\nand logged:\n%s", strings.Join(seen, "\n"), childLog.String())
		}
	}()
	go func() { // joined by the deferred drain of lines, once Wait closed the pipe
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	expect := func(prefix string, within time.Duration) string {
		t.Helper()
		deadline := time.After(within)
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatalf("the child ended before printing %q", prefix)
				}
				seen = append(seen, l)
				if strings.HasPrefix(l, prefix) {
					return l
				}
				if strings.HasPrefix(l, "error") {
					t.Fatalf("child: %s", l)
				}
			case <-deadline:
				t.Fatalf("the child printed no %q within %v", prefix, within)
			}
		}
	}
	expect("claim", 10*time.Second)
	expect("write ok", 5*time.Second)

	opts := c.opts
	opts.Mode = ha.Leader
	c.opts = opts
	b := c.joinEmpty("b")
	bWrote := make(chan int64, 1) // the revision of b's claim; 0: the write failed
	err = b.r.UpdateController("job", controller.ControllerParams{DoFunc: func(ctx context.Context) error {
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

	if err := child.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
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
	if err := child.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	// The child goes on writing when it wakes: etcd must refuse it. Lines
	// from before the stop may still be in the pipe, and a request sent
	// just before it may be answered after: a write that went through did
	// so at a revision before b's claim.
	for {
		l := expect("write", 10*time.Second)
		if l == "write refused" {
			break
		}
		var rev int64
		if _, err := fmt.Sscanf(l, "write ok at revision %d", &rev); err != nil {
			t.Fatalf("child: %q", l)
		}
		if rev >= bRev {
			t.Fatalf("the child wrote at revision %d, after b claimed the name at %d", rev, bRev)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	got, err := b.cli.Get(ctx, c.prefix+"/data")
	if err != nil || len(got.Kvs) != 1 || string(got.Kvs[0].Value) != "from b" {
		t.Fatalf("data = %v (err %v), want b's write", got.Kvs, err)
	}
}
