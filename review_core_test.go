// review_core_test.go: a hostile review's tests of issues 20 and 21 in the
// core: each fails while the suspicion it names holds, or documents one
// disproved.

package controller

import (
	"context"
	"runtime/pprof"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
)

// "Every controller goroutine carries pprof labels": a DoFunc that uses
// pprof.Do, the standard way to add a label of its own, leaves the
// goroutine with the run context's labels, which are none: from then on
// the controller's goroutine is anonymous in profiles and dumps (labels.go
// admits it, "until the next update of a new group").
func TestReviewLabelsSurviveADoFuncUsingPprofDo(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		release := make(chan struct{})
		runs := 0
		e.m.UpdateController("c", ControllerParams{DoFunc: func(ctx context.Context) error {
			runs++
			if runs == 1 {
				pprof.Do(ctx, pprof.Labels("step", "fetch"), func(context.Context) {})
				return nil
			}
			<-release
			return nil
		}})
		synctest.Wait()
		e.m.TriggerController("c")
		synctest.Wait() // the second run blocks
		assert.Contains(t, labelsInDump(t), `{"controller":"c"}`)
		close(release)
		e.m.RemoveAllAndWait()
	})
}

// Disproved: the run middleware is applied once per set of parameters,
// also with the debounce on; timed runs (claimed without the lock), held
// runs and triggered runs all go through the wrapped function; the
// StopFunc never does.
func TestReviewMiddlewareOncePerParamsWithDebounce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var wraps, wrappedRuns, doRuns, stops int
		var mu sync.Mutex
		mw := func(_ RunInfo, do ControllerFunc) ControllerFunc {
			mu.Lock()
			wraps++
			mu.Unlock()
			return func(ctx context.Context) error {
				mu.Lock()
				wrappedRuns++
				mu.Unlock()
				return do(ctx)
			}
		}
		m := NewManager(WithMetrics(nil), WithLogger(quietLogger()), WithRunMiddleware(mw), WithTriggerDebounce(500*time.Millisecond))
		start := time.Now()
		var at []time.Duration
		p := ControllerParams{RunInterval: time.Second,
			DoFunc: func(context.Context) error {
				mu.Lock()
				doRuns++
				at = append(at, time.Since(start))
				mu.Unlock()
				return nil
			},
			StopFunc: func(context.Context) error { stops++; return nil }}
		m.UpdateController("c", p)
		time.Sleep(3500 * time.Millisecond)
		m.UpdateController("c", p) // window over (last run at 3s): runs at once
		time.Sleep(100 * time.Millisecond)
		m.TriggerController("c") // held to 4.0s
		time.Sleep(400*time.Millisecond + time.Millisecond)
		m.RemoveAllAndWait()
		mu.Lock()
		defer mu.Unlock()
		assert.Equal(t, secs(0, 1, 2, 3, 3.5, 4), at)
		assert.Equal(t, 2, wraps, "the install and the update")
		assert.Equal(t, doRuns, wrappedRuns, "every run went through the middleware")
		assert.Equal(t, 1, stops, "the StopFunc ran, unwrapped")
	})
}
