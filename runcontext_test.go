// Tests of the run context DoFunc receives (rule 2 of the package doc).

package controller

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Rule 2: the run context carries params.Context's values, is reused across
// runs and is cancelled on removal.
func TestRunContextDerivesFromParamsAndIsReused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		type key struct{}
		e := newEnv(t)
		r := newRecorder()
		parent := context.WithValue(context.Background(), key{}, "v")
		e.m.UpdateController("c", ControllerParams{DoFunc: r.do, RunInterval: time.Second, Context: parent})
		time.Sleep(2*time.Second + time.Millisecond)
		e.m.TriggerController("c") // without CancelDoFuncOnUpdate: the context is kept
		synctest.Wait()
		require.NoError(t, e.m.RemoveControllerAndWait("c"))
		require.Len(t, r.ctxs, 4)
		for _, ctx := range r.ctxs {
			assert.Same(t, r.ctxs[0], ctx)
		}
		assert.Equal(t, "v", r.ctxs[0].Value(key{}))
		assert.ErrorIs(t, r.ctxs[0].Err(), context.Canceled)
	})
}

// Rule 2: an update that brings a different Context replaces the run
// context, cancelling the running DoFunc whatever the flag.
func TestUpdateWithNewContextCancelsRunningDoFunc(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		b := newBlocker()
		type key struct{}
		e.m.UpdateController("c", ControllerParams{DoFunc: b.fn(1)})
		synctest.Wait()
		ctx2 := context.WithValue(context.Background(), key{}, 2)
		var got any
		e.m.UpdateController("c", ControllerParams{Context: ctx2, DoFunc: func(ctx context.Context) error {
			got = ctx.Value(key{})
			return nil
		}})
		synctest.Wait()
		_, cancelled := b.counts()
		assert.Equal(t, 1, cancelled)
		assert.Equal(t, 2, got)
		c := e.m.Lookup("c")
		assert.Equal(t, 2, c.GetSuccessCount(), "the cancelled run is an exit, not a failure")
		assert.Equal(t, 0, c.GetFailureCount())
		e.m.RemoveAllAndWait()
	})
}

// Without params.Context, DoFunc's context behaves as a context.WithCancel
// of Background would: no deadline or values, cancelled on removal, and
// children, AfterFunc and Cause (the removal's) work, whether Done was
// asked before the cancellation or not.
func TestRunContextWithoutParent(t *testing.T) {
	for _, doneFirst := range []bool{true, false} {
		t.Run(fmt.Sprintf("Done asked first: %v", doneFirst), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				type key struct{}
				e := newEnv(t)
				var ctx, child context.Context
				var cancelChild context.CancelFunc
				var afterRan atomic.Bool
				e.m.UpdateController("c", ControllerParams{DoFunc: func(c context.Context) error {
					ctx = c
					if doneFirst {
						child, cancelChild = context.WithCancel(c)
						context.AfterFunc(c, func() { afterRan.Store(true) })
					}
					return nil
				}})
				synctest.Wait()
				require.NotNil(t, ctx)
				assert.NoError(t, ctx.Err())
				_, has := ctx.Deadline()
				assert.False(t, has)
				assert.Nil(t, ctx.Value(key{}))
				assert.Equal(t, "controller.lazyCtx", fmt.Sprint(ctx))
				require.NoError(t, e.m.RemoveControllerAndWait("c"))

				assert.ErrorIs(t, ctx.Err(), context.Canceled)
				assert.ErrorIs(t, context.Cause(ctx), ErrControllerRemoved)
				select {
				case <-ctx.Done():
				default:
					t.Fatal("Done is not closed after removal")
				}
				if doneFirst {
					assert.ErrorIs(t, child.Err(), context.Canceled, "the child was cancelled with its parent")
					cancelChild()
					synctest.Wait()
					assert.True(t, afterRan.Load())
				}
			})
		})
	}
}

// A child derived from DoFunc's context costs no goroutine: the context
// package attaches it directly.
func TestRunContextChildrenStartNoGoroutine(t *testing.T) {
	m := benchManager(t)
	var before, after int
	done := make(chan struct{})
	m.UpdateController("c", ControllerParams{DoFunc: func(ctx context.Context) error {
		before = runtime.NumGoroutine()
		child, cancel := context.WithTimeout(ctx, time.Hour)
		after = runtime.NumGoroutine()
		cancel()
		<-child.Done()
		close(done)
		return nil
	}})
	<-done
	m.RemoveAllAndWait()
	assert.Equal(t, before, after)
}

// A run context replaced after CancelDoFuncOnUpdate is a new one: the
// cancelled one stays cancelled.
func TestRunContextReplacedAfterCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		b := newBlocker()
		e.m.UpdateController("c", ControllerParams{DoFunc: b.fn(0), CancelDoFuncOnUpdate: true})
		synctest.Wait()
		var second context.Context
		e.m.UpdateController("c", ControllerParams{DoFunc: func(ctx context.Context) error { second = ctx; return nil }})
		synctest.Wait()
		require.NotNil(t, second)
		assert.NoError(t, second.Err())
		e.m.RemoveAllAndWait()
		assert.ErrorIs(t, second.Err(), context.Canceled)
	})
}

// The run context keeps the context contract "if Done is not yet closed,
// Err returns nil" while it is being cancelled: between its flag and the
// closing of the channel Done returned. The test stops it in that state.
func TestRunContextErrNotBeforeDone(t *testing.T) {
	rc := &lazyCtx{}
	done := rc.Done()
	rc.cancelled.Store(uint32(causeRemoved)) // cancel has set its flag, not yet closed the channel
	select {
	case <-done:
		t.Fatal("Done closed")
	default:
	}
	assert.NoError(t, rc.Err())
	rc.cancel(causeRemoved)
	<-done
	assert.ErrorIs(t, rc.Err(), context.Canceled)
}
