// The view's watch against etcd: what a replaced or cancelled watch leaves
// behind in the client, and what a watch restarted at the listed revision
// replays.

package etcd

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/bgctl/controller/ha"
	"github.com/bgctl/controller/ha/internal/probe"
	"github.com/sirupsen/logrus"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// watchStreams counts the etcd client's watch streams in the process:
// the goroutines running (*watchGRPCStream).run, one per gRPC watch
// stream a client keeps open (its children are "created by" it, and do
// not match).
func watchStreams() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	return strings.Count(string(buf), "(*watchGRPCStream).run(")
}

// warnCounters gives opts the tests' quiet logger with one counter per
// prefix of the warnings it counts.
func warnCounters(opts *ha.Options, prefixes ...string) []*warnCounter {
	l := quietLogger().(*logrus.Logger)
	var ws []*warnCounter
	for _, p := range prefixes {
		w := &warnCounter{prefix: p}
		l.AddHook(w)
		ws = append(ws, w)
	}
	opts.Logger = l
	return ws
}

// waitCount waits until w has counted n warnings, and fails the test after
// limit.
func waitCount(t *testing.T, w *warnCounter, n int64, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for w.n.Load() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d warnings %q after %v, want %d", w.n.Load(), w.prefix, limit, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A watch that etcd never confirms (its stream answers nothing, on a
// connection that goes on answering everything else) is replaced every
// TTL − Margin. The watch's code once said a replaced watch "takes its
// stuck stream down with it: the client closes a stream when its last
// watch is cancelled". The client does that only for a watch it has
// registered (an ID from etcd): one cancelled while still being created
// stays in the stream's resuming queue as a nil entry, and the stream's
// goroutines and its gRPC stream live until the client is closed. With a
// stream of its own per watch, each replacement leaves one behind.
func TestReplacedUnconfirmedWatchLeavesNoStream(t *testing.T) {
	opts := testOptions()
	replaced := warnCounters(&opts, "watch of the prefix silent")[0]
	c := newCluster(t, 0, opts)
	st := newWatchStaller(t, testEtcd)
	c.joinVia("r0", st.addr())
	time.Sleep(500 * time.Millisecond) // the watch is created
	before := watchStreams()

	st.stallNew() // every watch from now on waits for its confirmation for ever
	st.stall()    // and the one open now is silent
	const replacements = 4
	waitCount(t, replaced, replacements, 10*probe.Window(c.opts))
	time.Sleep(200 * time.Millisecond) // the last replaced stream, were it to close
	after := watchStreams()
	t.Logf("watch streams in the process: %d before the stall, %d after %d replacements (%d frames held)", before, after, replaced.n.Load(), st.heldFrames())
	// One stream at a time: the one being created now.
	if after > before {
		t.Errorf("%d watch streams after %d replacements, want at most %d: each watch replaced before etcd confirmed it left its stream open", after, replaced.n.Load(), before)
	}
}

// A partition that resets the replica's connection (what the client
// keepalives the docs recommend do to a dead connection) while etcd stays
// unreachable past the fence: the client's watch stream is reconnecting
// when the epoch ends and endEpoch cancels the watch. The client keeps
// such a stream, and reopens it once etcd answers, with no watch on it;
// the replica's next watch has metadata of its own and opens another
// stream. Before the per-watch metadata, the next watch reused the
// stream.
func TestWatchCancelledWhileReconnectingLeavesNoStream(t *testing.T) {
	opts := testOptions()
	c := newCluster(t, 0, opts)
	r0 := c.joinEmpty("r0")
	time.Sleep(500 * time.Millisecond) // the watch is created
	before := watchStreams()

	r0.proxy.cut()
	r0.proxy.reset() // the connection is closed; its successor waits at the cut
	deadline := time.Now().Add(10 * time.Second)
	for r0.r.Status().Lease != "" {
		if time.Now().After(deadline) {
			t.Fatal("r0's fence did not pass within 10s of the cut")
		}
		time.Sleep(10 * time.Millisecond)
	}
	r0.proxy.heal()
	deadline = time.Now().Add(15 * time.Second)
	for r0.r.Status().Lease == "" {
		if time.Now().After(deadline) {
			t.Fatal("r0 did not join again within 15s of the heal")
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(time.Second) // the new epoch's watch is created; the old stream reopened
	after := watchStreams()
	t.Logf("watch streams in the process: %d before the partition, %d after r0 joined again", before, after)
	if after != before {
		t.Errorf("%d watch streams after the partition, want %d: the watch cancelled while its stream reconnected left that stream open", after, before)
	}
}

// waitQuiet waits until etcd's revision has not moved for 3s (the leases
// of earlier tests expired), at most 40s.
func waitQuiet(t *testing.T, cli *clientv3.Client) {
	t.Helper()
	rev := func() int64 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := cli.Get(ctx, "/quiet-probe")
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}
	last, since := rev(), time.Now()
	for deadline := time.Now().Add(40 * time.Second); time.Since(since) < 3*time.Second; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("etcd's revision kept moving for 40s")
		}
		if r := rev(); r != last {
			last, since = r, time.Now()
		}
	}
}

// The relist's watch starts at the listed revision, so the event at that
// revision comes again. When that event is the deletion of the replica's
// own member key (the last write before a stalled watch was replaced),
// the replica writes the key again on the list, and then once more on the
// replayed deletion, and says twice that the key was deleted: one
// deletion, one rewrite.
func TestReplayedMemberDeletionRewritesOnce(t *testing.T) {
	opts := testOptions()
	ws := warnCounters(&opts, "watch of the prefix silent", "member key was deleted under the live lease")
	replaced, rewrote := ws[0], ws[1]
	c := newCluster(t, 0, opts)
	cli := newClient(t, testEtcd)
	defer cli.Close()
	waitQuiet(t, cli) // no other write may come between the deletion and the relist
	st := newWatchStaller(t, testEtcd)
	r0 := c.joinVia("r0", st.addr())
	time.Sleep(500 * time.Millisecond) // the watch is created

	st.stall()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	del, err := cli.Delete(ctx, c.prefix+"/members/r0")
	cancel()
	if err != nil || del.Deleted != 1 {
		t.Fatalf("deleting r0's member key: %v (%d deleted)", err, del.Deleted)
	}
	waitCount(t, replaced, 1, 5*probe.Window(c.opts))
	time.Sleep(time.Second) // the relist, the rewrite, and the replay
	t.Logf("member key deleted at revision %d; %d replacements, %d rewrites; r0's members %v", del.Header.Revision, replaced.n.Load(), rewrote.n.Load(), r0.r.Status().Members)
	if n := rewrote.n.Load(); n != 1 {
		t.Errorf("r0 wrote its member key again %d times for one deletion, want 1", n)
	}
	if got := r0.r.Status().Members; len(got) != 1 || got[0].ID != "r0" {
		t.Errorf("r0's view of the members is %v, want [r0]", got)
	}
}

// A watch of a quiet prefix on a busy etcd (writes elsewhere, compacted
// as they go) has nothing to deliver and must answer its progress
// requests: it is never taken for a stalled one.
func TestQuietWatchOnABusyEtcdIsKept(t *testing.T) {
	opts := testOptions()
	replaced := warnCounters(&opts, "watch of the prefix silent")[0]
	c := newCluster(t, 0, opts)
	c.joinEmpty("r0")
	cli := newClient(t, testEtcd)
	defer cli.Close()
	busyFor := 3 * probe.Window(c.opts)
	stop := time.Now().Add(busyFor)
	writes, compactions := 0, 0
	for time.Now().Before(stop) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := cli.Put(ctx, "/busy-elsewhere/"+c.prefix, strings.Repeat("b", 512))
		if err == nil && writes%200 == 199 {
			_, err = cli.Compact(ctx, resp.Header.Revision)
			compactions++
		}
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		writes++
	}
	t.Logf("%d writes outside the prefix and %d compactions in %v: %d replacements", writes, compactions, busyFor, replaced.n.Load())
	if n := replaced.n.Load(); n != 0 {
		t.Errorf("a quiet watch on a busy etcd was replaced %d times in %v", n, busyFor)
	}
}
