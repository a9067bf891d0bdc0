// Tests of the etcd key layout and member record format, and of a Store
// on no client.

package etcd

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/bgctl/controller/ha"
)

func TestMemberValue(t *testing.T) {
	for _, tc := range []struct {
		id, value, digest string
		leaving           bool
	}{
		{"r0", memberValue("r0", "ab", false), "ab", false},
		{"r0", memberValue("r0", "ab", true), "ab", true},
		{"r0", "r0", "", false},           // an earlier version
		{"r0", "r0 (leaving)", "", true},  // an earlier version, leaving
		{"r0", "someone else", "", false}, // not its own: nothing known
		{"r0", "r0 names=", "", false},    // no names registered would be 32 zeros
	} {
		d, l := parseMemberValue(tc.id, tc.value)
		if d != tc.digest || l != tc.leaving {
			t.Errorf("parseMemberValue(%q, %q) = %q, %v; want %q, %v", tc.id, tc.value, d, l, tc.digest, tc.leaving)
		}
	}
}

func TestChunkKey(t *testing.T) {
	k := keysOf("/svc")
	key := k.chunkKey("r0", "ab", 2, 3)
	if key != "/svc/name-sets/r0/ab/2-of-3" {
		t.Errorf("chunkKey: %s", key)
	}
	id, d, i, n, ok := parseChunkKey(key[len(k.names):])
	if !ok || id != "r0" || d != "ab" || i != 2 || n != 3 {
		t.Errorf("parseChunkKey: %s %s %d %d %v", id, d, i, n, ok)
	}
	for _, bad := range []string{"r0/ab", "r0/ab/3-of-3", "r0/ab/x-of-3", "r0/ab/0-of-0", "r0/ab/1/0-of-1"} {
		if _, _, _, _, ok := parseChunkKey(bad); ok {
			t.Errorf("parseChunkKey(%q) ok", bad)
		}
	}
}

// A Store on no client is refused when a Replica is made on it, with an
// error that says so.
func TestNilClientIsRefused(t *testing.T) {
	if _, err := ha.Join(context.Background(), Store(nil), ha.Options{Prefix: "p"}); !errors.Is(err, ha.ErrInvalidOptions) || !strings.Contains(err.Error(), "etcd client must not be nil") {
		t.Errorf("Join with a nil etcd client: %v", err)
	}
}
