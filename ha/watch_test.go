// The view's watch against a real etcd: a watch that lags more than
// etcd's catch-up batch behind restarts nothing.
package ha

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
)

// writeNoise writes n revisions of keys under prefix that are neither
// members nor claims (named after batch), from writers parallel enough to make a watch on a
// held connection fall behind by all of them. Each value is 512 bytes, so
// a hundred or so fill the flow-control window of a held watch stream.
func writeNoise(t testing.TB, prefix, batch string, n int) {
	t.Helper()
	cli := newClient(t, testEtcd)
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
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("writing noise under %s: %v", prefix, err)
	}
}

// countingLogger returns the tests' quiet logger with a counter of the
// warnings that start with prefix.
func countingLogger(prefix string) (logrus.FieldLogger, *warnCounter) {
	l := quietLogger().(*logrus.Logger)
	w := &warnCounter{prefix: prefix}
	l.AddHook(w)
	return l, w
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
	opts.Mode = Leader
	// A fence window of 22.5s outlasts the cut even on a loaded machine
	// (12s seen): the lagging replica keeps its lease, and with it the
	// watch that lags.
	opts.TTL, opts.Margin = 30*time.Second, 7500*time.Millisecond
	logger, lost := countingLogger("claim deleted under a running controller")
	opts.Logger = logger
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
	writeNoise(t, c.prefix, "a", 1500)
	c.join("r2") // younger than r0: it takes nothing, but r0 looks at every name when it sees it
	writeNoise(t, c.prefix, "b", 3000)
	// Writes go on while r0 catches up, so the batches' revision keeps
	// running ahead of their events, past the claims r0 creates.
	more := make(chan struct{})
	go func() { defer close(more); writeNoise(t, c.prefix, "c", 4000) }() // joined below
	healAt := c.rec.now()
	r0.proxy.heal()
	t.Logf("r0 cut for %v while r1 left, r2 joined and 4,500 revisions were written (fences passed in this binary: %d)", time.Since(cutAt), fencesPassed.n.Load())
	<-more
	c.waitPlacement(everything("r0"), 10*time.Second)
	time.Sleep(3 * time.Second) // the window in which false losses showed: the catch-up and what it set off

	starts := 0
	c.rec.mu.Lock()
	for _, runs := range c.rec.runs {
		for _, run := range runs {
			if run.replica == "r0" && run.start >= healAt {
				starts++
			}
		}
	}
	c.rec.mu.Unlock()
	t.Logf("since the heal: %d DoFunc starts and StopFunc calls on r0, %d claims seen as lost", starts, lost.n.Load())
	if n := lost.n.Load(); n != 0 {
		t.Errorf("%d running names were released as lost while the lagging watch caught up; want 0", n)
	}
	if starts != len(c.names) {
		t.Errorf("r0 started or stopped names %d times after the heal; want %d (each name started once)", starts, len(c.names))
	}
	if n := c.rec.ranOn("r2"); n != 0 {
		t.Errorf("r2 ran names %d times; in Leader mode the younger member runs nothing", n)
	}
	c.rec.assertNoOverlap(t)
}
