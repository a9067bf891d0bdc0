// Tests of ExitReason.

package controller

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
)

// ExitReason is recognised with errors.As semantics: wrapped, joined, or
// through a custom As; a plain error is not one.
func TestIsExitReason(t *testing.T) {
	er := NewExitReason("done")
	assert.True(t, isExitReason(er))
	assert.True(t, isExitReason(fmt.Errorf("x: %w", er)))
	assert.True(t, isExitReason(errors.Join(errBoom, er)))
	assert.False(t, isExitReason(errBoom))
	assert.False(t, isExitReason(fmt.Errorf("x: %w", errBoom)))
	assert.Equal(t, "exit reason", ExitReason{}.Error())
	assert.Equal(t, "done", er.Error())
	assert.NotNil(t, errors.Unwrap(er))
}
