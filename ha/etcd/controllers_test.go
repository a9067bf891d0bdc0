// Tests of Controllers: the same registering code on a Manager (Local) and
// on a Replica, and the Manager each gives the core's handlers.

package etcd

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bgctl/controller"
	"github.com/bgctl/controller/ha"
	"github.com/bgctl/controller/ha/internal/probe"
)

// registerJob is service code written once against Controllers: it
// registers one controller and counts its runs.
func registerJob(c ha.Controllers, runs *atomic.Int64) error {
	return c.UpdateController("job", controller.ControllerParams{
		DoFunc: func(context.Context) error { runs.Add(1); return nil },
	})
}

// The same code registers, triggers, serves and removes a controller on
// either side of the interface, and both refuse the same bad calls.
func TestControllersOnAManagerAndOnAReplica(t *testing.T) {
	c := newCluster(t, 0, testOptions())
	n := c.join("solo")
	m := controller.NewManager(controller.WithMetrics(nil))
	defer m.RemoveAllAndWait()
	for _, tc := range []struct {
		name string
		c    ha.Controllers
	}{
		{"Local", ha.Local(m)},
		{"Replica", n.r},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var runs atomic.Int64
			if err := registerJob(tc.c, &runs); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the first run", func() bool { return runs.Load() >= 1 && tc.c.Running("job") })
			if !tc.c.TriggerController("job") {
				t.Error("TriggerController of a running name reported none")
			}
			waitFor(t, "the triggered run", func() bool { return runs.Load() >= 2 })
			if tc.c.Running("other") || tc.c.TriggerController("other") {
				t.Error("a name never registered runs")
			}
			if err := tc.c.UpdateController("", controller.ControllerParams{DoFunc: controller.NoopFunc}); err == nil || !strings.Contains(err.Error(), "empty controller name") {
				t.Errorf("an empty name: %v", err)
			}
			if err := tc.c.RemoveController("other"); !errors.Is(err, controller.ErrControllerNotFound) {
				t.Errorf("RemoveController of an unknown name: %v", err)
			}

			// The Manager serves the core's handlers.
			srv := httptest.NewServer(controller.StatusHandler(tc.c.Manager()))
			defer srv.Close()
			res, err := http.Get(srv.URL + "?format=text")
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if !strings.Contains(string(body), "job") || !strings.Contains(string(body), "1/1 healthy") {
				t.Errorf("the status handler of its Manager: %s", body)
			}
			if ms := tc.c.GetStatusModel(); len(ms) != 1 || ms[0].Name != "job" {
				t.Errorf("GetStatusModel: %+v", ms)
			}

			if err := tc.c.RemoveControllerAndWait("job"); err != nil {
				t.Fatal(err)
			}
			if tc.c.Running("job") || len(tc.c.Manager().GetStatusModel()) != 0 {
				t.Error("the name runs after RemoveControllerAndWait")
			}
		})
	}
}

// A Manager shut down refuses registrations with an error, as a Replica
// that left does, where the Manager alone returns a nil *Controller.
func TestLocalRefusesAfterShutdown(t *testing.T) {
	m := controller.NewManager(controller.WithMetrics(nil), controller.WithLogger(quietLogger()))
	if err := m.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	err := ha.Local(m).UpdateController("late", controller.ControllerParams{DoFunc: controller.NoopFunc})
	if !errors.Is(err, controller.ErrManagerShutDown) || !strings.Contains(err.Error(), `"late"`) {
		t.Errorf("UpdateController after Shutdown: %v, want an error naming the controller and wrapping ErrManagerShutDown", err)
	}
	if ha.Local(nil).Manager() == nil {
		t.Error("Local(nil) has no Manager")
	}
}

// registration counts the DoFunc runs and StopFunc calls of one
// registration of a name.
type registration struct{ runs, stops atomic.Int64 }

func (g *registration) params() controller.ControllerParams {
	return controller.ControllerParams{
		DoFunc:   func(ctx context.Context) error { g.runs.Add(1); <-ctx.Done(); return nil },
		StopFunc: func(context.Context) error { g.stops.Add(1); return nil },
	}
}

// A name removed and registered again at once behaves alike on a Manager
// and on a Replica: RemoveControllerAndWait returns once the removed
// controller has terminated, its StopFunc included, and the new
// registration runs as a new controller. On a Replica the second call may
// come before its loop handled the removal ("loop late": both calls under
// the replica's lock, as when the loop is slow).
func TestRemoveThenRegisterAgain(t *testing.T) {
	c := newCluster(t, 0, testOptions())
	n := c.join("solo")
	m := controller.NewManager(controller.WithMetrics(nil), controller.WithLogger(quietLogger()))
	defer m.RemoveAllAndWait()
	type removeAndRegister func(name string, p controller.ControllerParams) (waited <-chan error)
	// public removes with RemoveControllerAndWait and, once the name is
	// unregistered (registered tells), registers it again.
	public := func(cs ha.Controllers, registered func(string) bool) removeAndRegister {
		return func(name string, p controller.ControllerParams) <-chan error {
			waited := make(chan error, 1)
			go func() { waited <- cs.RemoveControllerAndWait(name) }() // joined by the test through waited
			waitFor(t, "the removal", func() bool { return !registered(name) })
			if err := cs.UpdateController(name, p); err != nil {
				t.Fatal(err)
			}
			return waited
		}
	}
	registeredOn := func(r *ha.Replica) func(string) bool {
		return func(name string) bool { return probe.Registered(r, name) }
	}
	loopLate := func(name string, p controller.ControllerParams) <-chan error {
		wait, err := probe.ReplaceLate(n.r, name, p)
		if err != nil {
			t.Fatal(err)
		}
		waited := make(chan error, 1)
		go func() { wait(); waited <- nil }() // joined by the test through waited
		return waited
	}
	for _, tc := range []struct {
		name   string
		c      ha.Controllers
		remove removeAndRegister
	}{
		{"Local", ha.Local(m), public(ha.Local(m), func(name string) bool { return m.Lookup(name) != nil })},
		{"Replica", n.r, public(n.r, registeredOn(n.r))},
		{"Replica, loop late", n.r, loopLate},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const name = "again"
			var first, second registration
			if err := tc.c.UpdateController(name, first.params()); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the first registration's run", func() bool { return first.runs.Load() >= 1 && tc.c.Running(name) })
			old := tc.c.Manager().Lookup(name)
			waited := tc.remove(name, second.params())
			select {
			case err := <-waited:
				if err != nil {
					t.Fatalf("RemoveControllerAndWait: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("RemoveControllerAndWait still waits 10s after the name was removed and registered again")
			}
			if got := first.stops.Load(); got != 1 {
				t.Errorf("the removed controller's StopFunc ran %d times when RemoveControllerAndWait returned, want 1", got)
			}
			waitFor(t, "the new registration's run", func() bool { return second.runs.Load() >= 1 && tc.c.Running(name) })
			if now := tc.c.Manager().Lookup(name); now == old {
				t.Error("the new registration runs in the removed controller, updated, not in a new one")
			}
			if err := tc.c.RemoveControllerAndWait(name); err != nil {
				t.Fatal(err)
			}
			if first.stops.Load() != 1 || second.stops.Load() != 1 {
				t.Errorf("StopFuncs: %d of the first registration, %d of the second; want 1 each", first.stops.Load(), second.stops.Load())
			}
		})
	}
}
