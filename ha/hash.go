// Which member runs a name in Leader mode, the oldest: a pure function of
// the membership view (Spread's rendezvous hashing is package place).

package ha

import (
	"crypto/rand"
	"encoding/hex"
)

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
