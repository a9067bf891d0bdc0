// Rendezvous hashing: a member's score for a name, the owner, and the
// placement the tests expect of it.

package place

import (
	"slices"
)

// Score is the rendezvous weight of member for name: FNV-1a over
// member, a zero byte and name, then a 64-bit finalizer (splitmix64's) so
// that names differing in their last byte still spread evenly. It must be
// the same function on every replica of every version that shares a
// prefix (TestScoreIsStable pins its values). FNV-1a is written out rather
// than taken from hash/fnv, whose result it equals, because Owner
// scores every member for every name: the loop allocates nothing and
// needs no []byte of the strings.
func Score(member, name string) uint64 {
	const offset, prime = 14695981039346656037, 1099511628211
	h := uint64(offset)
	for i := 0; i < len(member); i++ {
		h = (h ^ uint64(member[i])) * prime
	}
	h *= prime // the zero byte between the two strings
	for i := 0; i < len(name); i++ {
		h = (h ^ uint64(name[i])) * prime
	}
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	h ^= h >> 31
	return h
}

// Owner returns the member with the highest score for name, the
// greater ID on a tie; "" when there are no members.
func Owner(name string, members []string) string {
	var best string
	var bestScore uint64
	for _, m := range members {
		s := Score(m, name)
		if best == "" || s > bestScore || (s == bestScore && m > best) {
			best, bestScore = m, s
		}
	}
	return best
}

// OwnerWhere is Owner over the members whose index ok
// accepts: those known to register name. The same scores, so that a
// member registering every name wins the same names either way; ok is
// called, not a filtered slice built, so that no name allocates.
func OwnerWhere(name string, members []string, ok func(i int) bool) string {
	var best string
	var bestScore uint64
	for i, m := range members {
		if !ok(i) {
			continue
		}
		s := Score(m, name)
		if best == "" || s > bestScore || (s == bestScore && m > best) {
			best, bestScore = m, s
		}
	}
	return best
}

// Expected returns where each name runs once placement settled, given
// which names each member registers (regs, by member ID): its Owner among
// the members that register it.
func Expected(regs map[string][]string) map[string]string {
	by := map[string][]string{}
	for id, names := range regs {
		for _, name := range names {
			by[name] = append(by[name], id)
		}
	}
	want := make(map[string]string, len(by))
	for name, ids := range by {
		slices.Sort(ids)
		want[name] = Owner(name, ids)
	}
	return want
}

// On returns the names that want places on member, sorted.
func On(want map[string]string, member string) []string {
	var names []string
	for name, m := range want {
		if m == member {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}
