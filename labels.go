// labels.go: the pprof labels every controller goroutine carries, so that
// profiles and goroutine dumps name the controller each goroutine serves.

package controller

import (
	"context"
	"runtime/pprof"
)

// The pprof label keys of a controller's goroutine: its name, and the
// group of the parameters it runs with (left out for the zero Group). A
// CPU profile attributes the samples of every DoFunc to them
// (go tool pprof -tagfocus controller=NAME), and a goroutine dump with
// debug=1 prints them above each controller's stack:
//
//	# labels: {"controller":"endpoint-12-sync", "group":"endpoint-sync"}
//
// Goroutines a DoFunc starts inherit them. They are the goroutine's, not
// the run context's, which would cost a context per controller:
// pprof.Label(ctx, …) does not find them, and a DoFunc that calls
// pprof.Do(ctx, labels, f) runs f with ctx's labels and its own, and
// leaves the goroutine with ctx's labels alone: none, unless the
// parameters' Context carries some. The goroutine (and those it starts
// after) is then unlabelled until an update to another group labels it
// again. A DoFunc that uses pprof.Do keeps them with a Context that
// carries them:
//
//	Context: pprof.WithLabels(ctx, pprof.Labels(controller.ControllerLabel, name, controller.GroupLabel, group))
const (
	ControllerLabel = "controller"
	GroupLabel      = "group"
)

// labelsContext returns the context that carries the labels of the
// goroutine of controller name, in group: three allocations (the label
// list, the runtime's label map and this context), of which the goroutine
// keeps the first two (88 bytes with a group, 56 without).
func labelsContext(name, group string) context.Context {
	if group == "" {
		return pprof.WithLabels(context.Background(), pprof.Labels(ControllerLabel, name))
	}
	return pprof.WithLabels(context.Background(), pprof.Labels(ControllerLabel, name, GroupLabel, group))
}

// labelAtStart labels the controller's goroutine as it starts, with the
// labels newController made: they are made by the installer, because
// allocating them here, below the loop's frame, would make the goroutine
// outgrow its initial stack (TestIdleControllerKeepsTheInitialStack). A
// later update to another group labels it again: before the next run
// (adopt), or, when a removal came with it, before the StopFunc (finish).
//
//go:noinline
func (c *Controller) labelAtStart() {
	c.mu.Lock()
	labels := c.takeLabelsLocked()
	c.mu.Unlock()
	pprof.SetGoroutineLabels(labels)
}

// relabel labels the controller's goroutine for group, after an update
// brought it.
//
//go:noinline
func (c *Controller) relabel(group string) {
	pprof.SetGoroutineLabels(labelsContext(c.name, group))
}
