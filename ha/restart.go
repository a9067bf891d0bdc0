// Restarts under a stable ID: a replica that crashed and starts again
// with the same ID waits for its previous incarnation's lease to run out,
// where a second live replica with that ID is refused.

package ha

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// restartPoll is how often awaitPreviousIncarnation reads the earlier
// run's session.
const restartPoll = 500 * time.Millisecond

// awaitPreviousIncarnation waits, within ctx, while this replica's member
// key is held under a lease that nobody renews: a previous incarnation of
// this replica (same ID) that crashed, whose lease runs out within its
// TTL. It returns nil once the key is free (or was), and an error
// wrapping ErrDuplicateID as soon as the lease is seen renewed: another
// live replica has this ID. A sample, at TTL 10s: the crashed
// incarnation's lease has 7s left at Join; the answers, every 500ms,
// imply it ends at the same moment give or take a second, and Join goes
// on about 7s later. A live duplicate renews every 1.875s, and is told
// apart once its renewals moved the end by more than a second and a
// round trip: within about 4s.
func (r *Replica) awaitPreviousIncarnation(ctx context.Context) error {
	gctx, cancel := context.WithTimeout(ctx, r.opts.RequestTimeout)
	lease, found, err := r.be.MemberSession(gctx)
	cancel()
	if err != nil {
		return err
	}
	if !found {
		return nil
	}
	// Each reading, sent at s and answered at v saying n left, puts the
	// lease's end in [s + n, v + n + short) (r.short: 1s on etcd, which
	// truncates; 0 on Kubernetes); the
	// readings are intersected (leaseAnswer.next). A reading whose range
	// lies wholly past the last range has seen the end move: a renewal.
	// One may come after a crash (a keepalive in flight as the process
	// died, or several sent together, which move the end by as much as
	// the time between them); a live replica renews every (TTL −
	// Margin)/4, so a second renewal, a range later again, tells it.
	var last leaseAnswer
	renewals := 0
	logged := false
	for {
		sent := time.Now()
		tctx, cancel := context.WithTimeout(ctx, r.opts.RequestTimeout)
		left, granted, err := r.be.TimeLeft(tctx, lease)
		cancel()
		recv := time.Now()
		switch {
		case errors.Is(err, ErrSessionEnded):
			return nil // it ran out, and the key with it
		case err == nil:
			next := last.next(sent, recv, left, granted, r.short)
			if !last.sent.IsZero() && last.after(next) {
				renewals++
			}
			last = next
			if renewals >= 2 {
				return fmt.Errorf("%w: %q (its member record is held by lease %x, which is being renewed)", ErrDuplicateID, r.opts.ID, int64(lease))
			}
			if !logged {
				r.log.Info(fmt.Sprintf("the member record of %q is held by lease %x, with %ds left: waiting for it to run out, as a previous incarnation's that stopped renewing it would", r.opts.ID, int64(lease), int64(left/time.Second)))
				logged = true
			}
		case ctx.Err() != nil:
			return fmt.Errorf("ha: waiting for lease %x, which holds the member record of %q, to run out: %w", int64(lease), r.opts.ID, context.Cause(ctx))
		}
		if !pause(ctx, restartPoll) {
			return fmt.Errorf("ha: waiting for lease %x, which holds the member record of %q, to run out: %w", int64(lease), r.opts.ID, context.Cause(ctx))
		}
	}
}
