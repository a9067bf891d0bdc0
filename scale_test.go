// The million-controller measurement, run on demand (CONTROLLER_SCALE).

package controller

import (
	"os"
	"runtime"
	"runtime/metrics"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestScale installs a million controllers, waits for all their first
// runs, and removes them, printing the times and the peak memory. It is
// not part of the regular suite (it needs a few GB); run it with
//
//	CONTROLLER_SCALE=1000000 go test -run TestScale -v -timeout 10m .
//
// The targets on a 2-core machine: created with all first runs done in 4 s,
// removed in 2 s, within 3.5 GB.
func TestScale(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("CONTROLLER_SCALE"))
	if n <= 0 {
		t.Log("set CONTROLLER_SCALE=<controllers> to run the scale test")
		return
	}
	ns := names(n)
	m := benchManager(t)
	runtime.GC()
	base := processMemory()

	start := time.Now()
	installAll(m, ns)
	created := time.Since(start)
	peak := processMemory()

	start = time.Now()
	m.RemoveAllAndWait()
	removed := time.Since(start)

	t.Logf("%d controllers: created with first runs in %v (%.0f ns each), removed in %v (%.0f ns each)",
		n, created, float64(created)/float64(n), removed, float64(removed)/float64(n))
	t.Logf("memory: %.2f GB above the start (%.0f bytes per controller), %.2f GB in all",
		float64(peak-base)/1e9, float64(peak-base)/float64(n), float64(peak)/1e9)
	assert.Empty(t, m.GetStatusModel())
}

// processMemory returns the bytes the Go runtime holds from the OS.
func processMemory() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/total:bytes"}, {Name: "/memory/classes/heap/released:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64() - s[1].Value.Uint64()
}
