// Package hatest checks a store against the contract the Replicas of
// package ha rely on: the cases of [Cases], each run on a fresh group of
// the store under test. Every store of this repository passes all of
// them: the etcd store (ha/etcd) against a real etcd and the Kubernetes
// store (ha/kube) against a real kube-apiserver, in real time, and
// the in-memory store of package [github.com/bgctl/controller/ha/sim],
// the reference implementation, inside a testing/synctest bubble, exact
// and instant.
//
// # Running it on a store of your own
//
// A store of your own runs them from a test of its own, each case in a
// group of its own (a fresh, empty group: a new database, or a prefix no
// other case uses), in real time unless the store can run in a
// testing/synctest bubble. Backend makes a backend as a Replica would:
// it fills every field of [ha.BackendConfig], with the TTL of this
// package. newGroup and the hooks' methods below stand for the store's
// own:
//
//	func TestConformance(t *testing.T) {
//		for _, c := range hatest.Cases() {
//			t.Run(c.Name, func(t *testing.T) {
//				st := newGroup(t) // an ha.Store over an empty group
//				w := hatest.TTL - hatest.TTL/4
//				c.Test(t, hatest.Group{
//					Backend: func(id string) ha.Backend {
//						b, err := st.Backend(ha.BackendConfig{
//							Group: "/conformance", ID: id, TTL: hatest.TTL,
//							Window: w, RenewEvery: w / 4, RequestTimeout: 2 * time.Second,
//							Logger: slog.New(slog.DiscardHandler), Stopping: t.Context(),
//						})
//						if err != nil {
//							t.Fatal(err)
//						}
//						return b
//					},
//					Slack: 100 * time.Millisecond, // see Group.Slack
//					Early: 50 * time.Millisecond,  // see Group.Early
//					NewReplica: func(id string, o ha.Options) (*ha.Replica, error) {
//						o.Prefix, o.ID = "/conformance", id
//						return ha.New(st, o)
//					},
//					// The optional hooks, where the store offers them:
//					SlowBegin: st.HoldNextBeginAnswer,
//					LoseBegin: st.LoseNextBeginAnswer,
//					EndEarly:  func(id string) { st.EndSessionOf(id) },
//					Compact:   st.Compact,
//				})
//			})
//		}
//	}
//
// A case a store cannot run for lack of a hook (LoseBegin, Compact,
// NewReplica) is skipped, saying so; every other case must pass. In real
// time the whole suite takes about half a minute on a local store.
package hatest
