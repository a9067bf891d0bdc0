package controller

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Hostile callbacks and churn: errors whose methods panic or change, bursts
// of invalid updates, and owners that install and remove while they wait.

// TerminationChannel of a controller that was removed and is still running
// its StopFunc is closed only once the StopFunc returned; once the name is
// installed again, it is the new controller's channel.
func TestTerminationChannelAfterRemoval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		e.m.UpdateController("t", ControllerParams{DoFunc: NoopFunc, StopFunc: func(context.Context) error {
			time.Sleep(5 * time.Second)
			return nil
		}})
		synctest.Wait()
		start := time.Now()
		require.NoError(t, e.m.RemoveController("t"))
		ch := e.m.TerminationChannel("t")
		select {
		case <-ch:
			t.Fatal("closed while the StopFunc still runs")
		default:
		}
		<-ch
		assert.Equal(t, 5*time.Second, time.Since(start), "closed when the StopFunc returned")

		select {
		case <-e.m.TerminationChannel("t"):
		default:
			t.Fatal("a terminated controller's name gives a closed channel")
		}

		e.m.UpdateController("u", ControllerParams{DoFunc: NoopFunc, StopFunc: func(context.Context) error {
			time.Sleep(time.Second)
			return nil
		}})
		synctest.Wait()
		require.NoError(t, e.m.RemoveController("u"))
		e.m.UpdateController("u", ControllerParams{DoFunc: NoopFunc})
		synctest.Wait()
		select {
		case <-e.m.TerminationChannel("u"):
			t.Fatal("the installed controller's channel, open while it is installed")
		case <-time.After(2 * time.Second):
		}
		e.m.RemoveAllAndWait()
	})
}

// Two invalid updates that reach a controller while its DoFunc runs are
// both logged at Error and each told to its own HealthReporter, in order.
func TestEveryInvalidUpdateIsReported(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		release := make(chan struct{})
		e.m.UpdateController("c", ControllerParams{DoFunc: func(context.Context) error { <-release; return nil }})
		synctest.Wait()
		first, second := &healthLog{}, &healthLog{}
		e.m.UpdateController("c", ControllerParams{DoFunc: NoopFunc, RunInterval: -time.Second, Health: first})
		e.m.UpdateController("c", ControllerParams{DoFunc: NoopFunc, Jitter: -time.Second, Health: second})
		close(release)
		synctest.Wait()

		var errs []string
		for _, en := range e.hook.AllEntries() {
			if en.Level == logrus.ErrorLevel {
				errs = append(errs, fmt.Sprint(en.Data[logrus.ErrorKey]))
			}
		}
		require.Len(t, errs, 2, "each invalid update is logged")
		assert.Contains(t, errs[0], "RunInterval")
		assert.Contains(t, errs[1], "Jitter")
		require.Len(t, first.all(), 1)
		assert.Contains(t, first.all()[0], "RunInterval")
		require.Len(t, second.all(), 1)
		assert.Contains(t, second.all()[0], "Jitter")
		assert.Equal(t, 2, e.m.Lookup("c").GetFailureCount())
		e.m.RemoveAllAndWait()
	})
}

// mutableErr is a preallocated error whose text the DoFunc changes before
// returning the same pointer again.
type mutableErr struct{ msg string }

func (e *mutableErr) Error() string { return e.msg }

// A DoFunc that returns the same error value with a new message each time:
// the status, Health and the "new error message" Warn follow the message.
func TestReusedErrorWithNewMessage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		reused := &mutableErr{}
		attempt := 0
		e.m.UpdateController("reused", ControllerParams{DoFunc: func(context.Context) error {
			attempt++
			if attempt <= 2 {
				reused.msg = "dial: connection refused"
			} else {
				reused.msg = fmt.Sprintf("attempt %d: timeout", attempt)
			}
			return reused
		}})
		time.Sleep(6 * time.Second) // runs at 0, 1, 3 and 6 s
		synctest.Wait()
		st := e.m.Lookup("reused").GetStatusModel().Status
		assert.Equal(t, int64(4), st.FailureCount)
		assert.Equal(t, "attempt 4: timeout", st.LastFailureMsg)
		assert.EqualError(t, e.m.Health(), `controller "reused": 4 consecutive failures: attempt 4: timeout`)
		assert.Equal(t, []string{
			"controller failed; retrying",
			"controller still failing with a new error",
			"controller still failing with a new error",
		}, e.logs(logrus.WarnLevel), "the first run's message, then each new one; the repeated one is not logged again")
		e.m.RemoveAllAndWait()
	})
}

// panickyErr is an error whose Error method dereferences its receiver: a
// typed nil of it, returned as an error, panics when asked its message.
type panickyErr struct{ msg string }

func (e *panickyErr) Error() string { return e.msg }

// unwrapPanics is an error whose chain cannot be walked.
type unwrapPanics struct{}

func (unwrapPanics) Error() string { return "unwrap panics" }
func (unwrapPanics) Unwrap() error { panic("Unwrap exploded") }

// runInChild runs the test named name again in a child process with
// BGCTL_HOSTILE_CHILD=1 and fails if the child did not pass: the point of
// such a test is that the process survives.
func runInChild(t *testing.T, name string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+name+"$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "BGCTL_HOSTILE_CHILD=1")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "the child process did not survive:\n%s", out)
	require.Contains(t, string(out), "--- PASS: "+name, "%s", out)
}

// An error whose Error method panics (a typed nil returned as an error) is
// recorded as a failure whose message says so and names the error's type;
// it is counted, logged once, told to the HealthReporter, and the loop
// retries on schedule. The same holds for a StopFunc, and for an error
// whose Unwrap panics. Runs in a child process: on failure the process dies.
func TestErrorWhoseMethodsPanic(t *testing.T) {
	if os.Getenv("BGCTL_HOSTILE_CHILD") != "1" {
		runInChild(t, t.Name())
		return
	}
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		health := &healthLog{}
		var runs []time.Duration
		start := time.Now()
		e.m.UpdateController("typed-nil", ControllerParams{
			DoFunc: func(context.Context) error {
				runs = append(runs, time.Since(start))
				var p *panickyErr
				return p
			},
			StopFunc: func(context.Context) error {
				var p *panickyErr
				return p
			},
			Health: health,
		})
		e.m.UpdateController("bad-chain", ControllerParams{
			DoFunc: func(context.Context) error { return unwrapPanics{} },
		})
		time.Sleep(3 * time.Second)
		synctest.Wait()
		assert.Equal(t, secs(0, 1, 3), runs, "the loop goes on retrying on schedule")

		want := "error of type *controller.panickyErr: its Error method panicked: runtime error: invalid memory address or nil pointer dereference"
		st := e.m.Lookup("typed-nil").GetStatusModel().Status
		assert.Equal(t, int64(3), st.FailureCount)
		assert.Equal(t, int64(3), st.ConsecutiveFailureCount)
		assert.Equal(t, want, st.LastFailureMsg)
		assert.EqualError(t, e.m.Lookup("typed-nil").GetLastError(), want)
		assert.Equal(t, []string{"degraded typed-nil: " + want, "degraded typed-nil: " + want, "degraded typed-nil: " + want}, health.all())

		chain := e.m.Lookup("bad-chain").GetStatusModel().Status
		assert.Equal(t, int64(3), chain.FailureCount)
		assert.Equal(t, "error of type controller.unwrapPanics: its Unwrap or As method panicked: Unwrap exploded", chain.LastFailureMsg)

		var warns []string
		for _, en := range e.hook.AllEntries() {
			if en.Level == logrus.WarnLevel {
				warns = append(warns, en.Data["name"].(string)+": "+fmt.Sprint(en.Data[logrus.ErrorKey]))
			}
		}
		assert.ElementsMatch(t, []string{"typed-nil: " + want, "bad-chain: " + chain.LastFailureMsg}, warns, "one Warn per streak, not per run")
		require.Error(t, e.m.Health())
		assert.Contains(t, e.m.Health().Error(), want)

		require.NoError(t, e.m.RemoveControllerAndWait("typed-nil"))
		require.Len(t, health.all(), 4)
		assert.Equal(t, "degraded typed-nil: "+want, health.all()[3], "the StopFunc's unreadable error is told too")
		e.m.RemoveAllAndWait()
	})
}

// RemoveAllAndWait waits for exactly the controllers it removed and those
// already stopping when it was called, not for the ones an owner keeps
// installing and removing meanwhile; Shutdown likewise, and its error names
// only those.
func TestWaitsIgnoreLaterChurn(t *testing.T) {
	slowStop := func(d time.Duration) ControllerFunc {
		return func(context.Context) error { time.Sleep(d); return nil }
	}
	for _, shutdown := range []bool{false, true} {
		t.Run(map[bool]string{false: "RemoveAllAndWait", true: "Shutdown"}[shutdown], func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newEnv(t)
				// Already stopping when the wait begins: its StopFunc takes 2 s.
				e.m.UpdateController("earlier", ControllerParams{DoFunc: NoopFunc, StopFunc: slowStop(2 * time.Second)})
				// Removed by the wait: its StopFunc takes 1 s.
				e.m.UpdateController("present", ControllerParams{DoFunc: NoopFunc, StopFunc: slowStop(time.Second)})
				synctest.Wait()
				require.NoError(t, e.m.RemoveController("earlier"))

				// An owner's event handler goes on installing and removing
				// controllers, each stopping for 3 s, every 500 ms for 10 s.
				churnDone := make(chan struct{})
				go func() {
					defer close(churnDone)
					for i := range 20 {
						time.Sleep(500 * time.Millisecond)
						name := fmt.Sprintf("churn-%d", i)
						e.m.UpdateController(name, ControllerParams{DoFunc: NoopFunc, StopFunc: slowStop(3 * time.Second)})
						synctest.Wait()
						_ = e.m.RemoveController(name)
					}
				}()
				time.Sleep(250 * time.Millisecond)
				start := time.Now()
				if shutdown {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					assert.NoError(t, e.m.Shutdown(ctx), "nothing it waits for outlives the deadline")
					cancel()
				} else {
					e.m.RemoveAllAndWait()
				}
				assert.Equal(t, 1750*time.Millisecond, time.Since(start), "the wait ends when \"earlier\" (removed 250 ms before it) has stopped")
				assert.True(t, e.m.Lookup("present") == nil)
				<-churnDone
				e.m.RemoveAllAndWait()
			})
		})
	}
}

// A Shutdown whose deadline passes names the controllers it waited for that
// are still running, not those removed after it began.
func TestShutdownNamesOnlyWhatItWaitedFor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		block := func(ctx context.Context) error { <-ctx.Done(); return nil }
		e.m.UpdateController("stuck", ControllerParams{DoFunc: NoopFunc, StopFunc: block})
		synctest.Wait()
		go func() {
			time.Sleep(time.Second)
			e.m.UpdateController("later", ControllerParams{DoFunc: NoopFunc, StopFunc: func(context.Context) error {
				time.Sleep(time.Hour)
				return nil
			}})
			synctest.Wait()
			_ = e.m.RemoveController("later")
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		err := e.m.Shutdown(ctx)
		assert.EqualError(t, err, "controller: shutdown: context deadline exceeded; still running: stuck")
		e.m.RemoveAllAndWait()
	})
}
