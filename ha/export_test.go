// What the package's external tests (ha_test) reach of its internals.

package ha

import "time"

// MemGroup returns the in-memory store's part in a conformance case: a
// fresh store, a backend per replica, and its faults.
func MemGroup() (backend func(id string) Backend, slowBegin func(time.Duration), loseBegin func()) {
	st := newMemStore()
	return func(id string) Backend { return st.replica(id, 2*time.Second) },
		func(d time.Duration) { st.inject("begin", memFault{delay: d, once: true}) },
		func() { st.inject("begin", memFault{lost: true, once: true}) }
}
