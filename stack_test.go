//go:build !race

package controller

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
)

// An idle controller keeps the 2 KiB stack the runtime starts a goroutine
// with: the run loop's frame, and whatever its first run calls, fit in it.
// A stack that grew stays grown (the runtime shrinks it only when under a
// quarter is used), which would cost every idle controller 2 KiB more.
// Built without -race, whose instrumentation makes every frame larger; CI
// runs it on its own.
func TestIdleControllerKeepsTheInitialStack(t *testing.T) {
	const n = 20_000
	m := benchManager(t)
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	installAll(m, names(n))
	runtime.GC()
	runtime.ReadMemStats(&after)
	m.RemoveAllAndWait()
	perController := float64(after.StackInuse-before.StackInuse) / n
	assert.LessOrEqual(t, perController, 2048.0+8, "stack bytes per idle controller")
}
