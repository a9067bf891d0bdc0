// Tests of Controllers: the same registering code on a Manager (Local) and
// on a Replica, and the Manager each gives the core's handlers.

package ha

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/bgctl/controller"
)

// registerJob is service code written once against Controllers: it
// registers one controller and counts its runs.
func registerJob(c Controllers, runs *atomic.Int64) error {
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
		c    Controllers
	}{
		{"Local", Local(m)},
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
	err := Local(m).UpdateController("late", controller.ControllerParams{DoFunc: controller.NoopFunc})
	if !errors.Is(err, controller.ErrManagerShutDown) || !strings.Contains(err.Error(), `"late"`) {
		t.Errorf("UpdateController after Shutdown: %v, want an error naming the controller and wrapping ErrManagerShutDown", err)
	}
	if Local(nil).Manager() == nil {
		t.Error("Local(nil) has no Manager")
	}
}
