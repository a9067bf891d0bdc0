package controller

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

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
