// Tests of the fence alone, in a synctest bubble, and of what its passing
// does to a replica's controllers, against etcd.

package ha

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/bgctl/controller"
)

func TestFenceMovesOnlyForward(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		f := newFence(start.Add(100 * time.Millisecond))
		defer f.stop(ErrClosed)
		if !f.extend(start.Add(300 * time.Millisecond)) {
			t.Fatal("extend of an open fence reported it passed")
		}
		f.extend(start.Add(200 * time.Millisecond)) // earlier: ignored
		time.Sleep(299 * time.Millisecond)
		synctest.Wait()
		if !f.open() || f.ctx.Err() != nil {
			t.Fatalf("fence passed before its deadline, at %v", time.Since(start))
		}
		if got := f.remaining(); got != time.Millisecond {
			t.Errorf("remaining = %v, want 1ms", got)
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if f.open() || !errors.Is(context.Cause(f.ctx), ErrFencePassed) {
			t.Fatalf("fence open at its deadline; cause %v", context.Cause(f.ctx))
		}
		if f.extend(time.Now().Add(time.Hour)) {
			t.Error("a passed fence was extended")
		}
		if f.open() || f.remaining() != 0 {
			t.Error("a passed fence reopened")
		}
	})
}

func TestFenceExpireHasACause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFence(time.Now().Add(time.Hour))
		defer f.stop(ErrClosed)
		f.expire(errLeaseLost)
		if !errors.Is(context.Cause(f.ctx), errLeaseLost) || f.open() {
			t.Errorf("after expire: open %v, cause %v", f.open(), context.Cause(f.ctx))
		}
	})
}

// A partitioned replica cancels the context of a running DoFunc, and of a
// StopFunc that started before the fence passed, with ErrFencePassed,
// before the lease can expire on the server.
func TestFenceCancelsDoFuncAndStopFunc(t *testing.T) {
	c := newCluster(t, 0, testOptions())
	n := c.join("solo")
	doCause, stopCause := make(chan error, 1), make(chan error, 1)
	running, stopping := make(chan struct{}), make(chan struct{})
	err := n.r.UpdateController("runs", controller.ControllerParams{
		DoFunc: func(ctx context.Context) error {
			select {
			case running <- struct{}{}:
			default:
			}
			<-ctx.Done()
			select {
			case doCause <- context.Cause(ctx):
			default:
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	err = n.r.UpdateController("stops", controller.ControllerParams{
		DoFunc: func(context.Context) error { return nil },
		StopFunc: func(ctx context.Context) error {
			close(stopping)
			<-ctx.Done()
			stopCause <- context.Cause(ctx)
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	<-running
	waitFor(t, "stops to run", func() bool { return n.r.inner.Lookup("stops") != nil })
	if err := n.r.RemoveController("stops"); err != nil {
		t.Fatal(err)
	}
	<-stopping
	cut := time.Now()
	n.proxy.cut()
	for name, ch := range map[string]chan error{"DoFunc": doCause, "StopFunc": stopCause} {
		select {
		case cause := <-ch:
			if !errors.Is(cause, ErrFencePassed) {
				t.Errorf("%s's context ended with cause %v, want ErrFencePassed", name, cause)
			}
		case <-time.After(c.opts.TTL + 5*time.Second):
			t.Fatalf("%s's context was not cancelled", name)
		}
	}
	// The fence passes at most TTL − Margin after the cut (it counts from
	// the last renewal sent, which came before); the slack for delivering
	// the cancellation is Margin, so a cancellation as late as the lease
	// could expire fails.
	took := time.Since(cut)
	t.Logf("both contexts cancelled %v after the cut; the fence allows %v", took, c.opts.TTL-c.opts.Margin)
	if took >= c.opts.TTL {
		t.Errorf("stopped %v after the cut, not before the lease's TTL (%v)", took, c.opts.TTL)
	}
	n.proxy.heal()
}
