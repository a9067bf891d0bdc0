// registry.go: the process-wide registry of Managers behind GetGlobalStatus.

package controller

import (
	"bytes"
	"slices"
	"strings"
	"sync"
	"time"
	"unsafe"
)

// registry holds every Manager that has controllers installed or stopping,
// for GetGlobalStatus, GetGlobalStoppingStatus and the metrics computed
// when scraped. A Manager is in it only while it has such controllers, so
// an emptied Manager can be garbage collected.
var registry managerRegistry

type managerRegistry struct {
	mu       sync.Mutex
	managers map[*Manager]struct{}
}

func (r *managerRegistry) add(m *Manager) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.managers == nil {
		r.managers = make(map[*Manager]struct{})
	}
	r.managers[m] = struct{}{}
}

// snapshot returns the registered Managers.
func (r *managerRegistry) snapshot() []*Manager {
	r.mu.Lock()
	defer r.mu.Unlock()
	ms := make([]*Manager, 0, len(r.managers))
	for m := range r.managers {
		ms = append(ms, m)
	}
	return ms
}

func (r *managerRegistry) remove(m *Manager) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.managers, m)
}

// GetGlobalStatus returns the status of every installed controller of every
// Manager in the process (but those of [FakeManager]s), sorted by name, then
// by UUID.
func GetGlobalStatus() ControllerStatuses {
	var cs []*Controller
	for _, m := range registry.snapshot() {
		m.mu.Lock()
		cs = m.installedLocked(cs)
		m.mu.Unlock()
	}
	slices.SortFunc(cs, compareController)
	return statusesOf(cs, formatUUIDs(cs), time.Now().UnixNano())
}

// installedLocked appends m's installed controllers to cs, in no order.
func (m *Manager) installedLocked(cs []*Controller) []*Controller {
	for _, c := range m.controllers {
		cs = append(cs, c)
	}
	return cs
}

// compareController orders controllers by name, then by UUID: the raw
// bytes sort as their lower-case hex text does.
func compareController(a, b *Controller) int {
	if c := strings.Compare(a.name, b.name); c != 0 {
		return c
	}
	return bytes.Compare(a.uuid[:], b.uuid[:])
}

// statusesOf returns the statuses of cs at now (Unix nanoseconds), in their
// order, in a constant number of allocations; uuids is formatUUIDs(cs).
func statusesOf(cs []*Controller, uuids string, now int64) ControllerStatuses {
	out := make(ControllerStatuses, len(cs))
	ss := make([]ControllerStatus, len(cs))
	cfgs := make([]ControllerStatusConfiguration, len(cs))
	sts := make([]ControllerStatusStatus, len(cs))
	for i, c := range cs {
		c.fillStatus(&ss[i], &cfgs[i], &sts[i], uuids[i*36:(i+1)*36], now)
		out[i] = &ss[i]
	}
	return out
}

// formatUUIDs returns the UUIDs of cs, 36 bytes each, in one string.
func formatUUIDs(cs []*Controller) string {
	if len(cs) == 0 {
		return ""
	}
	b := make([]byte, 36*len(cs))
	for i, c := range cs {
		formatUUID(b[i*36:], c.uuid)
	}
	// b is never written again: the string may share it, one allocation
	// for every UUID of the call.
	return unsafe.String(&b[0], len(b))
}
