// Requests that need etcd's leader, and the hedged keepalive: on a cluster
// of several members, a member cut off from its peers must not hold a
// replica's requests, least of all the keepalives that keep its fence
// open.

package ha

import (
	"context"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// leaderRequest returns the context of one request that needs etcd's
// leader (a write, a linearizable read, a keepalive), bounded by
// Options.RequestTimeout. It carries etcd's require-leader metadata: a
// member that has no leader (cut off from its peers, for about an
// election timeout after the cut) answers at once with ErrNoLeader,
// instead of holding the request until its timeout, and the client's
// next request goes to another endpoint (reads the client retries itself,
// on another endpoint). The metadata replaces the parent's outgoing
// metadata, which no caller sets.
func (r *Replica) leaderRequest(parent context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(clientv3.WithRequireLeader(parent), r.opts.RequestTimeout)
}

// maxRenewals bounds the keepalives of one replica in flight at once (see
// renewLease).
const maxRenewals = 4

// renewal is the outcome of one KeepAliveOnce.
type renewal struct {
	sent time.Time
	resp *clientv3.LeaseKeepAliveResponse
	err  error
}

// renewLease renews the epoch's lease once, and returns the first answer
// (or that the lease is not found) with the send time of the request it
// answers, so that the caller extends the fence from there. A keepalive
// can hang on one member while the others would answer at once: a
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
func (r *Replica) renewLease(ep *epoch) (time.Time, *clientv3.LeaseKeepAliveResponse, error) {
	every := r.opts.keepAliveEvery()
	ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ep.renew))
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
			resp, err := r.cli.KeepAliveOnce(rctx, ep.lease)
			answers <- renewal{sent, resp, err}
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
			if a.err == nil || isLeaseNotFound(a.err) {
				return a.sent, a.resp, a.err
			}
			last = a
			r.log.Debug("keepalive", "error", a.err)
		case <-hedge.C:
			if inFlight < maxRenewals {
				send()
			}
		case <-ep.renew.Done():
			return last.sent, nil, ep.renew.Err()
		case <-ep.fence.ctx.Done():
			return last.sent, nil, last.err
		}
	}
}
