// Tests of the causes a cancelled run context carries (cancelcause.go):
// what a DoFunc reads with context.Cause, for each reason it is cancelled.

package controller

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// errFence stands for a cause set by the owner of params.Context, as a
// replica of the ha module sets ErrFencePassed.
var errFence = errors.New("fence passed")

// A DoFunc tells apart why its context was cancelled, with errors.Is on
// context.Cause, whether the run context is the one made without a parent
// (Context nil) or one derived from params.Context, and whether the DoFunc
// waited on Done or only asks Err and Cause once it returns.
func TestCancelCauses(t *testing.T) {
	type key struct{}
	cases := []struct {
		name       string
		params     ControllerParams                                   // DoFunc is the test's
		parentOnly bool                                               // needs params.Context: the case sets it
		deadline   time.Duration                                      // params.Context's deadline; 0: none
		act        func(e *env, cancelParent context.CancelCauseFunc) // nil: none
		wait       time.Duration                                      // then, how long to wait before the DoFunc returns
		wantErr    error                                              // ctx.Err()
		want       error                                              // context.Cause(ctx), by errors.Is
	}{
		{name: "RemoveController", act: func(e *env, _ context.CancelCauseFunc) { _ = e.m.RemoveController("c") },
			wantErr: context.Canceled, want: ErrControllerRemoved},
		{name: "RemoveControllerAndWait", act: func(e *env, _ context.CancelCauseFunc) { _ = e.m.RemoveControllerAndWait("c") },
			wantErr: context.Canceled, want: ErrControllerRemoved},
		{name: "RemoveAllAndWait", act: func(e *env, _ context.CancelCauseFunc) { e.m.RemoveAllAndWait() },
			wantErr: context.Canceled, want: ErrControllerRemoved},
		{name: "Shutdown", act: func(e *env, _ context.CancelCauseFunc) { _ = e.m.Shutdown(context.Background()) },
			wantErr: context.Canceled, want: ErrManagerShutDown},
		{name: "an update with CancelDoFuncOnUpdate", params: ControllerParams{CancelDoFuncOnUpdate: true},
			act:     func(e *env, _ context.CancelCauseFunc) { e.m.UpdateController("c", ControllerParams{DoFunc: NoopFunc}) },
			wantErr: context.Canceled, want: ErrControllerUpdated},
		{name: "an update that brings another Context",
			act: func(e *env, _ context.CancelCauseFunc) {
				e.m.UpdateController("c", ControllerParams{DoFunc: NoopFunc, Context: context.WithValue(context.Background(), key{}, "new")})
			},
			wantErr: context.Canceled, want: ErrControllerUpdated},
		{name: "a trigger with CancelDoFuncOnUpdate", params: ControllerParams{CancelDoFuncOnUpdate: true},
			act:     func(e *env, _ context.CancelCauseFunc) { e.m.TriggerController("c") },
			wantErr: context.Canceled, want: ErrControllerTriggered},
		{name: "RunTimeout", params: ControllerParams{RunTimeout: time.Second},
			wait: time.Second + time.Millisecond, wantErr: context.DeadlineExceeded, want: ErrRunTimeout},
		{name: "params.Context ended with a cause of its own", parentOnly: true,
			act:     func(e *env, cancel context.CancelCauseFunc) { cancel(errFence) },
			wantErr: context.Canceled, want: errFence},
		{name: "params.Context ended without a cause", parentOnly: true,
			act:     func(e *env, cancel context.CancelCauseFunc) { cancel(nil) },
			wantErr: context.Canceled, want: context.Canceled},
		{name: "params.Context ended by its deadline", parentOnly: true, deadline: time.Minute,
			wait: time.Minute + time.Millisecond, wantErr: context.DeadlineExceeded, want: context.DeadlineExceeded},
		{name: "the first cause stays", params: ControllerParams{CancelDoFuncOnUpdate: true},
			act: func(e *env, _ context.CancelCauseFunc) {
				e.m.TriggerController("c")
				_ = e.m.RemoveController("c")
			},
			wantErr: context.Canceled, want: ErrControllerTriggered},
	}
	for _, tc := range cases {
		for _, parent := range []string{"no parent", "a parent"} {
			if tc.parentOnly && parent == "no parent" {
				continue
			}
			for _, waits := range []string{"waits on Done", "only asks Err"} {
				t.Run(tc.name+", "+parent+", "+waits, func(t *testing.T) {
					synctest.Test(t, func(t *testing.T) {
						e := newEnv(t)
						p := tc.params
						var cancelParent context.CancelCauseFunc
						if parent == "a parent" {
							ctx := context.WithValue(context.Background(), key{}, "old")
							ctx, cancelParent = context.WithCancelCause(ctx)
							if tc.deadline > 0 {
								var cancel context.CancelFunc
								ctx, cancel = context.WithTimeout(ctx, tc.deadline)
								defer cancel()
							}
							p.Context = ctx
						}
						release := make(chan struct{})
						var gotErr, gotCause error
						calls := 0
						p.DoFunc = func(ctx context.Context) error {
							if calls++; calls > 1 {
								return nil
							}
							if waits == "waits on Done" {
								<-ctx.Done()
							} else {
								<-release
							}
							gotErr, gotCause = ctx.Err(), context.Cause(ctx)
							return ctx.Err()
						}
						e.m.UpdateController("c", p)
						synctest.Wait()
						acted := make(chan struct{})
						go func() {
							defer close(acted)
							if tc.act != nil {
								tc.act(e, cancelParent)
							}
						}()
						synctest.Wait()
						time.Sleep(tc.wait)
						close(release)
						<-acted
						synctest.Wait()
						assert.ErrorIs(t, gotErr, tc.wantErr)
						assert.ErrorIs(t, gotCause, tc.want, "cause %v", gotCause)
						e.m.RemoveAllAndWait()
						if cancelParent != nil {
							cancelParent(nil)
						}
					})
				})
			}
		}
	}
}

// A removal before the controller's goroutine first runs still lets the
// first run happen (rule 1), with a context already cancelled for the
// removal's cause. The goroutine is started by hand after the removal, as
// the scheduler may start it: with no parent, and with one.
func TestCancelCauseOfAFirstRunAfterRemoval(t *testing.T) {
	for _, shutDown := range []bool{false, true} {
		for _, parent := range []context.Context{nil, context.WithValue(context.Background(), errFence, 1)} {
			t.Run(fmt.Sprintf("shut down %v, parent %v", shutDown, parent != nil), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					e := newEnv(t)
					var cause error
					p := ControllerParams{Context: parent, DoFunc: func(ctx context.Context) error {
						cause = context.Cause(ctx)
						return nil
					}}
					e.m.mu.Lock()
					c := newController(e.m, "c", p, nil, e.metrics.group(""))
					e.m.controllers = map[string]*Controller{"c": c}
					e.metrics.addActive(1)
					e.m.closed = shutDown
					e.m.removeLocked(c)
					e.m.mu.Unlock()
					go c.run()
					<-c.terminationChannel()
					if shutDown {
						assert.ErrorIs(t, cause, ErrManagerShutDown)
					} else {
						assert.ErrorIs(t, cause, ErrControllerRemoved)
					}
				})
			})
		}
	}
}

// A StopFunc whose Shutdown deadline passed reads a cause that wraps
// ErrManagerShutDown.
func TestCancelCauseOfAStopFuncPastTheShutdownDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		var cause error
		e.m.UpdateController("c", ControllerParams{DoFunc: NoopFunc, StopFunc: func(ctx context.Context) error {
			<-ctx.Done()
			cause = context.Cause(ctx)
			return nil
		}})
		synctest.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		require.Error(t, e.m.Shutdown(ctx))
		synctest.Wait()
		assert.ErrorIs(t, cause, ErrManagerShutDown)
		assert.EqualError(t, cause, "manager was shut down: its deadline passed before the StopFunc returned")
		e.m.RemoveAllAndWait()
	})
}
