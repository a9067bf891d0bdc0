// What a fence pass does to a replica's controllers, against etcd (the
// fence alone is tested in package ha, in a synctest bubble).

package etcd

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/bgctl/controller"
	"github.com/bgctl/controller/ha"
	"github.com/bgctl/controller/ha/internal/probe"
)

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
	waitFor(t, "stops to run", func() bool { return probe.Inner(n.r).Lookup("stops") != nil })
	if err := n.r.RemoveController("stops"); err != nil {
		t.Fatal(err)
	}
	<-stopping
	cut := time.Now()
	n.proxy.cut()
	for name, ch := range map[string]chan error{"DoFunc": doCause, "StopFunc": stopCause} {
		select {
		case cause := <-ch:
			if !errors.Is(cause, ha.ErrFencePassed) {
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
