// uuid.go: the controllers' random UUIDs.

package controller

import (
	crand "crypto/rand"
	"sync"

	"github.com/google/uuid"
)

// ids hands out the random bytes of UUIDs from a buffer refilled from
// crypto/rand, so creating a controller does not cost a system call. It
// changes no setting of the uuid package.
var ids struct {
	sync.Mutex
	buf  [16 * 256]byte
	left int // UUIDs left in buf
}

// newUUID writes the bytes of a random (version 4) UUID to dst.
func newUUID(dst *[16]byte) {
	var u uuid.UUID
	ids.Lock()
	if ids.left == 0 {
		_, _ = crand.Read(ids.buf[:]) // never fails (crypto/rand.Read, Go ≥ 1.24)
		ids.left = len(ids.buf) / 16
	}
	ids.left--
	copy(u[:], ids.buf[ids.left*16:])
	ids.Unlock()
	u[6] = u[6]&0x0f | 0x40 // version 4
	u[8] = u[8]&0x3f | 0x80 // RFC 4122 variant
	*dst = u
}

// formatUUID writes u as xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx to dst, which
// holds at least 36 bytes.
func formatUUID(dst []byte, u [16]byte) {
	_ = dst[35]
	const hexDigits = "0123456789abcdef"
	j := 0
	for i, b := range u {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			dst[j] = '-'
			j++
		}
		dst[j], dst[j+1] = hexDigits[b>>4], hexDigits[b&0x0f]
		j += 2
	}
}
