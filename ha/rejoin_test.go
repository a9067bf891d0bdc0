// Tests of the pauses between attempts to join again.

package ha

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// The pauses between attempts to join again double; they stop at 200ms
// while etcd does not let the replica in, at TTL while another replica
// holds its ID, and fall back to 200ms when the duplicate is gone.
func TestRejoinWait(t *testing.T) {
	const ttl = 10 * time.Second
	dup := fmt.Errorf("%w: %q", ErrDuplicateID, "r0")
	unreachable := context.DeadlineExceeded
	for _, tc := range []struct {
		wait time.Duration
		err  error
		want time.Duration
	}{
		{firstRejoinWait, unreachable, 40 * time.Millisecond},
		{160 * time.Millisecond, unreachable, 200 * time.Millisecond},
		{200 * time.Millisecond, unreachable, 200 * time.Millisecond},
		{firstRejoinWait, dup, 40 * time.Millisecond},
		{200 * time.Millisecond, dup, 400 * time.Millisecond},
		{5120 * time.Millisecond, dup, ttl},
		{ttl, dup, ttl},
		{ttl, unreachable, 200 * time.Millisecond},
	} {
		if got := rejoinWait(tc.wait, tc.err, ttl); got != tc.want {
			t.Errorf("rejoinWait(%v, %v, %v) = %v, want %v", tc.wait, tc.err, ttl, got, tc.want)
		}
	}
}
