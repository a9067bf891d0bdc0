// The contract every store keeps (package hatest), on the test server,
// each case in a group of its own, in parallel, in real time.

package postgres

import (
	"errors"
	"testing"
	"time"

	"github.com/bgctl/controller/ha"
	"github.com/bgctl/controller/ha/hatest"
)

func TestBackendConformancePostgres(t *testing.T) {
	for _, tc := range hatest.Cases() {
		t.Run(tc.Name, func(t *testing.T) {
			t.Parallel() // each in a group of its own; the waits overlap
			pool := newPool(t, 8)
			st, err := newStore(pool, StoreOptions{})
			if err != nil {
				t.Fatal(err)
			}
			// The Begin hooks: set once, read by the next Begin alone.
			var hold time.Duration
			var lose bool
			st.afterBegin = func() error {
				d, l := hold, lose
				hold, lose = 0, false
				time.Sleep(d)
				if l {
					return errors.New("the answer to the commit was lost (test)")
				}
				return nil
			}
			group := newGroup(tc.Name)
			tc.Test(t, hatest.Group{
				Backend: func(id string) ha.Backend {
					w := hatest.TTL - hatest.TTL/4
					return st.backend(ha.BackendConfig{Group: group, ID: id, TTL: hatest.TTL, RequestTimeout: 2 * time.Second, RenewEvery: w / 4, Window: w})
				},
				Early:     300 * time.Millisecond,
				Slack:     300 * time.Millisecond,
				SlowBegin: func(d time.Duration) { hold = d },
				LoseBegin: func() { lose = true },
				NewReplica: func(id string, o ha.Options) (*ha.Replica, error) {
					o.Prefix, o.ID = group+"-replicas", id
					return ha.New(Store(pool, StoreOptions{}), o)
				},
				// The log pruned up to the group's position, as the
				// feed's pruning does past the retention.
				Compact: func() {
					if _, err := pool.Exec(t.Context(), st.q.sql(sqlPrune), group, 0); err != nil {
						t.Fatalf("pruning the change log: %v", err)
					}
				},
			})
		})
	}
}
