// The hedged renewal: on a cluster of several etcd members, a member cut
// off from its peers must not hold the renewals that keep a replica's
// fence open.

package ha

import (
	"context"
	"errors"
	"sync"
	"time"
)

// maxRenewals bounds the keepalives of one replica in flight at once (see
// renewLease).
const maxRenewals = 4

// renewal is the outcome of one backend.renew.
type renewal struct {
	sent  time.Time
	valid time.Duration
	err   error
}

// renewLease renews the epoch's lease once, and returns the first answer,
// the validity it grants (or errSessionEnded), with the send time of the
// request it answers, so that the caller extends the fence from there. A
// keepalive can hang on one member while the others would answer at once: a
// follower just cut off from its peers still believes in its leader for
// up to two election timeouts, and forwards the renewal to it over the
// cut peer network, waiting up to etcd's request timeout (seven seconds
// with its defaults). So while no answer has come, renewLease sends
// another every quarter period, each on a stream of its own, which the
// client's round-robin balancer puts on the next endpoint, up to
// maxRenewals in flight; an earlier request still extends the fence if
// its answer comes first, so a slow etcd is not thrown away. Each request
// requires a leader, so a member that knows it has none fails it at once.
//
// Every request waits at most until the fence would pass (a period at
// least), and renewLease returns when the epoch's renewals stop or the
// fence passes. It cancels the requests still in flight and waits for
// their goroutines before it returns.
func (r *Replica) renewLease(ep *epoch) (time.Time, time.Duration, error) {
	every := r.opts.keepAliveEvery()
	ctx, cancel := context.WithCancel(ep.renew)
	answers := make(chan renewal, maxRenewals) // never blocks a sender: at most maxRenewals in flight
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	inFlight := 0
	send := func() {
		inFlight++
		sent := time.Now()
		rctx, rcancel := context.WithTimeout(ctx, max(ep.fence.remaining(), every))
		wg.Add(1)
		go func() { // owned by renewLease; joined by its deferred wg.Wait
			defer wg.Done()
			defer rcancel()
			valid, err := r.be.Renew(rctx, SessionID(ep.lease))
			answers <- renewal{sent, valid, err}
		}()
	}
	hedge := time.NewTicker(every / 4)
	defer hedge.Stop()
	send()
	last := renewal{err: context.DeadlineExceeded}
	for {
		select {
		case a := <-answers:
			inFlight--
			if a.err == nil || errors.Is(a.err, ErrSessionEnded) {
				return a.sent, a.valid, a.err
			}
			last = a
			r.log.Debug("keepalive", "error", a.err)
		case <-hedge.C:
			if inFlight < maxRenewals {
				send()
			}
		case <-ep.renew.Done():
			return last.sent, 0, ep.renew.Err()
		case <-ep.fence.ctx.Done():
			return last.sent, 0, last.err
		}
	}
}
