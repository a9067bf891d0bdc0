// Tests of GetGlobalStatus.

package controller

import (
	"strings"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
)

// GetGlobalStatus lists the controllers of every Manager (not those of a
// FakeManager), sorted by name and UUID; a Manager whose controllers are
// all removed leaves it.
func TestGetGlobalStatus(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m1, m2 := NewManager(WithMetrics(nil)), NewManager(WithMetrics(nil))
		a2 := m2.UpdateController("global-a", ControllerParams{DoFunc: NoopFunc})
		a1 := m1.UpdateController("global-a", ControllerParams{DoFunc: NoopFunc})
		m1.UpdateController("global-b", ControllerParams{DoFunc: NoopFunc})
		fake := FakeManager(1)
		var names []string
		for _, s := range GetGlobalStatus() {
			if strings.HasPrefix(s.Name, "global-") || strings.HasPrefix(s.Name, "controller-") {
				names = append(names, s.Name+"/"+s.UUID)
			}
		}
		first, second := a1.UUID(), a2.UUID()
		if second < first {
			first, second = second, first
		}
		assert.Equal(t, []string{"global-a/" + first, "global-a/" + second, "global-b/" + m1.Lookup("global-b").UUID()}, names)
		m1.RemoveAllAndWait()
		m2.RemoveAllAndWait()
		fake.RemoveAllAndWait()
		for _, s := range GetGlobalStatus() {
			assert.False(t, strings.HasPrefix(s.Name, "global-"))
		}
		registry.mu.Lock()
		_, held := registry.managers[m1]
		registry.mu.Unlock()
		assert.False(t, held, "an emptied Manager leaves the registry")
	})
}
