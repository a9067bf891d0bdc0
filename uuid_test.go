// Tests of UUID generation.

package controller

import (
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Every controller gets a distinct random UUID (version 4, RFC 4122
// variant) in the canonical 36-character form.
func TestUUIDsAreUniqueVersion4(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		var u [16]byte
		newUUID(&u)
		var b [36]byte
		formatUUID(b[:], u)
		id := string(b[:])
		require.Equal(t, uuid.UUID(u).String(), id, "the canonical form")
		require.Len(t, id, 36)
		require.Equal(t, byte('4'), id[14], id)
		require.Contains(t, "89ab", string(id[19]), id)
		require.False(t, seen[id])
		seen[id] = true
	}
	var u [16]byte
	newUUID(&u)
	c := &Controller{uuid: u}
	assert.Equal(t, 4, strings.Count(c.UUID(), "-"))
}
