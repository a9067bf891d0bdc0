// The view's watch against a real etcd: a watch that lags more than
// etcd's catch-up batch behind restarts nothing, a stalled one is
// replaced (its feed failing with ha.ErrFeedSilent), a quiet one is kept.

package etcd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bgctl/controller/ha"
	"github.com/bgctl/controller/ha/internal/probe"
	"github.com/sirupsen/logrus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// writeNoise writes, through the etcd at addrs, n revisions of keys under prefix that are neither
// members nor claims (named after batch), from writers parallel enough to
// make a watch on a held connection fall behind by all of them. Each
// value is 512 bytes, so a hundred or so fill the flow-control window of
// a held watch stream.
func writeNoise(addrs []string, prefix, batch string, n int) error {
	cli, err := clientv3.New(clientv3.Config{Endpoints: addrs, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer cli.Close()
	const writers = 16
	val := strings.Repeat("n", 512)
	errs := make(chan error, writers)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() { // joined below
			defer wg.Done()
			for i := w; i < n; i += writers {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				_, err := cli.Put(ctx, fmt.Sprintf("%s/noise/%s%d", prefix, batch, i), val)
				cancel()
				if err != nil {
					errs <- fmt.Errorf("writing noise under %s: %w", prefix, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs // nil when none failed
}

// writeNoiseBehind starts writeNoise on a goroutine, and returns a
// function that waits for it and fails the test if it failed.
func writeNoiseBehind(t testing.TB, addrs []string, prefix, batch string, n int) (wait func()) {
	done := make(chan error, 1)
	go func() { done <- writeNoise(addrs, prefix, batch, n) }() // joined by wait
	return func() {
		t.Helper()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

// countWarnings gives opts the tests' quiet logger, with a counter of the
// warnings that start with prefix, and returns the counter.
func countWarnings(opts *ha.Options, prefix string) *warnCounter {
	l := quietLogger().(*logrus.Logger)
	w := &warnCounter{prefix: prefix}
	l.AddHook(w)
	opts.Logger = l
	return w
}

// A replica whose watch is held while the leader leaves, 4,500
// revisions are written under the prefix and a new member joins, gets
// the leader's departure first, takes every name over, and then gets
// etcd's catch-up batches: at most 1,000 revisions each, each carrying
// the store's current revision, which is past the claims the replica has
// just created. The batch with the join makes it look at every name: no
// claim it holds may look deleted because a batch's header ran ahead of
// its events.
func TestLaggingWatchRestartsNothing(t *testing.T) {
	opts := testOptions()
	opts.Mode = ha.Leader
	// A fence window of 22.5s outlasts the cut even on a loaded machine
	// (12s seen): the lagging replica keeps its lease, and with it the
	// watch that lags.
	opts.TTL, opts.Margin = 30*time.Second, 7500*time.Millisecond
	lost := countWarnings(&opts, "claim deleted under a running controller")
	c := newCluster(t, 20, opts)
	c.join("r1") // the oldest: it runs everything
	c.join("r0")
	// A lone member's share is everything: expected([]string{id}).
	everything := func(id string) map[string]string { return c.expected([]string{id}) }
	c.waitPlacement(everything("r1"), 10*time.Second)
	r0 := c.nodes["r0"]

	cutAt := time.Now()
	r0.proxy.cut()
	c.leave(c.nodes["r1"]) // r0 learns it first once healed
	if err := writeNoise(c.etcdAddrs(), c.prefix, "a", 1500); err != nil {
		t.Fatal(err)
	}
	c.join("r2") // younger than r0: it takes nothing, but r0 looks at every name when it sees it
	if err := writeNoise(c.etcdAddrs(), c.prefix, "b", 3000); err != nil {
		t.Fatal(err)
	}
	// Writes go on while r0 catches up, so the batches' revision keeps
	// running ahead of their events, past the claims r0 creates.
	more := writeNoiseBehind(t, c.etcdAddrs(), c.prefix, "c", 4000)
	healAt := c.rec.Now()
	r0.proxy.heal()
	t.Logf("r0 cut for %v while r1 left, r2 joined and 4,500 revisions were written (fences passed in this binary: %d)", time.Since(cutAt), fencesPassed.n.Load())
	more()
	c.waitPlacement(everything("r0"), 10*time.Second)
	time.Sleep(3 * time.Second) // the window in which false losses showed: the catch-up and what it set off

	starts := 0
	for _, runs := range c.rec.Runs() {
		for _, run := range runs {
			if run.Replica == "r0" && run.Start >= healAt {
				starts++
			}
		}
	}
	t.Logf("since the heal: %d DoFunc starts and StopFunc calls on r0, %d claims seen as lost", starts, lost.n.Load())
	if n := lost.n.Load(); n != 0 {
		t.Errorf("%d running names were released as lost while the lagging watch caught up; want 0", n)
	}
	if starts != len(c.names) {
		t.Errorf("r0 started or stopped names %d times after the heal; want %d (each name started once)", starts, len(c.names))
	}
	if n := c.rec.RanOn("r2"); n != 0 {
		t.Errorf("r2 ran names %d times; in Leader mode the younger member runs nothing", n)
	}
	c.rec.AssertNoOverlap(t)
}

// A watch that stops delivering while its connection goes on answering
// (lease keepalives, requests, gRPC pings) is noticed: its progress
// requests go unanswered, and the replica lists the prefix again and
// watches it anew, so its view catches up and the names move.
func TestStalledWatchIsReplaced(t *testing.T) {
	c := newCluster(t, 12, testOptions())
	st := newWatchStaller(t, testEtcd)
	r0 := c.joinVia("r0", st.addr())
	c.register(r0)
	c.join("r1")
	c.waitPlacement(c.expected([]string{"r0", "r1"}), 10*time.Second)

	st.stall()
	c.leave(c.nodes["r1"]) // r0 learns it only from a watch that works
	took := c.waitPlacement(c.expected([]string{"r0"}), 15*time.Second)
	limit := probe.Window(c.opts) + probe.RenewEvery(c.opts)
	t.Logf("r0's watch held; r1 left; r0 ran r1's names %v later (a silent watch is replaced after %v to %v); %d frames held",
		took, probe.Window(c.opts), limit, st.heldFrames())
	if st.heldFrames() == 0 {
		t.Error("the staller held no frame: r0's watch never stalled, and this test showed nothing")
	}
	if got := r0.r.Status().Members; len(got) != 1 || got[0].ID != "r0" {
		t.Errorf("r0's view of the members is %v, want [r0]", got)
	}
	c.rec.AssertNoOverlap(t)
}

// A feed whose watch says nothing, not even an answer to its progress
// requests, gives up after BackendConfig.Window with an error that wraps
// ha.ErrFeedSilent: ha's loop lists again at once on that error alone,
// and after its retry pause on any other (the feed has waited long
// already).
func TestSilentFeedFailsWithErrFeedSilent(t *testing.T) {
	needEtcd(t)
	st := newWatchStaller(t, testEtcd)
	cli := newClient(t, st.addr())
	defer cli.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const window = 1500 * time.Millisecond
	prefix := fmt.Sprintf("/test/silentfeed/%d", time.Now().UnixNano())
	b := newEtcdBackend(cli, ha.BackendConfig{Group: prefix, ID: "r0", RequestTimeout: 2 * time.Second,
		RenewEvery: window / 4, Window: window, Logger: slog.New(slog.DiscardHandler), Stopping: ctx})
	_, at, err := b.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	f := b.Watch(at, &wg)
	defer func() { f.Stop(); wg.Wait() }()
	// A write the feed delivers shows its watch open, and so held by the
	// stall that follows.
	put, err := cli.Put(ctx, prefix+"/noise/0", "x")
	if err != nil {
		t.Fatal(err)
	}
	for heard := false; !heard; {
		select {
		case fb := <-f.Batches():
			if fb.Err != nil {
				t.Fatalf("the feed failed before the stall: %v", fb.Err)
			}
			heard = fb.At >= put.Header.Revision
		case <-time.After(10 * time.Second):
			t.Fatal("the feed delivered no batch of the write within 10s")
		}
	}
	st.stall()
	stalled := time.Now()
	for {
		select {
		case fb := <-f.Batches():
			if fb.Err == nil {
				continue // sent before the stall took hold
			}
			took := time.Since(stalled)
			t.Logf("the feed failed %v after the stall (window %v): %v", took, window, fb.Err)
			if !errors.Is(fb.Err, ha.ErrFeedSilent) {
				t.Errorf("a silent feed failed with %v, want an error that wraps ha.ErrFeedSilent", fb.Err)
			}
			if took < window-window/4 {
				t.Errorf("the feed gave up %v after the stall, before its window (%v) could pass", took, window)
			}
			return
		case <-time.After(window + 10*time.Second):
			t.Fatalf("the feed did not fail within %v of the stall", window+10*time.Second)
		}
	}
}

func TestCheckWatch(t *testing.T) {
	const period, limit = 1875 * time.Millisecond, 7500 * time.Millisecond
	for _, tc := range []struct {
		silent time.Duration
		want   watchAction
	}{
		{0, keepWatch},
		{period/2 - time.Millisecond, keepWatch},
		{period / 2, askProgress}, // a quiet watch is asked at every check
		{period, askProgress},
		{limit - time.Millisecond, askProgress},
		{limit, replaceWatch}, // four checks without an answer
		{10 * limit, replaceWatch},
	} {
		if got := checkWatch(tc.silent, period, limit); got != tc.want {
			t.Errorf("checkWatch(%v, %v, %v) = %d, want %d", tc.silent, period, limit, got, tc.want)
		}
	}
}

// A watch on a store that does not move has nothing to deliver; it still
// answers the progress requests, and is never taken for a stalled one.
func TestQuietWatchIsKept(t *testing.T) {
	opts := testOptions()
	replaced := countWarnings(&opts, "watch of the prefix silent")
	c := newCluster(t, 0, opts)
	r0 := c.joinEmpty("r0")
	time.Sleep(3 * probe.Window(opts)) // two replacements, were the answers missing
	if n := replaced.n.Load(); n != 0 {
		t.Errorf("a quiet watch was replaced %d times in %v", n, 3*probe.Window(opts))
	}
	c.joinEmpty("r1")
	deadline := time.Now().Add(5 * time.Second)
	for len(r0.r.Status().Members) != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("r0's view of the members is %v 5s after r1 joined", r0.r.Status().Members)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
