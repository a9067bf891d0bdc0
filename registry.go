// registry.go: the process-wide registry of Managers behind GetGlobalStatus.

package controller

import (
	"slices"
	"strings"
	"sync"
)

// registry holds every Manager that has controllers installed, for
// GetGlobalStatus. A Manager is in it only while it has controllers, so an
// emptied Manager can be garbage collected.
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

func (r *managerRegistry) remove(m *Manager) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.managers, m)
}

// GetGlobalStatus returns the status of every installed controller of every
// Manager in the process (but those of [FakeManager]s), sorted by name, then
// by UUID.
func GetGlobalStatus() ControllerStatuses {
	registry.mu.Lock()
	ms := make([]*Manager, 0, len(registry.managers))
	for m := range registry.managers {
		ms = append(ms, m)
	}
	registry.mu.Unlock()
	var cs []*Controller
	for _, m := range ms {
		m.mu.Lock()
		for _, c := range m.controllers {
			cs = append(cs, c)
		}
		m.mu.Unlock()
	}
	slices.SortFunc(cs, func(a, b *Controller) int {
		if c := strings.Compare(a.name, b.name); c != 0 {
			return c
		}
		return strings.Compare(a.UUID(), b.UUID())
	})
	return statusesOf(cs)
}

// statusesOf returns the statuses of cs, in their order, in a constant
// number of allocations.
func statusesOf(cs []*Controller) ControllerStatuses {
	out := make(ControllerStatuses, len(cs))
	ss := make([]ControllerStatus, len(cs))
	cfgs := make([]ControllerStatusConfiguration, len(cs))
	sts := make([]ControllerStatusStatus, len(cs))
	for i, c := range cs {
		c.fillStatus(&ss[i], &cfgs[i], &sts[i])
		out[i] = &ss[i]
	}
	return out
}
