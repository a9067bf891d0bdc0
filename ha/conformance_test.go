// The contract every store keeps (package hatest), on the in-memory store
// inside a testing/synctest bubble.

package ha_test

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/bgctl/controller/ha"
	"github.com/bgctl/controller/ha/hatest"
)

// Each case of the contract against the in-memory store, in a bubble of
// its own: exact and instant.
func TestBackendConformanceMemory(t *testing.T) {
	for _, tc := range hatest.Cases() {
		t.Run(tc.Name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				backend, slowBegin, loseBegin := ha.MemGroup()
				tc.Test(t, hatest.Group{Backend: backend, Early: time.Nanosecond, SlowBegin: slowBegin, LoseBegin: loseBegin})
			})
		})
	}
}
