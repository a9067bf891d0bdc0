// Tests of the pprof labels on controller goroutines: what a goroutine dump
// shows, after an install and after updates.

package controller

import (
	"bytes"
	"context"
	"regexp"
	"runtime/pprof"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// labelsInDump returns the label sets a goroutine dump (debug=1) shows,
// one per group of goroutines, as pprof prints them.
func labelsInDump(t *testing.T) []string {
	t.Helper()
	var b bytes.Buffer
	require.NoError(t, pprof.Lookup("goroutine").WriteTo(&b, 1))
	var out []string
	for _, m := range regexp.MustCompile(`(?m)^# labels: (\{.*\})$`).FindAllStringSubmatch(b.String(), -1) {
		out = append(out, m[1])
	}
	return out
}

// Every controller goroutine carries its name and group, from its start,
// idle or running, and goroutines its DoFunc starts inherit them; an
// update that brings another group labels it anew, one that brings
// invalid parameters (which do not run) does not.
func TestGoroutineDumpNamesTheController(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		release := make(chan struct{})
		e.m.UpdateController("endpoint-12-sync", ControllerParams{Group: NewGroup("endpoint-sync"), DoFunc: func(context.Context) error {
			done := make(chan struct{})
			go func() { <-release; close(done) }() // a goroutine of the DoFunc's own
			<-done
			return nil
		}})
		e.m.UpdateController("gc", ControllerParams{DoFunc: NoopFunc})
		// Removed before its goroutine first ran: labelled all the same,
		// as it runs its first DoFunc and then its StopFunc.
		e.m.UpdateController("short-lived", ControllerParams{DoFunc: NoopFunc, Group: NewGroup("x"),
			StopFunc: func(context.Context) error { <-release; return nil }})
		require.NoError(t, e.m.RemoveController("short-lived"))
		synctest.Wait()
		labels := labelsInDump(t)
		assert.Contains(t, labels, `{"controller":"endpoint-12-sync", "group":"endpoint-sync"}`)
		assert.Contains(t, labels, `{"controller":"gc"}`, "no group label for the zero Group")
		assert.Contains(t, labels, `{"controller":"short-lived", "group":"x"}`)
		assert.Len(t, filter(labels, `"endpoint-12-sync"`), 2, "the controller's goroutine, and the one its DoFunc started")
		close(release)
		synctest.Wait()

		e.m.UpdateController("gc", ControllerParams{DoFunc: NoopFunc, Group: NewGroup("gc")})
		synctest.Wait()
		assert.Contains(t, labelsInDump(t), `{"controller":"gc", "group":"gc"}`, "an update to another group labels anew")
		e.m.UpdateController("gc", ControllerParams{DoFunc: nil, Group: NewGroup("broken")})
		synctest.Wait()
		labels = labelsInDump(t)
		assert.Contains(t, labels, `{"controller":"gc", "group":"gc"}`, "invalid parameters do not run: the labels stay")
		assert.Empty(t, filter(labels, `"broken"`))
		e.m.RemoveAllAndWait()
		synctest.Wait() // every goroutine of the bubble has exited
		assert.Empty(t, filter(labelsInDump(t), `"controller":`), "no controller goroutine is left")
	})
}

// filter returns the strings of ss that contain sub.
func filter(ss []string, sub string) []string {
	var out []string
	for _, s := range ss {
		if bytes.Contains([]byte(s), []byte(sub)) {
			out = append(out, s)
		}
	}
	return out
}

// Rule 8: the group follows the newest parameters. An update to another
// group that coalesces with a removal (both during a run) runs no DoFunc,
// and the StopFunc of the new parameters still runs under the new group's
// label.
func TestStopFuncRunsUnderTheNewestGroupLabel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		release, stop := make(chan struct{}), make(chan struct{})
		e.m.UpdateController("c", ControllerParams{Group: NewGroup("a"), DoFunc: func(context.Context) error { <-release; return nil }})
		synctest.Wait()
		e.m.UpdateController("c", ControllerParams{Group: NewGroup("b"), DoFunc: NoopFunc,
			StopFunc: func(context.Context) error { <-stop; return nil }})
		require.NoError(t, e.m.RemoveController("c"))
		close(release)
		synctest.Wait() // the StopFunc blocks
		assert.Contains(t, labelsInDump(t), `{"controller":"c", "group":"b"}`)
		close(stop)
		e.m.RemoveAllAndWait()
	})
}

// The documented limit of labels that are the goroutine's: a DoFunc that
// calls pprof.Do with its run context leaves the goroutine with that
// context's labels, none for controller "bare"; controller "kept", whose
// parameters' Context carries its labels, keeps them.
func TestLabelsAfterADoFuncUsingPprofDo(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		release := make(chan struct{})
		doFunc := func() ControllerFunc {
			runs := 0
			return func(ctx context.Context) error {
				if runs++; runs == 1 {
					pprof.Do(ctx, pprof.Labels("step", "fetch"), func(context.Context) {})
					return nil
				}
				<-release
				return nil
			}
		}
		e.m.UpdateController("bare", ControllerParams{DoFunc: doFunc()})
		e.m.UpdateController("kept", ControllerParams{DoFunc: doFunc(),
			Context: pprof.WithLabels(context.Background(), pprof.Labels(ControllerLabel, "kept"))})
		synctest.Wait()
		e.m.TriggerController("bare")
		e.m.TriggerController("kept")
		synctest.Wait() // the second runs block
		labels := labelsInDump(t)
		assert.Contains(t, labels, `{"controller":"kept"}`)
		assert.NotContains(t, labels, `{"controller":"bare"}`, "the limit ControllerLabel documents")
		close(release)
		e.m.RemoveAllAndWait()
	})
}
