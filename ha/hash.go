// Which member runs a name: rendezvous hashing for Spread, the oldest
// member for Leader. Pure functions of the membership view.

package ha

import (
	"crypto/rand"
	"encoding/hex"
)

// score is the rendezvous weight of member for name: FNV-1a over
// member, a zero byte and name, then a 64-bit finalizer (splitmix64's) so
// that names differing in their last byte still spread evenly. It must be
// the same function on every replica of every version that shares a
// prefix (TestScoreIsStable pins its values). FNV-1a is written out rather
// than taken from hash/fnv, whose result it equals, because spreadOwner
// scores every member for every name: the loop allocates nothing and
// needs no []byte of the strings.
func score(member, name string) uint64 {
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

// spreadOwner returns the member with the highest score for name, the
// greater ID on a tie; "" when there are no members.
func spreadOwner(name string, members []string) string {
	var best string
	var bestScore uint64
	for _, m := range members {
		s := score(m, name)
		if best == "" || s > bestScore || (s == bestScore && m > best) {
			best, bestScore = m, s
		}
	}
	return best
}

// spreadOwnerWhere is spreadOwner over the members whose index ok
// accepts: those known to register name. The same scores, so that a
// member registering every name wins the same names either way; ok is
// called, not a filtered slice built, so that no name allocates.
func spreadOwnerWhere(name string, members []string, ok func(i int) bool) string {
	var best string
	var bestScore uint64
	for i, m := range members {
		if !ok(i) {
			continue
		}
		s := score(m, name)
		if best == "" || s > bestScore || (s == bestScore && m > best) {
			best, bestScore = m, s
		}
	}
	return best
}

// oldestMember returns the member whose key has the lowest create
// revision, the smaller ID on a tie; "" when there are none.
func oldestMember(members map[string]int64) string {
	var best string
	var bestRev int64
	for m, rev := range members {
		if best == "" || rev < bestRev || (rev == bestRev && m < best) {
			best, bestRev = m, rev
		}
	}
	return best
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails on the platforms Go supports
	return hex.EncodeToString(b)
}
