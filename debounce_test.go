// Tests of the trigger debounce (debounce.go), end to end in synctest
// bubbles: the exact times of the runs around a window.

package controller

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The run times of one controller under WithTriggerDebounce. Each row
// installs a controller whose DoFunc returns results (the last one
// repeating; none: success) and takes took, pokes it at the given times
// (by a trigger, an update with the same parameters, or a removal), and
// compares the run times.
func TestTriggerDebounce(t *testing.T) {
	type poke struct {
		at   time.Duration
		what string // "trigger", "update" or "remove"
	}
	triggers := func(at ...float64) []poke {
		var ps []poke
		for _, s := range secs(at...) {
			ps = append(ps, poke{s, "trigger"})
		}
		return ps
	}
	cases := []struct {
		name     string
		debounce time.Duration
		p        ControllerParams
		results  []error
		took     time.Duration
		pokes    []poke
		until    time.Duration
		want     []time.Duration
	}{{
		name:     "off: a trigger right after a run runs at once",
		debounce: 0, pokes: triggers(0, 0.5),
		until: 10 * time.Second, want: secs(0, 0, 0.5),
	}, {
		name:     "a trigger right after a run is held to the end of the window, not dropped",
		debounce: time.Second, pokes: triggers(0),
		until: 10 * time.Second, want: secs(0, 1),
	}, {
		name:     "triggers inside a window coalesce into one run at its end",
		debounce: time.Second, pokes: triggers(0.2, 0.5, 0.9, 1.5, 1.7),
		until: 10 * time.Second, want: secs(0, 1, 2),
	}, {
		name:     "a trigger after the window runs at once",
		debounce: time.Second, pokes: triggers(5, 5.5, 7),
		until: 10 * time.Second, want: secs(0, 5, 6, 7),
	}, {
		name:     "an update is held too",
		debounce: time.Second, pokes: []poke{{300 * time.Millisecond, "update"}, {400 * time.Millisecond, "trigger"}},
		until: 10 * time.Second, want: secs(0, 1),
	}, {
		name:     "the window counts from the end of the run",
		debounce: time.Second, took: 2 * time.Second, pokes: triggers(1, 5.5),
		until: 10 * time.Second, want: secs(0, 3, 6),
	}, {
		name:     "a timed run due before the window ends is not held, and serves the trigger",
		debounce: time.Second, p: ControllerParams{RunInterval: 500 * time.Millisecond}, pokes: triggers(0.6),
		until: 2*time.Second + time.Millisecond, want: secs(0, 0.5, 1, 1.5, 2),
	}, {
		name:     "a trigger during a long interval runs at the window's end, and the interval restarts from that run",
		debounce: time.Second, p: ControllerParams{RunInterval: 10 * time.Second}, pokes: triggers(0.5),
		until: 12 * time.Second, want: secs(0, 1, 11),
	}, {
		name:     "retries keep their own schedule",
		debounce: time.Second, p: ControllerParams{ErrorRetryBaseDuration: 100 * time.Millisecond}, results: []error{errBoom},
		until: time.Second + time.Millisecond, want: secs(0, 0.1, 0.3, 0.6, 1),
	}, {
		name:     "a removal ends a held run at once: no run",
		debounce: time.Second, pokes: []poke{{100 * time.Millisecond, "trigger"}, {200 * time.Millisecond, "remove"}},
		until: 10 * time.Second, want: secs(0),
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newEnv(t)
				WithTriggerDebounce(tc.debounce)(e.m)
				r := newRecorder(tc.results...)
				r.took = tc.took
				stops := 0
				p := tc.p
				p.DoFunc = r.do
				p.StopFunc = func(context.Context) error { stops++; return nil }
				e.m.UpdateController("c", p)
				start := time.Now()
				for _, pk := range tc.pokes {
					time.Sleep(pk.at - time.Since(start))
					synctest.Wait() // the controller has done what it could at this instant
					switch pk.what {
					case "trigger":
						e.m.TriggerController("c")
					case "update":
						e.m.UpdateController("c", p)
					case "remove":
						require.NoError(t, e.m.RemoveControllerAndWait("c"))
						assert.Equal(t, pk.at, time.Since(start), "the removal did not wait for the window")
						assert.Equal(t, 1, stops)
					}
				}
				time.Sleep(tc.until - time.Since(start))
				e.m.RemoveAllAndWait()
				assert.Equal(t, tc.want, r.times())
			})
		})
	}
}

// A held update runs with the newest parameters, once, and restarts the
// retry step as any update does.
func TestTriggerDebounceRunsTheNewestParameters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		WithTriggerDebounce(time.Second)(e.m)
		var mu sync.Mutex
		var ran []int
		version := func(v int, err error) ControllerFunc {
			return func(context.Context) error {
				mu.Lock()
				defer mu.Unlock()
				ran = append(ran, v)
				return err
			}
		}
		runs := func() []int {
			mu.Lock()
			defer mu.Unlock()
			return append([]int(nil), ran...)
		}
		start := time.Now()
		e.m.UpdateController("c", ControllerParams{DoFunc: version(1, errBoom), ErrorRetryBaseDuration: 10 * time.Second})
		time.Sleep(100 * time.Millisecond)
		for v := 2; v <= 4; v++ {
			e.m.UpdateController("c", ControllerParams{DoFunc: version(v, errBoom), ErrorRetryBaseDuration: 10 * time.Second})
		}
		synctest.Wait()
		assert.Equal(t, []int{1}, runs(), "held")
		time.Sleep(900 * time.Millisecond)
		synctest.Wait()
		assert.Equal(t, []int{1, 4}, runs(), "one run, of the newest parameters, at the window's end")
		assert.Equal(t, time.Second, time.Since(start))
		time.Sleep(10*time.Second + time.Millisecond)
		assert.Equal(t, []int{1, 4, 4}, runs(), "the retry step restarted: the next wait is the base, 10s")
		e.m.RemoveAllAndWait()
	})
}

// Rule 5 with WithTriggerDebounce: "a timed run due sooner still comes on
// time", also when the trigger arrives while DoFunc runs: the RunInterval
// run due 100ms after the run's end comes then and serves the trigger,
// rather than being held to the end of the 1s window.
func TestDebounceTriggerDuringRunKeepsTheInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		WithTriggerDebounce(time.Second)(e.m)
		r := newRecorder()
		r.took = 50 * time.Millisecond
		e.m.UpdateController("c", ControllerParams{DoFunc: r.do, RunInterval: 100 * time.Millisecond})
		time.Sleep(10 * time.Millisecond) // during the first run (0–50ms)
		e.m.TriggerController("c")
		time.Sleep(1090 * time.Millisecond) // to 1.1s
		e.m.RemoveAllAndWait()
		// Without the trigger a run starts every 150ms (50ms run +
		// RunInterval); the trigger may only make the 150ms run serve it
		// too.
		assert.Equal(t, secs(0, 0.15, 0.3, 0.45, 0.6, 0.75, 0.9, 1.05), r.times())
	})
}

// The same for a retry: a failing run with a 100ms retry, triggered while
// it runs, retries 100ms after it, not at the end of the window.
func TestDebounceTriggerDuringRunKeepsTheRetry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		WithTriggerDebounce(time.Second)(e.m)
		r := newRecorder(errBoom)
		r.took = 50 * time.Millisecond
		e.m.UpdateController("c", ControllerParams{DoFunc: r.do, ErrorRetryBaseDuration: 100 * time.Millisecond, Backoff: ConstantBackoff})
		time.Sleep(10 * time.Millisecond)
		e.m.TriggerController("c")
		time.Sleep(1090 * time.Millisecond) // to 1.1s
		e.m.RemoveAllAndWait()
		assert.Equal(t, secs(0, 0.15, 0.3, 0.45, 0.6, 0.75, 0.9, 1.05), r.times())
	})
}
