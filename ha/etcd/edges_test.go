// Replicas at the edges, against etcd: user code that uses all of its
// Margin, a DoFunc that waits on another name, StopFuncs that ignore
// their context, and a member key deleted under a live lease.

package etcd

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bgctl/controller"
	"github.com/bgctl/controller/ha"
	"github.com/bgctl/controller/ha/internal/place"
	"github.com/bgctl/controller/ha/internal/probe"
	"github.com/bgctl/controller/ha/internal/runlog"
	"github.com/sirupsen/logrus"
)

// slowParams are a recorder's params whose DoFunc and StopFunc each go on
// for most of Margin (0.9 ×) after their cancellation: the contract allows
// it, so the next holder must not start before they returned. With
// ignoreCtx the StopFunc takes five Margins instead, whatever its context
// says.
func slowParams(rec *runlog.Recorder, replica, name string, margin time.Duration, ignoreCtx bool) controller.ControllerParams {
	p := lingeringParams(rec, replica, name, margin*9/10)
	if ignoreCtx {
		p.StopFunc = func(context.Context) error {
			i := rec.Begin(replica, name)
			time.Sleep(5 * margin)
			rec.Finish(name, i)
			return nil
		}
	}
	return p
}

// lingeringParams are a recorder's params whose DoFunc goes on for lingers
// after its cancellation, and whose StopFunc works as long.
func lingeringParams(rec *runlog.Recorder, replica, name string, lingers time.Duration) controller.ControllerParams {
	return controller.ControllerParams{
		DoFunc: func(ctx context.Context) error {
			i := rec.Begin(replica, name)
			<-ctx.Done()
			time.Sleep(lingers) // work past the cancellation, within the contract
			rec.Finish(name, i)
			return nil
		},
		StopFunc: func(context.Context) error {
			i := rec.Begin(replica, name)
			time.Sleep(lingers) // a StopFunc's work; its cancellation comes at the earliest at its start
			rec.Finish(name, i)
			return nil
		},
		RunInterval:            5 * time.Millisecond,
		ErrorRetryBaseDuration: 10 * time.Millisecond,
	}
}

// A DoFunc that returns 0.9 × Margin after the fence passed, followed by a
// StopFunc that takes as long again (or ignores its context) must not
// overlap the next holder: a replica runs no StopFunc once its fence has
// passed, as after a crash.
func TestStopFuncAfterAFencePassNeverOverlapsTheNextHolder(t *testing.T) {
	for _, tc := range []struct {
		name      string
		ignoreCtx bool
	}{{"StopFunc uses its Margin", false}, {"StopFunc ignores its context", true}} {
		t.Run(tc.name, func(t *testing.T) {
			for run := range 3 {
				opts := testOptions()
				opts.Mode = ha.Leader
				c := newCluster(t, 0, opts)
				a := c.joinEmpty("a")
				if err := a.r.UpdateController("job", slowParams(c.rec, "a", "job", opts.Margin, tc.ignoreCtx)); err != nil {
					t.Fatal(err)
				}
				c.waitPlacement(map[string]string{"job": "a"}, 10*time.Second)
				b := c.joinEmpty("b")
				if err := b.r.UpdateController("job", slowParams(c.rec, "b", "job", opts.Margin, tc.ignoreCtx)); err != nil {
					t.Fatal(err)
				}
				a.proxy.cut()
				c.waitPlacement(map[string]string{"job": "b"}, opts.TTL+10*time.Second)
				time.Sleep(5 * opts.Margin) // let a StopFunc that ignores its context end, to be recorded
				c.rec.AssertNoOverlap(t)
				if t.Failed() {
					t.Fatalf("run %d overlapped", run)
				}
				a.proxy.heal()
				for _, n := range c.nodes {
					// A StopFunc that ignores its context may outlive
					// Close's bound: Close then says so, which is not
					// what this test is about.
					term := probe.Inner(n.r).TerminationChannel("job")
					n.cli.Close()
					_ = n.r.Close()
					<-term // the StopFunc Close gave up on
					n.proxy.close()
					delete(c.nodes, n.id)
				}
			}
		})
	}
}

// Once its fence has passed, a replica calls no StopFunc: the next holder
// may start Margin after the fence, and the DoFunc may take that Margin.
// A StopFunc already running when the fence passes is cancelled with
// ErrFencePassed.
func TestNoStopFuncStartsAfterTheFencePassed(t *testing.T) {
	c := newCluster(t, 0, testOptions())
	n := c.join("solo")
	var stopCalls atomic.Int32
	running := make(chan struct{}, 1)
	err := n.r.UpdateController("job", controller.ControllerParams{
		DoFunc: func(ctx context.Context) error {
			select {
			case running <- struct{}{}:
			default:
			}
			<-ctx.Done()
			return nil
		},
		StopFunc: func(ctx context.Context) error {
			stopCalls.Add(1)
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	<-running
	n.proxy.cut()
	waitFor(t, "the fence to pass", func() bool { return n.r.Status().Lease == "" })
	// endEpoch has removed the controller; wait for it to terminate.
	select {
	case <-probe.Inner(n.r).TerminationChannel("job"):
	case <-time.After(10 * time.Second):
		t.Fatal("the controller did not terminate after the fence passed")
	}
	if got := stopCalls.Load(); got != 0 {
		t.Errorf("StopFunc called %d times after the fence passed, want 0", got)
	}
	n.proxy.heal()
}

// A DoFunc that waits in RemoveControllerAndWait for another name, whose
// StopFunc waits for its context, when the fence passes: the replica must
// not deadlock; once etcd answers again it holds a lease and runs the
// DoFunc's name again, and Close returns.
func TestDoFuncWaitingOnAnotherNameDoesNotHangAFencePass(t *testing.T) {
	opts := testOptions()
	c := newCluster(t, 0, opts)
	n := c.join("solo")
	r := n.r
	var aRuns atomic.Int32
	bStopping := make(chan struct{})
	var removeOnce sync.Once
	err := r.UpdateController("b", controller.ControllerParams{
		DoFunc: func(context.Context) error { return nil },
		StopFunc: func(ctx context.Context) error {
			close(bStopping)
			<-ctx.Done()
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b to run", func() bool { return probe.Inner(r).Lookup("b") != nil })
	err = r.UpdateController("a", controller.ControllerParams{
		DoFunc: func(ctx context.Context) error {
			aRuns.Add(1)
			var err error
			removeOnce.Do(func() { err = r.RemoveControllerAndWait("b") })
			return err
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	<-bStopping // a's DoFunc waits for b's StopFunc, which waits for the fence
	n.proxy.cut()
	waitFor(t, "the fence to pass", func() bool { return r.Status().Lease == "" })
	n.proxy.heal()
	healed := time.Now()
	deadline := healed.Add(3*opts.TTL + 5*time.Second)
	for r.Status().Lease == "" || aRuns.Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("%v after the heal: lease %q, a ran %d times; the replica hangs", time.Since(healed), r.Status().Lease, aRuns.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	closed := make(chan error, 1)
	go func() { closed <- r.Close() }() // joined below
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("Close: %v", err)
		}
	case <-time.After(opts.TTL + 5*time.Second):
		t.Fatal("Close hangs")
	}
	delete(c.nodes, n.id)
	n.cli.Close()
}

// Close gives up every name within TTL of being called, whatever a
// StopFunc does: it stops renewing the lease at once, so the names move
// to another replica when the lease expires, and it returns by then with
// an error naming the controller still stopping.
func TestCloseGivesUpEveryNameWithinTTLWhateverAStopFuncDoes(t *testing.T) {
	opts := testOptions()
	opts.Mode = ha.Leader
	c := newCluster(t, 3, opts)
	a := c.join("a")
	unblock := make(chan struct{})
	defer close(unblock)
	err := a.r.UpdateController("stuck", controller.ControllerParams{
		DoFunc:   func(context.Context) error { return nil },
		StopFunc: func(context.Context) error { <-unblock; return nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "stuck to run", func() bool { return probe.Inner(a.r).Lookup("stuck") != nil })
	c.waitPlacement(c.expected([]string{"a"}), 10*time.Second)
	b := c.join("b")

	called := time.Now()
	closed := make(chan error, 1)
	go func() { closed <- a.r.Close() }() // joined below, or after unblock
	select {
	case err := <-closed:
		took := time.Since(called)
		t.Logf("Close returned after %v: %v", took, err)
		if err == nil {
			t.Error("Close returned nil with a StopFunc still running")
		}
		if took > opts.TTL+time.Second {
			t.Errorf("Close took %v, more than TTL (%v)", took, opts.TTL)
		}
	case <-time.After(opts.TTL + 5*time.Second):
		t.Errorf("Close still blocked %v after it was called", time.Since(called))
		unblock <- struct{}{}
		<-closed
	}
	moved := c.waitPlacement(c.expected([]string{"b"}), opts.TTL+10*time.Second)
	if since := time.Since(called); since > opts.TTL+3*time.Second {
		t.Errorf("the names moved %v after Close was called (%v after it returned), want within TTL + the expiry sweep", since, moved)
	}
	c.rec.AssertNoOverlap(t)
	delete(c.nodes, "a")
	a.cli.Close()
	_ = b
}

// A replica whose member key was deleted under its live lease (an
// operator, a guarded move that lost a race) writes it again, and goes on
// running its names: it must not drop out of its own view for good.
func TestLostMemberKeyIsWrittenAgain(t *testing.T) {
	c := newCluster(t, 3, testOptions())
	n := c.join("solo")
	c.waitPlacement(c.expected([]string{"solo"}), 10*time.Second)
	key := c.prefix + "/members/solo"
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := n.cli.Delete(ctx, key); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the member key to be written again", func() bool {
		got, err := n.cli.Get(ctx, key)
		if err != nil || len(got.Kvs) != 1 {
			return false
		}
		return got.Kvs[0].Lease == probe.Session(n.r)
	})
	waitFor(t, "the replica to see itself again", func() bool {
		st := n.r.Status()
		return len(st.Members) == 1 && st.Members[0].ID == "solo"
	})
	c.waitPlacement(c.expected([]string{"solo"}), 10*time.Second)
	c.rec.AssertNoOverlap(t)
}

// releaseCounter counts the "released" lines a replica logs for each name.
type releaseCounter struct {
	mu sync.Mutex
	n  map[string]int // guarded by mu
}

func (rc *releaseCounter) Levels() []logrus.Level { return []logrus.Level{logrus.InfoLevel} }

func (rc *releaseCounter) Fire(e *logrus.Entry) error {
	if strings.HasPrefix(e.Message, "released") {
		rc.mu.Lock()
		defer rc.mu.Unlock()
		rc.n[fmt.Sprint(e.Data["name"])]++
	}
	return nil
}

// A name released here is released once: the claim the worker deleted
// leaves the view with the answer, so that the loop does not take it,
// until the watch brings the deletion, for a stray claim of its lease and
// release it a second time (an etcd transaction per release, and a page
// that shows the name held by a non-owner meanwhile).
func TestAReleaseDeletesTheClaimOnce(t *testing.T) {
	opts := testOptions()
	rc := &releaseCounter{n: map[string]int{}}
	l := logrus.New()
	l.SetOutput(io.Discard)
	l.AddHook(rc)
	opts.Logger = l
	c := newCluster(t, 40, opts)
	a := c.join("a")
	c.waitPlacement(c.expected([]string{"a"}), 10*time.Second)
	c.join("b")
	want := c.expected([]string{"a", "b"})
	c.waitPlacement(want, 10*time.Second)
	moved := place.On(want, "b")
	// Wait until a's view has lost every claim it released: by then any
	// second release has been started, and answered.
	waitFor(t, "a's view to lose the claims it released", func() bool {
		for _, name := range moved {
			if holder, slot := probe.Holding(a.r, name); holder == "a" || slot {
				return false
			}
		}
		return true
	})
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for _, name := range moved {
		if got := rc.n[name]; got != 1 {
			t.Errorf("%s released %d times, want 1", name, got)
		}
	}
}
