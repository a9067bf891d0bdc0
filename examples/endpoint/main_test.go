package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/bgctl/controller"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func quietLogger() *logrus.Logger {
	l, _ := test.NewNullLogger()
	return l
}

func never(string) bool  { return false }
func always(string) bool { return true }

// failFirst refuses the first n writes of every key.
func failFirst(n int) func(string) bool {
	var mu sync.Mutex
	writes := map[string]int{}
	return func(key string) bool {
		mu.Lock()
		defer mu.Unlock()
		writes[key]++
		return writes[key] <= n
	}
}

// get calls h directly, without a socket, so it works inside a bubble.
func get(h http.Handler, path string) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec
}

// deleteAll deletes every endpoint of a; deferred inside a bubble so no
// controller outlives it.
func deleteAll(t *testing.T, a *agent) {
	t.Helper()
	require.NoError(t, a.shutdown(context.Background()))
}

func TestRunChurnsEndpointsAndExitsAfterTheDuration(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := newKVStore(randomFailures(7, 0.3))
		var out bytes.Buffer
		start := time.Now()
		require.NoError(t, run(t.Context(), &out, withStore(store), withLogger(quietLogger())))
		assert.Equal(t, 10*time.Second, time.Since(start), "the default duration, and a teardown that does not wait on timers")

		text := out.String()
		// Three endpoints at start; at 3s, 6s and 9s the oldest goes and a
		// new one comes.
		for _, line := range []string{
			"created endpoint 1\ncreated endpoint 2\ncreated endpoint 3\n",
			"deleted endpoint 1 (0 controllers left)\ncreated endpoint 4\n",
			"deleted endpoint 2 (0 controllers left)\ncreated endpoint 5\n",
			"deleted endpoint 3 (0 controllers left)\ncreated endpoint 6\n",
		} {
			assert.Contains(t, text, line)
		}
		assert.NotContains(t, text, "endpoint 7")
		// Status at 2s, 4s, 6s, 8s, and at 10s unless the deadline won.
		n := strings.Count(text, "Controller Status: ")
		assert.True(t, n == 4 || n == 5, "status printed %d times", n)
		assert.Contains(t, text, "endpoint-1-sync-to-store")
		after := text[strings.Index(text, "deleted endpoint 1"):]
		assert.NotContains(t, after, "endpoint-1-", "a deleted endpoint's controllers leave the status")

		assert.Empty(t, controller.GetGlobalStatus(), "teardown removes every controller")
		assert.Empty(t, store.Keys(""), "every StopFunc cleaned up its keys")
	})
}

func TestDeletedEndpointLeavesNoControllers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := newKVStore(never)
		a := newAgent(store, controller.WithLogger(quietLogger()), controller.WithMetrics(nil))
		defer deleteAll(t, a)
		for range 3 {
			a.createEndpoint()
		}
		synctest.Wait()
		require.Equal(t, []string{
			"endpoint/1", "endpoint/1/annotation",
			"endpoint/2", "endpoint/2/annotation",
			"endpoint/3", "endpoint/3/annotation",
		}, store.Keys("endpoint/"))
		first := a.snapshot()[0]
		term := first.TerminationChannel("endpoint-1-regenerate")

		ep, err := a.deleteOldest(context.Background())
		require.NoError(t, err)
		require.Same(t, first, ep)

		// No synctest.Wait here: Delete itself waited for the StopFuncs.
		assert.Empty(t, ep.GetStatusModel())
		assert.Nil(t, ep.Lookup("endpoint-1-sync-to-store"))
		assert.Equal(t, []string{"endpoint/2", "endpoint/2/annotation", "endpoint/3", "endpoint/3/annotation"},
			store.Keys("endpoint/"))
		select {
		case <-term:
		default:
			t.Fatal("the regenerate controller of a deleted endpoint has not terminated")
		}
		var names []string
		for _, s := range controller.GetGlobalStatus() {
			names = append(names, s.Name)
		}
		assert.Equal(t, []string{
			"endpoint-2-annotate", "endpoint-2-regenerate", "endpoint-2-sync-to-store",
			"endpoint-3-annotate", "endpoint-3-regenerate", "endpoint-3-sync-to-store",
		}, names)

		// The other endpoints keep running: their revision moves on.
		before, _ := store.Get("endpoint/2")
		time.Sleep(2 * time.Second)
		synctest.Wait()
		now, _ := store.Get("endpoint/2")
		assert.NotEqual(t, before, now)
	})
}

func TestHealthzIs503WithHealthTextUntilTheStoreRecovers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := newKVStore(always)
		a := newAgent(store, controller.WithLogger(quietLogger()), controller.WithMetrics(nil))
		defer deleteAll(t, a)
		h := newHandler(prometheus.NewRegistry())
		a.createEndpoint()
		synctest.Wait()

		rec := get(h, "/healthz")
		assert.Equal(t, http.StatusServiceUnavailable, rec.Code)
		health := a.health()
		require.Error(t, health)
		assert.Equal(t, health.Error()+"\n", rec.Body.String())
		assert.Regexp(t, `^controller "endpoint-1-annotate": 1 consecutive failure: put endpoint/1/annotation: store unavailable
controller "endpoint-1-sync-to-store": \d+ consecutive failures?: put endpoint/1: store unavailable
$`, rec.Body.String())

		store.SetFailures(never)
		time.Sleep(time.Second) // the longest retry wait (MaxRetryInterval)
		synctest.Wait()
		rec = get(h, "/healthz")
		assert.Equal(t, http.StatusOK, rec.Code)
		assert.Equal(t, "ok\n", rec.Body.String())
		_, synced := store.Get("endpoint/1")
		assert.True(t, synced)
	})
}

func TestControllersServesGlobalStatusAsJSON(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newAgent(newKVStore(never), controller.WithLogger(quietLogger()), controller.WithMetrics(nil))
		defer deleteAll(t, a)
		a.createEndpoint()
		a.createEndpoint()
		synctest.Wait()

		rec := get(newHandler(prometheus.NewRegistry()), "/controllers?format=json")
		require.Equal(t, http.StatusOK, rec.Code)
		assert.Equal(t, "application/json", rec.Header().Get("Content-Type"))
		var got controller.ControllerStatuses
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &got))
		assert.Equal(t, controller.GetGlobalStatus(), got)

		var names []string
		for _, s := range got {
			names = append(names, s.Name)
		}
		assert.Equal(t, []string{
			"endpoint-1-annotate", "endpoint-1-regenerate", "endpoint-1-sync-to-store",
			"endpoint-2-annotate", "endpoint-2-regenerate", "endpoint-2-sync-to-store",
		}, names)
		annotate := got[0]
		assert.Equal(t, int64(1), annotate.Status.SuccessCount)
		assert.Equal(t, "annotation applied", annotate.Status.LastFailureMsg)
		sync := got[2]
		assert.Equal(t, controller.Duration(100*time.Millisecond), sync.Configuration.ErrorRetryBase)
		assert.Equal(t, controller.Duration(time.Second), sync.Configuration.MaxRetryInterval)
		assert.Equal(t, "endpoint-sync", sync.Configuration.Group)
	})
}

func TestMetricsAreNamespacedLabelledAndLintClean(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg := prometheus.NewPedanticRegistry()
		met := newMetrics("test-cluster")
		reg.MustRegister(met)
		a := newAgent(newKVStore(failFirst(2)), controller.WithLogger(quietLogger()), controller.WithMetrics(met))
		defer deleteAll(t, a)
		a.createEndpoint()
		a.createEndpoint()
		time.Sleep(3 * time.Second)
		synctest.Wait()

		problems, err := testutil.GatherAndLint(reg)
		require.NoError(t, err)
		assert.Empty(t, problems)

		rec := get(newHandler(reg), "/metrics")
		require.Equal(t, http.StatusOK, rec.Code)
		body := rec.Body.String()
		for _, want := range []string{
			`agent_controllers_runs_total{cluster_id="test-cluster",status="success"} `,
			`agent_controllers_runs_total{cluster_id="test-cluster",status="failure"} `,
			`agent_controllers_group_runs_total{cluster_id="test-cluster",group_name="endpoint-sync",status="failure"} `,
			`agent_controllers_group_runs_total{cluster_id="test-cluster",group_name="endpoint-regenerate",status="success"} `,
			`agent_controllers_runs_duration_seconds_bucket{cluster_id="test-cluster",status="success",le="0.0001"} `,
			`agent_controllers_runs_duration_seconds_bucket{cluster_id="test-cluster",status="success",le="1"} `,
			`agent_controllers_runs_duration_seconds_bucket{cluster_id="test-cluster",status="success",le="+Inf"} `,
			"agent_controllers_active{cluster_id=\"test-cluster\"} 6\n",
			"agent_controllers_failing{cluster_id=\"test-cluster\"} 0\n",
		} {
			assert.Contains(t, body, want)
		}
		assert.NotContains(t, body, `le="0.005"`, "custom buckets replace the default ones")
	})
}

// With -listen, the program serves the three endpoints on a real socket and
// stops serving when its context ends. Nothing here depends on time.
func TestListenServesOverTCPAndStopsWithTheContext(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	addrs := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, io.Discard,
			withDuration(time.Hour), withChurnInterval(time.Hour),
			withListen("127.0.0.1:0"), withOnListen(func(addr string) { addrs <- addr }),
			withStore(newKVStore(never)), withLogger(quietLogger()))
	}()
	base := "http://" + <-addrs
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	fetch := func(path string) (int, string) {
		resp, err := client.Get(base + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}

	code, body := fetch("/healthz")
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, "ok\n", body)

	code, body = fetch("/controllers?format=json")
	assert.Equal(t, http.StatusOK, code)
	var sts controller.ControllerStatuses
	require.NoError(t, json.Unmarshal([]byte(body), &sts))
	assert.Len(t, sts, 9)

	code, body = fetch("/metrics")
	assert.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, "agent_controllers_active{cluster_id=\"example-cluster\"} 9\n")

	cancel()
	require.NoError(t, <-done)
	_, err := client.Get(base + "/healthz")
	assert.Error(t, err, "the server is shut down")
	assert.Empty(t, controller.GetGlobalStatus())
}
