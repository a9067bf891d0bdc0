// Tests of FakeManager.

package controller

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// FakeManager gives a test of a status consumer controllers that look
// failing, with fixed names and UUIDs, and that can be triggered and
// removed like real ones.
func TestFakeManager(t *testing.T) {
	m := FakeManager(2)
	sts := m.GetStatusModel()
	require.Len(t, sts, 2)
	assert.Equal(t, "controller-0", sts[0].Name)
	assert.Equal(t, "00000000-0000-4000-8000-000000000001", sts[1].UUID)
	assert.Equal(t, "controller failed", sts[0].Status.LastFailureMsg)
	assert.Equal(t, int64(1), sts[1].Status.ConsecutiveFailureCount)
	assert.ErrorContains(t, m.Health(), `controller "controller-1": 1 consecutive failure: controller failed`)
	assert.True(t, m.TriggerController("controller-0"))
	term := m.TerminationChannel("controller-0")
	require.NoError(t, m.RemoveController("controller-0"))
	select {
	case <-term:
	default:
		t.Fatal("removal did not close the termination channel")
	}
	m.RemoveAllAndWait()
	assert.Empty(t, m.GetStatusModel())
}
