package main

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/bgctl/controller"
	"github.com/sirupsen/logrus/hooks/test"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// failNext is a transient-failure policy the test switches: it fails the
// next n calls.
type failNext struct {
	mu sync.Mutex
	n  int
}

func (f *failNext) set(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n = n
}

func (f *failNext) fail() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n > 0 {
		f.n--
		return true
	}
	return false
}

// start runs a podController over inf and prov in the bubble until the
// test ends.
func start(t *testing.T, inf *informer, prov *provider) *podController {
	t.Helper()
	logger, _ := test.NewNullLogger()
	pc := newPodController(inf, prov, func(string, ...any) {}, controller.WithLogger(logger), controller.WithMetrics(nil))
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		pc.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-ran
		pc.RemoveAllAndWait()
	})
	return pc
}

func web(i int, image string) Pod {
	return Pod{Namespace: "default", Name: fmt.Sprintf("web-%d", i), Image: image}
}

func controllerNames(pc *podController) []string {
	var names []string
	for _, s := range pc.GetStatusModel() {
		names = append(names, s.Name)
	}
	return names
}

// Under random provider failures and a burst of events, the provider ends
// up with exactly the informer's pods (but the broken one), the dangling
// pods are gone, and only live pods keep a controller.
func TestProviderConvergesToTheInformer(t *testing.T) {
	for seed := uint64(1); seed <= 5; seed++ {
		t.Run(fmt.Sprintf("seed %d", seed), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				inf, prov := defaultWorld(seed, 0.3)
				pc := start(t, inf, prov)

				<-pc.CleanedUp()
				inf.Update(web(0, "nginx:1.28"))
				inf.Update(web(1, "nginx:1.29"))
				inf.Delete("default/web-2")
				inf.Add(web(4, "nginx:1.27"))
				inf.Add(web(5, "nginx:1.27"))
				time.Sleep(300 * time.Millisecond)
				inf.Delete("default/web-5")
				inf.Delete("default/web-0")
				inf.Update(web(4, "nginx:1.28"))
				time.Sleep(time.Minute)
				synctest.Wait()

				want := inf.Images()
				delete(want, brokenPod.Key())
				assert.Equal(t, map[string]string{
					"default/web-1": "nginx:1.29",
					"default/web-3": "nginx:1.27",
					"default/web-4": "nginx:1.28",
				}, want)
				assert.Equal(t, want, prov.Images())

				cleanup := pc.Lookup(danglingCleanup)
				require.NotNil(t, cleanup)
				assert.EqualError(t, cleanup.GetLastError(), "deleted 2 dangling pods: default/orphan-a, kube-system/orphan-b")
				assert.Equal(t, 1, cleanup.GetSuccessCount(), "one-shot: done after its first success")

				wantNames := []string{danglingCleanup}
				for _, k := range slices.Sorted(maps.Keys(inf.Images())) {
					wantNames = append(wantNames, podControllerName(k))
				}
				slices.Sort(wantNames)
				assert.Equal(t, wantNames, controllerNames(pc), "deleted pods leave no controller")
			})
		})
	}
}

func TestPermanentlyFailingPodStopsAfterExactly20Runs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		inf := newInformer(brokenPod)
		prov := newProvider(nil)
		begin := time.Now()
		pc := start(t, inf, prov)
		time.Sleep(time.Hour)
		synctest.Wait()

		assert.Equal(t, 20, prov.Calls(brokenPod.Key()))
		c := pc.Lookup(podControllerName(brokenPod.Key()))
		require.NotNil(t, c)
		st := c.GetStatusModel()
		assert.Equal(t, int64(20), st.Configuration.MaxRetries)
		assert.Equal(t, int64(20), st.Status.ConsecutiveFailureCount, "the status says it gave up: failures in a row = max-retries")
		assert.Equal(t, int64(20), st.Status.FailureCount)
		assert.Equal(t, "create default/broken: registry.invalid/app:1: image pull failed: repository does not exist", st.Status.LastFailureMsg)
		// Waits of 50ms, 100ms, … 500ms, then 500ms: the 20th run at
		// 2.75s + 9 × 500ms.
		assert.Equal(t, 7250*time.Millisecond, st.Status.LastFailureTimestamp.Sub(begin))
		assert.ErrorContains(t, pc.Health(), `controller "pod-sync/default/broken": 20 consecutive failures`)

		// The pod's next event brings it back: a fixed image is created.
		fixed := brokenPod
		fixed.Image = "nginx:1.27"
		inf.Update(fixed)
		synctest.Wait()
		assert.Equal(t, 21, prov.Calls(brokenPod.Key()))
		assert.Equal(t, map[string]string{brokenPod.Key(): "nginx:1.27"}, prov.Images())
		assert.NoError(t, pc.Health())
	})
}

func TestDeletedPodsControllerIsRemovedOnceTheProviderDeletedIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fails := &failNext{}
		inf := newInformer(web(1, "nginx:1.27"))
		prov := newProvider(fails.fail)
		pc := start(t, inf, prov)
		synctest.Wait()
		require.Equal(t, map[string]string{"default/web-1": "nginx:1.27"}, prov.Images())
		name := podControllerName("default/web-1")
		term := pc.TerminationChannel(name)

		fails.set(3)
		inf.Delete("default/web-1")
		synctest.Wait()
		require.NotNil(t, pc.Lookup(name), "kept while the provider still has the pod")
		assert.Equal(t, 1, pc.Lookup(name).GetConsecutiveFailureCount())

		time.Sleep(300 * time.Millisecond) // retries after 50ms, 100ms, 150ms
		synctest.Wait()
		assert.Empty(t, prov.Images())
		assert.Nil(t, pc.Lookup(name))
		assert.Equal(t, []string{danglingCleanup}, controllerNames(pc))
		select {
		case <-term:
		default:
			t.Fatal("the removed controller has not terminated")
		}
	})
}

// A delete and an add of the same key in a row: whichever order the loop
// sees things in, the pod ends up running and keeps its controller.
func TestReaddedPodKeepsItsController(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		inf := newInformer(web(1, "nginx:1.27"))
		prov := newProvider(nil)
		pc := start(t, inf, prov)
		synctest.Wait()

		inf.Delete("default/web-1")
		inf.Add(web(1, "nginx:1.28"))
		time.Sleep(time.Second)
		synctest.Wait()
		assert.Equal(t, map[string]string{"default/web-1": "nginx:1.28"}, prov.Images())
		assert.NotNil(t, pc.Lookup(podControllerName("default/web-1")))
	})
}

func TestRunConvergesAndExitsAfterItsDuration(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		logger, _ := test.NewNullLogger()
		var out bytes.Buffer
		begin := time.Now()
		require.NoError(t, run(t.Context(), &out, withLogger(logger)))
		assert.Equal(t, 12*time.Second, time.Since(begin))

		text := out.String()
		assert.Contains(t, text, "provider matches the informer")
		assert.Contains(t, text, "pod-sync/default/broken gave up after 20 failures in a row")
		assert.Contains(t, text, "pod-dangling-cleanup: deleted 2 dangling pods: default/orphan-a, kube-system/orphan-b")
		assert.True(t, strings.Contains(text, "deleted; its controller is removed"), "some pod was deleted during the run")
		assert.Empty(t, controller.GetGlobalStatus())
	})
}
