// Tests of run middleware: what it wraps, how often, in which order, and
// what a broken one leaves running.

package controller

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// wrapLog is a RunMiddleware that records each wrap and each run it
// wraps, as "<tag> wrap <name> <group>" and "<tag> run <name>".
type wrapLog struct {
	mu     sync.Mutex
	events []string
	infos  []RunInfo
}

func (w *wrapLog) middleware(tag string) RunMiddleware {
	return func(info RunInfo, do ControllerFunc) ControllerFunc {
		w.add(fmt.Sprintf("%s wrap %s %s", tag, info.Name, info.Group.Name))
		w.mu.Lock()
		w.infos = append(w.infos, info)
		w.mu.Unlock()
		return func(ctx context.Context) error {
			w.add(tag + " run " + info.Name)
			return do(ctx)
		}
	}
}

func (w *wrapLog) add(s string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.events = append(w.events, s)
}

func (w *wrapLog) all() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.events...)
}

// count returns how many events start with prefix.
func (w *wrapLog) count(prefix string) int {
	n := 0
	for _, e := range w.all() {
		if len(e) >= len(prefix) && e[:len(prefix)] == prefix {
			n++
		}
	}
	return n
}

// The middleware wraps a DoFunc once per set of parameters, before their
// first run: timed runs and triggers reuse the wrapped function, an update
// wraps the new DoFunc with the new group and RunTimeout, and updates that
// come together are wrapped once.
func TestRunMiddlewareWrapsOncePerSetOfParameters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		w := &wrapLog{}
		WithRunMiddleware(w.middleware("mw"))(e.m)
		r := newRecorder()
		c := e.m.UpdateController("c", ControllerParams{DoFunc: r.do, RunInterval: time.Second, Group: NewGroup("g1")})
		time.Sleep(3*time.Second + time.Millisecond)
		e.m.TriggerController("c")
		synctest.Wait()
		assert.Equal(t, 5, r.count(), "runs at 0, 1, 2, 3 and the trigger's")
		assert.Equal(t, 1, w.count("mw wrap"), "one wrap for the install")
		assert.Equal(t, 5, w.count("mw run"), "every run goes through the middleware")

		e.m.UpdateController("c", ControllerParams{DoFunc: r.do, RunInterval: time.Second, Group: NewGroup("g2"), RunTimeout: 5 * time.Second})
		synctest.Wait()
		assert.Equal(t, 2, w.count("mw wrap"), "an update wraps again")
		assert.Equal(t, "mw wrap c g2", w.all()[len(w.all())-2], "with the new group, before the run")

		// Updates that arrive while DoFunc runs coalesce into one run, and
		// one wrap.
		b := newBlocker()
		e.m.UpdateController("c", ControllerParams{DoFunc: b.fn(1), Group: NewGroup("g3")})
		synctest.Wait()
		for range 3 {
			e.m.UpdateController("c", ControllerParams{DoFunc: r.do, Group: NewGroup("g4")})
		}
		close(b.release)
		synctest.Wait()
		assert.Equal(t, 4, w.count("mw wrap"), "one wrap for g3, one for the three updates to g4")
		e.m.RemoveAllAndWait()

		w.mu.Lock()
		defer w.mu.Unlock()
		var timeouts []time.Duration
		for _, info := range w.infos {
			assert.Same(t, c, info.Controller)
			assert.Equal(t, "c", info.Name)
			timeouts = append(timeouts, info.RunTimeout)
		}
		assert.Equal(t, []time.Duration{0, 5 * time.Second, 0, 0}, timeouts, "each wrap's parameters' RunTimeout")
	})
}

// WithRunMiddleware(a, b) runs a(b(DoFunc)); a second option adds inside
// the first. Nil middleware is skipped.
func TestRunMiddlewareOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		w := &wrapLog{}
		WithRunMiddleware(w.middleware("a"), nil, w.middleware("b"))(e.m)
		WithRunMiddleware(w.middleware("c"))(e.m)
		e.m.UpdateController("x", ControllerParams{DoFunc: func(context.Context) error {
			w.add("DoFunc")
			return nil
		}})
		synctest.Wait()
		e.m.RemoveAllAndWait()
		assert.Equal(t, []string{
			"c wrap x ", "b wrap x ", "a wrap x ",
			"a run x", "b run x", "c run x", "DoFunc",
		}, w.all())
	})
}

// What the middleware's function returns is the run's result, and the
// context it passes on is what DoFunc gets; the StopFunc is not wrapped.
func TestRunMiddlewareSeesAndShapesTheRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		type key struct{}
		e := newEnv(t)
		var seen []error
		WithRunMiddleware(func(info RunInfo, do ControllerFunc) ControllerFunc {
			return func(ctx context.Context) error {
				err := do(context.WithValue(ctx, key{}, "from the middleware"))
				seen = append(seen, err)
				if err != nil {
					return fmt.Errorf("wrapped: %w", err)
				}
				return nil
			}
		})(e.m)
		var got any
		stopped := 0
		c := e.m.UpdateController("c", ControllerParams{
			DoFunc: func(ctx context.Context) error {
				got = ctx.Value(key{})
				return errBoom
			},
			StopFunc: func(context.Context) error { stopped++; return nil },
		})
		synctest.Wait()
		require.NoError(t, e.m.RemoveControllerAndWait("c"))
		assert.Equal(t, "from the middleware", got)
		assert.Equal(t, []error{errBoom}, seen, "the StopFunc did not go through the middleware")
		assert.Equal(t, 1, stopped)
		assert.ErrorIs(t, c.GetLastError(), errBoom)
		assert.EqualError(t, c.GetLastError(), "wrapped: boom")
	})
}

// A middleware that panics, or returns nil, leaves the DoFunc running
// bare; the panic is logged at Error, once per wrap.
func TestRunMiddlewareThatPanicsOrDeclines(t *testing.T) {
	forEachSink(t, func(t *testing.T, sink string) {
		synctest.Test(t, func(t *testing.T) {
			e := newEnvOn(t, sink)
			w := &wrapLog{}
			WithRunMiddleware(
				w.middleware("outer"),
				func(info RunInfo, do ControllerFunc) ControllerFunc { panic("no tracer") },
				func(info RunInfo, do ControllerFunc) ControllerFunc { return nil },
			)(e.m)
			r := newRecorder()
			e.m.UpdateController("c", ControllerParams{DoFunc: r.do, RunInterval: time.Second})
			time.Sleep(2*time.Second + time.Millisecond)
			e.m.RemoveAllAndWait()
			assert.Equal(t, 3, r.count(), "the DoFunc runs")
			assert.Equal(t, 3, w.count("outer run"), "under the middleware that works")
			assert.Equal(t, []string{"run middleware panicked; DoFunc runs without it: no tracer"}, e.logs(logrus.ErrorLevel))
		})
	})
}

// The run middleware is applied once per set of parameters, also with
// the debounce on; timed runs (claimed without the lock), held
// runs and triggered runs all go through the wrapped function; the
// StopFunc never does.
func TestRunMiddlewareOncePerParamsWithDebounce(t *testing.T) {
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
