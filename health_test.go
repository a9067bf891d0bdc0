// Tests of the one meaning of healthy, as every output shows it.

package controller

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Healthy means one thing everywhere: neither failing nor stuck. In
// handlerScene, at the same instant, "ok" is healthy, "failing" fails and
// "hung" is stuck (its DoFunc outlasted its RunTimeout): the text, the
// HTML page, the JSON, Health, HealthHandler and the metrics all count 1
// of 3 healthy, and their failing-only views all list the same two.
func TestHealthyHasOneMeaning(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, release := handlerScene(t)
		h := StatusHandler(e.m)
		unhealthy := []string{"failing", "hung"}

		text := body(t, serve(h, http.MethodGet, "/", "text/plain"))
		assert.True(t, strings.HasPrefix(text, "Controller Status: 1/3 healthy\n"), "text:\n%s", text)
		var buf strings.Builder
		require.NoError(t, FormatStatus(&buf, e.m.GetStatusModel(), false))
		assert.Equal(t, unhealthy, tableNames(buf.String()), "FormatStatus(all=false):\n%s", buf.String())
		failingText := body(t, serve(h, http.MethodGet, "/?failing=1", "text/plain"))
		failingText, _, _ = strings.Cut(failingText, "\n\nStopping:")
		assert.Equal(t, unhealthy, tableNames(failingText), "text with failing=1:\n%s", failingText)

		_, summary := parsePage(t, body(t, serve(h, http.MethodGet, "/", "text/html")))
		assert.True(t, strings.HasPrefix(summary, "1/3 healthy, 1 failing, 1 stuck"), summary)

		var statuses []struct {
			Name   string
			Status map[string]any
		}
		require.NoError(t, json.Unmarshal([]byte(body(t, serve(h, http.MethodGet, "/?format=json&failing=1", ""))), &statuses))
		var names []string
		for _, s := range statuses {
			if s.Status["removed-timestamp"] == nil {
				names = append(names, s.Name)
			}
			assert.Equal(t, s.Name == "hung", s.Status["stuck"] == true, "%s: the JSON says whether it is stuck: %v", s.Name, s.Status)
		}
		assert.Equal(t, unhealthy, names, "JSON with failing=1")

		health := e.m.Health()
		require.Error(t, health)
		assert.Len(t, health.(interface{ Unwrap() []error }).Unwrap(), 2, "Health: %v", health)
		healthz := body(t, serve(HealthHandler(e.m), http.MethodGet, "/healthz", ""))
		for _, name := range unhealthy {
			assert.Contains(t, healthz, `controller "`+name+`"`, "/healthz")
		}
		assert.NotContains(t, healthz, `controller "ok"`, "/healthz")

		families, err := e.reg.Gather()
		require.NoError(t, err)
		gauges := map[string]float64{}
		for _, f := range families {
			if len(f.GetMetric()) == 1 && f.GetMetric()[0].GetGauge() != nil {
				gauges[f.GetName()] = f.GetMetric()[0].GetGauge().GetValue()
			}
		}
		assert.Equal(t, 2.0, gauges["controllers_unhealthy"], "controllers_unhealthy, of %v", gauges)
		assert.Equal(t, 1.0, gauges["controllers_failing"], "controllers_failing counts the failing ones alone, as Cilium's does")

		release()
		e.m.RemoveAllAndWait()
	})
}

// tableNames returns the first column of FormatStatus's table in text.
func tableNames(text string) []string {
	var names []string
	for i, line := range strings.Split(strings.TrimSpace(text), "\n") {
		if i >= 2 { // the summary, then the header
			names = append(names, strings.Fields(line)[0])
		}
	}
	return names
}

// Health has one line per controller, whatever its error: the lines of a
// multi-line error (an errors.Join) are joined with "; ", as FormatStatus
// joins them, and the error is still wrapped. One failure reads "1
// consecutive failure", in Health and in the log.
func TestHealthOneLinePerController(t *testing.T) {
	forEachSink(t, func(t *testing.T, sink string) {
		synctest.Test(t, func(t *testing.T) {
			e := newEnvOn(t, sink)
			first, second := errors.New("first"), errors.New("second\n\twith detail")
			var joinedRuns atomic.Int32
			e.m.UpdateController("joined", ControllerParams{DoFunc: func(context.Context) error {
				if joinedRuns.Add(1) > 1 {
					return nil
				}
				return errors.Join(first, second)
			}})
			e.m.UpdateController("once", ControllerParams{DoFunc: func(context.Context) error { return errBoom }, MaxRetries: 1})
			synctest.Wait()

			want := "controller \"joined\": 1 consecutive failure: first; second;  with detail\n" +
				"controller \"once\": 1 consecutive failure: boom\n"
			resp := serve(HealthHandler(e.m), http.MethodGet, "/healthz", "")
			assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
			assert.Equal(t, want, body(t, resp))
			err := e.m.Health()
			assert.Equal(t, want, err.Error()+"\n")
			assert.ErrorIs(t, err, second, "the error is still wrapped")

			time.Sleep(time.Second) // joined's retry succeeds
			synctest.Wait()
			assert.Equal(t, []string{
				"giving up retrying after 1 failure; next run on an update, a trigger or the RunInterval",
				"recovered after 1 consecutive failure",
			}, e.logs(logrus.InfoLevel))
			e.m.RemoveAllAndWait()
		})
	})
}

// /healthz has one line per controller, also for a controller that is
// failing and stuck at once (its retry hangs past its RunTimeout); the
// line says both, and the error wraps both.
func TestHealthzOneLineForAControllerFailingAndStuck(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		release := make(chan struct{})
		calls := 0
		e.m.UpdateController("c", ControllerParams{RunTimeout: time.Second, DoFunc: func(context.Context) error {
			if calls++; calls == 1 {
				return errBoom
			}
			<-release // ignores its context
			return nil
		}})
		time.Sleep(time.Second + 2*time.Second) // the retry at 1s has run 2s, over its 1s RunTimeout
		resp := serve(HealthHandler(e.m), http.MethodGet, "/", "")
		b := body(t, resp)
		assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
		assert.Equal(t, 1, strings.Count(b, "\n"), "one line for controller c:\n%s", b)
		assert.Contains(t, b, "1 consecutive failure: boom; run stuck: DoFunc has run for 2s, over its RunTimeout of 1s")
		err := e.m.Health()
		assert.ErrorIs(t, err, errBoom)
		assert.ErrorIs(t, err, ErrRunStuck)
		close(release)
		e.m.RemoveAllAndWait()
	})
}
