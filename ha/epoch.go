// Epochs: one lease and its fence, from the grant to the end (fence
// passed, Leave, Close), and the keepalive goroutine that extends the
// fence.
package ha

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// epoch is the life of one lease. A replica has one epoch at a time; when
// its fence passes, the replica stops every controller, ends the epoch and
// joins again with a new lease.
type epoch struct {
	// Immutable.
	lease   clientv3.LeaseID
	fence   *fence
	ctx     context.Context    // ends with the epoch: its requests stop
	cancel  context.CancelFunc // called by endEpoch
	results chan result        // workers → loop; a worker gives up sending once ctx ends
	sem     chan struct{}      // bounds the etcd requests of the workers in flight

	// wg counts the keepalive goroutine and the workers: each is owned by
	// the loop and joined in endEpoch.
	wg sync.WaitGroup

	// Owned by the loop goroutine.
	watch       *viewWatch // nil: to (re)start; stopped by watchCancel
	watchCancel context.CancelFunc
	retry       *time.Timer // pending relist or acquire retry; nil: none
	retryNames  []string    // names to reconcile when retry fires
}

// maxInFlight bounds the etcd requests the workers of one replica send at
// once, so that 10,000 names do not open 10,000 streams.
const maxInFlight = 64

// startEpoch grants a lease and writes the member key under it. The fence
// counts from the grant's send time. prev is the lease of the previous
// epoch, whose member key the new one may overwrite; 0 for the first.
// It starts the keepalive goroutine, joined by endEpoch.
func (r *Replica) startEpoch(ctx context.Context, prev clientv3.LeaseID) (*epoch, error) {
	ttl := r.opts.TTL
	sent := time.Now()
	gctx, cancel := context.WithTimeout(ctx, r.opts.RequestTimeout)
	g, err := r.cli.Grant(gctx, int64(ttl/time.Second))
	cancel()
	if err != nil {
		return nil, fmt.Errorf("ha: granting a lease of %v: %w", ttl, err)
	}
	if granted := time.Duration(g.TTL) * time.Second; granted != ttl {
		// The fence keeps counting with the TTL asked for, the shorter.
		r.log.Warnf("etcd granted a lease of %v instead of %v: a crashed replica's names move after the longer one", granted, ttl)
	}
	f := newFence(sent.Add(r.opts.window()))
	fail := func(err error) (*epoch, error) {
		f.stop(err)
		rctx, cancel := context.WithTimeout(context.Background(), r.opts.RequestTimeout)
		defer cancel()
		_, _ = r.cli.Revoke(rctx, g.ID) // best effort: it expires anyway
		return nil, err
	}
	mctx, cancel := context.WithTimeout(ctx, r.opts.RequestTimeout)
	defer cancel()
	key := r.keys.members + r.opts.ID
	resp, err := r.cli.Txn(mctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, r.opts.ID, clientv3.WithLease(g.ID))).
		Else(clientv3.OpGet(key)).Commit()
	if err != nil {
		return fail(fmt.Errorf("ha: writing member key %q: %w", key, err))
	}
	if !resp.Succeeded {
		kvs := resp.Responses[0].GetResponseRange().GetKvs()
		if len(kvs) == 1 && (prev == 0 || clientv3.LeaseID(kvs[0].Lease) != prev) {
			return fail(fmt.Errorf("%w: %q (member key %q is held by lease %x)", ErrDuplicateID, r.opts.ID, key, kvs[0].Lease))
		}
		// Our own key from the previous epoch: ours. (The Else read the
		// key in the same transaction, so len(kvs) is 1. This Put is not
		// guarded by prev's lease; a replica of the same ID joining in
		// between would be overwritten.)
		if _, err := r.cli.Put(mctx, key, r.opts.ID, clientv3.WithLease(g.ID)); err != nil {
			return fail(fmt.Errorf("ha: writing member key %q: %w", key, err))
		}
	}
	if !f.open() {
		return fail(fmt.Errorf("ha: joining took longer than TTL − Margin (%v)", r.opts.window()))
	}
	ep := &epoch{
		lease:   g.ID,
		fence:   f,
		results: make(chan result, maxInFlight),
		sem:     make(chan struct{}, maxInFlight),
	}
	ep.ctx, ep.cancel = context.WithCancel(context.Background())
	r.mu.Lock()
	r.lease, r.fence = g.ID, f
	r.allDirty = true
	r.mu.Unlock()
	ep.wg.Add(1)
	go r.keepAlive(ep) // joined by endEpoch through ep.wg
	r.log.WithField("lease", fmt.Sprintf("%x", int64(g.ID))).Infof("joined %q as a member (mode %v, TTL %v)", r.opts.Prefix, r.opts.Mode, ttl)
	return ep, nil
}

// keepAlive renews the epoch's lease every keepAliveEvery and extends the
// fence to (send time) + TTL − Margin on every answer. The send time is
// taken before the request, so the fence never outlives the server's
// lease, which counts from the request's arrival. One request is in
// flight at a time, and it may take as long as the fence has left: under
// load a slow answer still extends the fence, where a shorter timeout
// would throw it away. It ends with the epoch or the fence; owned by the
// loop, joined through ep.wg.
func (r *Replica) keepAlive(ep *epoch) {
	defer ep.wg.Done()
	every := r.opts.keepAliveEvery()
	for {
		sent := time.Now()
		ctx, cancel := context.WithTimeout(ep.ctx, max(ep.fence.remaining(), every))
		resp, err := r.cli.KeepAliveOnce(ctx, ep.lease)
		cancel()
		switch {
		case err == nil:
			ttl := min(time.Duration(resp.TTL)*time.Second, r.opts.TTL)
			ep.fence.extend(sent.Add(ttl - r.opts.Margin))
		case isLeaseNotFound(err):
			ep.fence.expire(errLeaseLost)
			return
		}
		t := time.NewTimer(time.Until(sent.Add(every)))
		select {
		case <-ep.ctx.Done():
			t.Stop()
			return
		case <-ep.fence.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

func isLeaseNotFound(err error) bool {
	return errors.Is(err, rpctypes.ErrLeaseNotFound) || errors.Is(err, rpctypes.ErrGRPCLeaseNotFound)
}

// run is the loop goroutine: it serves one epoch after another until Leave
// or Close. Started by Join; joined by Leave and Close through r.done.
func (r *Replica) run(ep *epoch) {
	defer close(r.done)
	for {
		req := r.serve(ep)
		r.stopErr = r.endEpoch(ep, req)
		if req != nil {
			return
		}
		ep, req = r.rejoin(ep.lease)
		if req != nil {
			r.stopErr = r.stopBetweenEpochs(*req)
			return
		}
	}
}

// rejoin starts a new epoch after a fence passed, retrying until it
// succeeds or a stop request comes.
func (r *Replica) rejoin(prev clientv3.LeaseID) (*epoch, *stopRequest) {
	wait := 20 * time.Millisecond
	var log rejoinLog
	for {
		select {
		case req := <-r.stopReq:
			return nil, &req
		default:
		}
		ep, err := r.startEpoch(context.Background(), prev)
		r.reportRejoin(&log, err)
		if err == nil {
			return ep, nil
		}
		t := time.NewTimer(wait)
		select {
		case req := <-r.stopReq:
			t.Stop()
			return nil, &req
		case <-t.C:
		}
		wait = min(2*wait, 200*time.Millisecond)
	}
}

// endEpoch stops every controller and waits until they have terminated,
// joins the epoch's goroutines, and then, for Leave or a passed fence,
// revokes the lease: that deletes the member key and every claim at once,
// so it must come after the controllers stopped, never before. req is
// nil when the fence passed.
func (r *Replica) endEpoch(ep *epoch, req *stopRequest) error {
	r.mu.Lock()
	slots := r.slots
	r.slots = make(map[string]*slot)
	r.lease = 0
	r.fence = ep.fence // done once the fence is stopped below
	clear(r.members)
	clear(r.claims)
	r.memberIDs, r.leader, r.viewRev = nil, "", 0
	r.mu.Unlock()

	var err error
	switch {
	case req == nil:
		r.log.WithError(context.Cause(ep.fence.ctx)).Warn("fence passed: stopping every controller here until etcd answers again")
		// The fence cancels the slots' contexts from goroutines of its
		// own; cancel them here first, so that the removal's plain
		// cancellation never comes first and hides the cause.
		for _, s := range slots {
			if s.cancel != nil {
				s.cancel(ErrFencePassed)
			}
		}
		r.inner.RemoveAllAndWait()
	case req.leave:
		err = r.inner.Shutdown(req.ctx)
	default:
		r.inner.RemoveAllAndWait()
	}
	ep.fence.stop(ErrClosed)
	ep.cancel()
	if ep.watchCancel != nil {
		ep.watchCancel()
	}
	if ep.retry != nil {
		ep.retry.Stop()
	}
	ep.wg.Wait()
	for _, s := range slots {
		s.end()
	}
	switch {
	case req == nil:
		ctx, cancel := context.WithTimeout(context.Background(), r.opts.RequestTimeout)
		defer cancel()
		_, _ = r.cli.Revoke(ctx, ep.lease) // best effort: unreachable, it expires
	case req.leave && err == nil:
		if _, err = r.cli.Revoke(req.ctx, ep.lease); err != nil {
			err = fmt.Errorf("ha: Leave: revoking the lease (the names move when it expires): %w", err)
		} else {
			r.log.Info("left: every name released")
		}
	case req.leave:
		err = fmt.Errorf("ha: Leave: controllers still running, lease left to expire: %w", err)
	default:
		r.log.Info("closed without leaving: the names move when the lease expires")
	}
	return err
}

// stopBetweenEpochs serves a stop request that came while no lease was
// held: nothing runs and nothing is held, so there is nothing to release.
func (r *Replica) stopBetweenEpochs(req stopRequest) error {
	if req.leave {
		r.log.Info("left while not a member")
	}
	return nil
}

// Leave stops every controller of this replica, waits until they have
// terminated (StopFuncs included), and revokes the lease, which releases
// every claim at once so the other replicas take the names over at once.
// It waits for the replica's goroutines. When ctx ends first, the
// StopFuncs' contexts are cancelled, the lease is left to expire, and the
// error says so. Later calls return the first call's error.
func (r *Replica) Leave(ctx context.Context) error {
	return r.stop(stopRequest{ctx: ctx, leave: true})
}

// Close stops every controller of this replica and waits until they and
// the replica's goroutines have ended, without telling etcd: the member
// key and the claims stay until the lease expires, as after a crash. Use
// Leave to hand the names over at once. Later calls return the first
// call's error.
func (r *Replica) Close() error {
	return r.stop(stopRequest{ctx: context.Background()})
}

func (r *Replica) stop(req stopRequest) error {
	if req.ctx == nil {
		req.ctx = context.Background()
	}
	r.stopOnce.Do(func() {
		r.mu.Lock()
		r.closed = true
		r.mu.Unlock()
		r.stopReq <- req
	})
	<-r.done
	return r.stopErr
}
