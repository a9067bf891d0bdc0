// The feed of a backend: the store's log delivered from a position, the
// progress between changes, and the expiry of sessions on time.

package sim

import (
	"fmt"
	"sort"
	"time"

	"github.com/bgctl/controller/ha"
)

// feed is one replica's feed of the store's changes ([Backend.Watch]).
type feed struct {
	out  chan ha.FeedBatch // unbuffered: the goroutine hands each batch over
	quit chan struct{}     // closed by Stop
	done chan struct{}     // closed as the feed's goroutine returns
}

// Batches is where the feed delivers.
func (f *feed) Batches() <-chan ha.FeedBatch { return f.out }

// Stop ends the feed and waits for its goroutine.
func (f *feed) Stop() {
	close(f.quit)
	<-f.done
}

// deliver hands f the log's batches after position from, and a batch of
// progress alone whenever it delivered nothing for RenewEvery, until
// Stop. While b's link blocks (crash, partition, pause) it delivers
// nothing, and goes on where it was when it opens. It also ends each
// session at the moment its validity runs out, so that its end reaches
// the feeds then and not at the next request.
func (b *Backend) deliver(f *feed, from int64) {
	s := b.st
	delivered := time.Now()
	every := b.cfg.RenewEvery
	for {
		s.mu.Lock()
		s.initLocked()
		now := time.Now()
		s.expireLocked(now)
		var batch ha.FeedBatch
		ready := false
		wait, expiring := s.nextExpiryLocked(now)
		if blocked, _ := b.linkLocked(); !blocked && from < s.compact {
			// What the feed had yet to deliver is forgotten.
			batch, ready = ha.FeedBatch{At: from, Err: fmt.Errorf("%w: the feed stood at position %d, before %d", ErrCompacted, from, s.compact)}, true
		} else if !blocked {
			// The log's first batch after from: found by position, as
			// Compact drops the log's head.
			next := sort.Search(len(s.log), func(i int) bool { return s.log[i].At > from })
			switch progressDue := delivered.Add(every); {
			case next < len(s.log):
				batch, ready = s.log[next], true
			case !now.Before(progressDue):
				batch, ready = ha.FeedBatch{At: s.rev}, true
			case !expiring || progressDue.Sub(now) < wait:
				wait, expiring = progressDue.Sub(now), true
			}
		}
		wake := s.wake
		s.mu.Unlock()

		sent, quit := f.await(batch, ready, wake, wait, expiring)
		switch {
		case quit:
			return
		case !sent:
			continue
		}
		delivered = time.Now()
		if batch.Err != nil {
			<-f.quit // a failed feed delivers nothing more
			return
		}
		from = max(from, batch.At)
	}
}

// await hands batch to f's replica, if ready, and waits until it is
// received (sent), the store changes (wake is closed), wait has passed
// (if expiring), or Stop (quit).
//
// A batch waits for its replica only until the store changes: a Pause,
// Partition or Crash meanwhile must hold or drop it as it does the
// batches after it (the caller checks the link again, and makes the
// same batch again). And the first session's expiry is waited for while
// a batch waits as well: a session ends at the moment its validity runs
// out even while every feed's replica is busy.
func (f *feed) await(batch ha.FeedBatch, ready bool, wake <-chan struct{}, wait time.Duration, expiring bool) (sent, quit bool) {
	var out chan<- ha.FeedBatch // nil, which never receives, unless ready
	if ready {
		out = f.out
	}
	var timeout <-chan time.Time
	if expiring {
		timer := time.NewTimer(wait)
		defer timer.Stop()
		timeout = timer.C
	}
	select {
	case out <- batch:
		return true, false
	case <-wake:
	case <-timeout:
	case <-f.quit:
		return false, true
	}
	return false, false
}
