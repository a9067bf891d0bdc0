// The contract every store keeps (package hatest), on the Store, each
// case in a testing/synctest bubble of its own: exact and instant.

package sim_test

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/bgctl/controller/ha"
	"github.com/bgctl/controller/ha/hatest"
	"github.com/bgctl/controller/ha/sim"
)

func TestBackendConformanceMemory(t *testing.T) {
	for _, tc := range hatest.Cases() {
		t.Run(tc.Name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var st sim.Store
				tc.Test(t, hatest.Group{
					Backend: func(id string) ha.Backend {
						w := hatest.TTL - hatest.TTL/4
						b, _ := st.Backend(ha.BackendConfig{ID: id, TTL: hatest.TTL, RequestTimeout: 2 * time.Second, RenewEvery: w / 4, Window: w})
						return b
					},
					Early:     time.Nanosecond,
					SlowBegin: func(d time.Duration) { st.DelayAnswer("", sim.OpBegin, d) },
					LoseBegin: func() { st.LoseAnswer("", sim.OpBegin) },
					Compact:   st.Compact,
					EndEarly: func(id string) {
						if err := st.EndSession(id); err != nil {
							t.Fatal(err)
						}
					},
					NewReplica: func(id string, o ha.Options) (*ha.Replica, error) {
						o.Prefix, o.ID = "/conformance", id
						return ha.New(&st, o)
					},
				})
			})
		})
	}
}
