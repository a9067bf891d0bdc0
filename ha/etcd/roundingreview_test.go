// Review of the Backend docs' promise on an idle feed, on etcd.

package etcd

import (
	"errors"
	"testing"
	"time"

	"github.com/bgctl/controller/ha"
)

// A replica alone in an idle group stays healthy: the Backend docs say
// an idle feed owes progress more often than Window (TTL − Margin). On
// etcd a keepalive writes no revision, so an idle prefix has no event at
// all: only the feed's progress requests keep it current.
func TestRoundingReviewIdleFeedOwesProgress(t *testing.T) {
	c := newCluster(t, 2, testOptions())
	n := c.join("r0")
	end := time.Now().Add(5 * (c.opts.TTL - c.opts.Margin))
	for time.Now().Before(end) {
		if err := n.r.Health(); errors.Is(err, ha.ErrWatchStalled) {
			t.Fatalf("an idle group's replica: %v", err)
		}
		time.Sleep(25 * time.Millisecond)
	}
}
