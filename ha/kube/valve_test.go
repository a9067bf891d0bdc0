// A valve: what crosses it waits while it is shut, for the tests' proxies
// and transports that hold bytes for a while.

package kube

import "sync"

// valve is open or shut; a reader waits for gate while it is shut. The
// zero value is unusable: newValve returns an open one.
type valve struct {
	mu   sync.Mutex
	open chan struct{} // guarded by mu; closed while the valve is open
}

func newValve() *valve {
	v := &valve{open: make(chan struct{})}
	close(v.open)
	return v
}

// shut holds what crosses from now until release.
func (v *valve) shut() {
	v.mu.Lock()
	defer v.mu.Unlock()
	select {
	case <-v.open:
		v.open = make(chan struct{})
	default: // already shut
	}
}

// release lets what was held cross, and what comes later.
func (v *valve) release() {
	v.mu.Lock()
	defer v.mu.Unlock()
	select {
	case <-v.open:
	default:
		close(v.open)
	}
}

// gate returns a channel that is closed while the valve is open.
func (v *valve) gate() <-chan struct{} {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.open
}
