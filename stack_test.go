//go:build !race

package controller

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An idle controller keeps the 2 KiB stack the runtime starts a goroutine
// with: the run loop's frame, and whatever its first run calls, fit in it.
// A stack that grew stays grown (the runtime shrinks it only when under a
// quarter is used), which would cost every idle controller 2 KiB more.
//
// The measurement runs in a process of its own: stacks that earlier tests'
// goroutines left behind would blur it. The file is built without -race,
// whose instrumentation makes every frame larger; CI runs it on its own.
func TestIdleControllerKeepsTheInitialStack(t *testing.T) {
	const n = 20_000
	if os.Getenv("BGCTL_STACK_CHILD") == "1" {
		m := benchManager(t)
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		installAll(m, names(n))
		runtime.GC()
		runtime.ReadMemStats(&after)
		m.RemoveAllAndWait()
		fmt.Printf("stack bytes per idle controller: %.1f\n", float64(after.StackInuse-before.StackInuse)/n)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestIdleControllerKeepsTheInitialStack$", "-test.count=1")
	cmd.Env = append(os.Environ(), "BGCTL_STACK_CHILD=1")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	match := regexp.MustCompile(`stack bytes per idle controller: ([0-9.]+)`).FindSubmatch(out)
	require.NotNil(t, match, "%s", out)
	perController, err := strconv.ParseFloat(string(match[1]), 64)
	require.NoError(t, err)
	t.Logf("stack bytes per idle controller: %.1f", perController)
	assert.LessOrEqual(t, perController, 2048.0+8)
}
