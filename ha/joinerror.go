// Why a replica whose fence passed is not a member again yet: logged (a
// duplicate ID at Warn, rate-limited) and shown in Status.

package ha

import (
	"errors"
	"fmt"
	"time"
)

// duplicateWarnEvery is how often, at most, a replica that cannot join
// again because another live replica has its ID says so at Warn. It
// retries meanwhile, since the other may go away, backing off to one
// attempt per TTL (rejoinWait).
const duplicateWarnEvery = 30 * time.Second

// rejoinLog reports the attempts of one rejoin. Owned by the loop
// goroutine.
type rejoinLog struct {
	warned  time.Time // the last Warn about a duplicate ID; zero: none yet
	dropped int       // duplicate-ID attempts since that Warn
}

// reportRejoin logs the outcome of an attempt to join again, err nil for a
// success, and keeps the error for Status.
func (r *Replica) reportRejoin(l *rejoinLog, err error) {
	r.mu.Lock()
	r.joinErr = err
	r.mu.Unlock()
	switch {
	case err == nil:
		if !l.warned.IsZero() {
			r.log.Info("joined again: no other live replica has this ID any more")
		}
	case errors.Is(err, ErrDuplicateID):
		l.dropped++
		if l.warned.IsZero() || time.Since(l.warned) >= duplicateWarnEvery {
			r.log.Warn(fmt.Sprintf("cannot join again: another live replica uses this ID; retrying, and saying so at most every %v", duplicateWarnEvery),
				"error", err, "attempts", l.dropped)
			l.warned, l.dropped = time.Now(), 0
		}
	default:
		r.log.Debug("joining again", "error", err)
	}
}
