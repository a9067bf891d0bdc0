// Tests of the ownership functions: stable values, an even spread, and
// minimal movement when members come and go.

package place

import (
	"fmt"
	"hash/fnv"
	"math"
	"testing"
)

// The score must not change between versions: replicas of two versions
// sharing a prefix would disagree on owners. The values below were
// recorded once; each is also checked against the standard library's
// FNV-1a and the finalizer written out again.
func TestScoreIsStable(t *testing.T) {
	for _, tc := range []struct {
		member, name string
		want         uint64
	}{
		{"", "", 0x25fc6dd36ce04b20},
		{"r0", "name-0000", 0xfb0d25dc33883aba},
		{"r1", "name-0000", 0x4dd28ffa01e78f6e},
		{"host-a", "endpoint-12-sync", 0xd95d03ee09ba6553},
	} {
		if got := Score(tc.member, tc.name); got != tc.want {
			t.Errorf("Score(%q, %q) = %#x, want %#x", tc.member, tc.name, got, tc.want)
		}
		h := fnv.New64a()
		h.Write([]byte(tc.member + "\x00" + tc.name))
		x := h.Sum64()
		x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
		x = (x ^ x>>27) * 0x94d049bb133111eb
		x ^= x >> 31
		if x != tc.want {
			t.Errorf("FNV-1a + splitmix64 of %q, %q = %#x, want %#x", tc.member, tc.name, x, tc.want)
		}
	}
}

func TestSpreadIsEven(t *testing.T) {
	for _, members := range [][]string{
		{"r0", "r1", "r2"},
		{"a", "b"},
		{"host-1-0a1b2c3d", "host-2-9f8e7d6c", "host-3-00000000", "host-4-ffffffff", "host-5-12345678"},
	} {
		const names = 30000
		count := map[string]int{}
		for i := range names {
			count[Owner(fmt.Sprintf("name-%04d", i), members)]++
		}
		fair := float64(names) / float64(len(members))
		for _, m := range members {
			if dev := math.Abs(float64(count[m])-fair) / fair; dev > 0.05 {
				t.Errorf("members %v: %s owns %d of %d names, %.1f%% off an even share", members, m, count[m], names, 100*dev)
			}
		}
	}
}

// A member that joins takes names only from others, and only its share;
// one that leaves gives away only its own.
func TestSpreadMovesOnlyTheShareOfWhoJoinsOrLeaves(t *testing.T) {
	before := []string{"r0", "r1", "r2"}
	after := []string{"r0", "r1", "r2", "r3"}
	const names = 20000
	moved := 0
	for i := range names {
		name := fmt.Sprintf("n%d", i)
		a, b := Owner(name, before), Owner(name, after)
		if a != b {
			moved++
			if b != "r3" {
				t.Fatalf("%s moved from %s to %s when r3 joined", name, a, b)
			}
		}
	}
	if share := float64(moved) / names; math.Abs(share-0.25) > 0.02 {
		t.Errorf("a fourth member took %.1f%% of the names, want about 25%%", 100*share)
	}
}

func TestOwnersOfNoMembers(t *testing.T) {
	if got := Owner("x", nil); got != "" {
		t.Errorf("Owner with no members = %q", got)
	}
}
