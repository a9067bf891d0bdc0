// Epochs: one lease and its fence, from the grant to the end (fence
// passed, Leave, Close), and the keepalive goroutine that extends the
// fence.

package ha

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// epoch is the life of one lease. A replica has one epoch at a time; when
// its fence passes, the replica stops every controller, ends the epoch and
// joins again with a new lease.
type epoch struct {
	// Immutable.
	lease  SessionID
	fence  *fence
	ctx    context.Context    // ends with the epoch: its requests stop
	cancel context.CancelFunc // called by endEpoch
	renew  context.Context    // the keepalives' context: ends with ctx, or earlier by stopRenew
	// stopRenew ends the keepalives (Close stops renewing at once, so the
	// lease expires within TTL whatever the controllers do).
	stopRenew context.CancelFunc
	renewed   chan struct{} // closed when the keepalive goroutine has returned
	results   chan result   // workers → loop; a worker gives up sending once ctx ends
	claims    *claimQueue   // loop → claim workers: the names to claim
	sem       chan struct{} // bounds the etcd requests of the workers in flight

	// wg counts the keepalive goroutine and the workers: each is owned by
	// the loop and joined in endEpoch.
	wg sync.WaitGroup

	// Owned by the loop goroutine.
	watch       Feed // nil: to (re)start; stopped by watchCancel
	watchCancel func()
	retry       *time.Timer // pending relist or acquire retry; nil: none
	settle      *time.Timer // the first epoch's settling (Options.Settle); nil: none, or over
	// joinedAt is the revision at which the member key was written (or
	// read, when moved): a claim deleted after it may have been released
	// to this replica before its first listing. 0 once that listing has
	// looked (see handedBeforeListing).
	joinedAt  int64
	rewriting bool // a rewriteMember worker is out
	// wroteDigest is the digest of names the member key was last written
	// with under this lease; redigesting: a writeDigest worker is out.
	wroteDigest string
	redigesting bool
	redigestAt  time.Time // not before: the last write found the key under another lease
	// published is the digest of the set of names published under this
	// lease ("": none); publishing: a publishNames worker is out.
	published  string
	publishing bool
	// wanted is the set keepNameSet last wanted published, since
	// wantedSince; publishLater wakes the loop when it may be. Owned by
	// the loop.
	wanted       string
	wantedSince  time.Time
	publishLater *time.Timer
	// fetching: a fetchNameSets worker is out. fetchAt is when the sets
	// of the members not yet confirmed may next be read directly (zero:
	// none is unconfirmed); fetchLater wakes the loop then. Owned by the
	// loop.
	fetching   bool
	fetchAt    time.Time
	fetchLater *time.Timer
	retryNames []string // names to reconcile when retry fires
	// unblock fires when the earliest name waiting on a lease that ended
	// early may be claimed (blockedLocked); nil: none waits.
	unblock   *time.Timer
	unblockBy time.Time
}

// unblockAt arms ep.unblock to fire at until, unless it fires earlier.
func (ep *epoch) unblockAt(until time.Time) {
	if ep.unblock != nil && !until.Before(ep.unblockBy) {
		return
	}
	if ep.unblock != nil {
		ep.unblock.Stop()
	}
	ep.unblock, ep.unblockBy = time.NewTimer(time.Until(until)), until
}

// maxInFlight bounds the etcd requests the workers of one replica send at
// once, so that 10,000 names do not open 10,000 streams.
const maxInFlight = 64

// startEpoch begins a session (backend.begin: a lease, and the member key
// under it). The fence counts from the session's send time. prev is the
// lease of the previous epoch, whose member key the new one may
// overwrite; 0 for the first. It starts the keepalive goroutine, joined
// by endEpoch.
func (r *Replica) startEpoch(ctx context.Context, prev SessionID) (*epoch, error) {
	if prev == 0 {
		// Before the grant, whose lease nothing renews yet.
		if err := r.awaitPreviousIncarnation(ctx); err != nil {
			return nil, err
		}
	}
	ttl := r.opts.TTL
	digest := r.digestString()
	s, err := r.be.Begin(ctx, SessionID(prev), ttl, digest)
	if err != nil {
		return nil, err
	}
	f := newFence(s.Sent.Add(r.opts.fenceWindow()))
	if !f.open() {
		err := fmt.Errorf("ha: joining took longer than the fence allows, TTL − Margin − %v (%v)", cancelLead, r.opts.fenceWindow())
		f.stop(err)
		ectx, cancel := context.WithTimeout(r.stopping, r.opts.RequestTimeout)
		defer cancel()
		_ = r.be.End(ectx, s.ID) // best effort: it expires anyway
		return nil, err
	}
	lease := SessionID(s.ID)
	ep := &epoch{
		lease:       lease,
		joinedAt:    s.JoinedAt,
		wroteDigest: digest,
		fence:       f,
		results:     make(chan result, maxInFlight),
		claims:      newClaimQueue(),
		sem:         make(chan struct{}, maxInFlight),
	}
	ep.ctx, ep.cancel = context.WithCancel(r.stopping)
	ep.renew, ep.stopRenew = context.WithCancel(ep.ctx)
	ep.renewed = make(chan struct{})
	r.mu.Lock()
	r.lease, r.fence = lease, f
	r.heard = time.Now() // the watch's silence counts from the epoch's start
	r.allDirty = true
	r.mu.Unlock()
	ep.wg.Add(2 + claimWorkers)
	go r.keepAlive(ep)  // joined by endEpoch through ep.wg
	go r.pollLeases(ep) // joined by endEpoch through ep.wg
	for range claimWorkers {
		go r.claimWorker(ep) // joined by endEpoch through ep.wg
	}
	if prev != 0 {
		// The member key is under the new lease: the previous one's
		// claims can go, and read as given up (revokeOld).
		ep.wg.Add(1)
		go r.revokeOld(ep, prev) // joined by endEpoch through ep.wg
	}
	r.log.Info(fmt.Sprintf("joined %q as a member (mode %v, TTL %v)", r.opts.Prefix, r.opts.Mode, ttl), "lease", fmt.Sprintf("%x", int64(lease)))
	r.emit(Event{Kind: LeaseGained, Lease: lease})
	return ep, nil
}

// keepAlive renews the epoch's lease every keepAliveEvery and extends the
// fence to (send time) + TTL − Margin on every answer. The send time is
// taken before the request, so the fence never outlives the server's
// lease, which counts from the request's arrival. A renewal may take as
// long as the fence has left: under load a slow answer still extends the
// fence, where a shorter timeout would throw it away; renewLease hedges
// it on other endpoints meanwhile. It ends with the epoch, the fence, or
// stopRenew; owned by the loop, joined through ep.wg and ep.renewed.
func (r *Replica) keepAlive(ep *epoch) {
	defer ep.wg.Done()
	defer close(ep.renewed)
	every := r.opts.keepAliveEvery()
	for {
		start := time.Now()
		sent, valid, err := r.renewLease(ep)
		switch {
		case err == nil:
			r.opts.Metrics.rtt.Observe(time.Since(sent).Seconds())
			ttl := min(valid, r.opts.TTL)
			ep.fence.extend(sent.Add(ttl - r.opts.Margin - cancelLead))
		case errors.Is(err, ErrSessionEnded):
			ep.fence.expire(errLeaseLost)
			return
		}
		t := time.NewTimer(time.Until(start.Add(every)))
		select {
		case <-ep.renew.Done():
			t.Stop()
			return
		case <-ep.fence.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// run is the loop goroutine: it serves one epoch after another until Leave
// or Close. Started by Join; joined by Leave and Close through r.done.
func (r *Replica) run(ep *epoch) {
	defer r.finish()
	defer r.abort() // releases the context; nothing is left to abort
	defer r.opts.Metrics.remove(r)
	for {
		req := r.serve(ep)
		var stopped *stopRequest
		stopped, r.stopErr = r.endEpoch(ep, req)
		if stopped != nil {
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
// succeeds or a stop request comes, with the pauses of rejoinWait.
func (r *Replica) rejoin(prev SessionID) (*epoch, *stopRequest) {
	wait := firstRejoinWait
	var log rejoinLog
	for {
		select {
		case req := <-r.stopReq:
			return nil, &req
		default:
		}
		ep, err := r.startEpoch(r.stopping, prev)
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
		wait = rejoinWait(wait, err, r.opts.TTL)
	}
}

// firstRejoinWait is the pause after the first failed attempt to join
// again.
const firstRejoinWait = 20 * time.Millisecond

// rejoinWait returns the pause after a failed attempt to join again, the
// previous pause having been wait: twice wait, capped at 200ms when etcd
// did not let the replica in (unreachable, slow), so that it joins soon
// after etcd answers again; capped at ttl for ErrDuplicateID, since each
// such attempt grants a lease and revokes it, and the ID frees up only
// when the other replica leaves or its lease expires. From 20ms: 40ms,
// 80ms, 160ms, 200ms, 200ms, …; for a duplicate ID with a TTL of 10s:
// 40ms, 80ms, …, 5.12s, 10s, 10s, …
func rejoinWait(wait time.Duration, err error, ttl time.Duration) time.Duration {
	limit := 200 * time.Millisecond
	if errors.Is(err, ErrDuplicateID) {
		limit = max(ttl, limit)
	}
	return min(2*wait, limit)
}

// endEpoch ends ep: it takes every slot from the replica, removes every
// controller, waits for them as the reason allows, joins the epoch's
// goroutines, and then revokes the lease or leaves it to expire. The
// revocation deletes the member key and every claim at once, so it comes
// only once every controller has terminated, never before.
//
//	reason        lease while it waits    waits until every controller stopped, or
//	fence passed  lost (fence passed)     a stop request; then as for that request
//	Close         no longer renewed       the lease may expire: fence + Margin, at most TTL after Close
//	Leave         renewed                 Leave's context ends
//
// After a fence pass no StopFunc starts (see installLocked), and a
// controller still running Margin after it is logged: it breaks the
// contract, and may overlap the next holder. req is nil when the fence
// passed; endEpoch returns the stop request it served (nil: none, the
// replica joins again) and the error for Leave or Close.
func (r *Replica) endEpoch(ep *epoch, req *stopRequest) (*stopRequest, error) {
	cause, reason := ErrClosed, ReasonClose
	switch {
	case req == nil:
		cause, reason = ErrFencePassed, ReasonFence
		r.emit(Event{Kind: FencePassed, Lease: ep.lease, Err: context.Cause(ep.fence.ctx)})
	case req.leave:
		reason = ReasonLeave
	}
	r.mu.Lock()
	slots := r.slots
	r.slots = make(map[string]*slot)
	r.handed = nil
	r.lease = 0
	r.fence = ep.fence // done once the fence is stopped below
	if req == nil {
		// The next epoch's first listing is compared with this view, to
		// learn what went meanwhile (gateLocked).
		r.prevClaims, r.prevMembers, r.prevLeaving = r.claims, r.memberLeases, r.leaving
		r.claims, r.memberLeases, r.leaving = make(map[string]claimView), make(map[string]SessionID), make(map[string]SessionID)
	}
	clear(r.members)
	clear(r.memberLeases)
	clear(r.leaving)
	clear(r.claims)
	clear(r.memberNames)
	clear(r.sets)
	clear(r.badSets)
	r.place, r.viewRev = nil, 0
	// Under mu, so that no install comes between: the slots are gone.
	stopping := make([]stoppingController, 0, len(slots))
	released := releaseLeave
	if req == nil {
		released = releaseLost
		r.opts.Metrics.fencePasses.Inc()
	}
	for name, s := range slots {
		if s.state == running {
			r.opts.Metrics.released[released].Inc() // those in releasing were counted when released
		}
		// The fence cancels the slots' contexts from goroutines of its
		// own; cancel them here first, so that the removal's plain
		// cancellation never comes first and hides the cause.
		s.abandon(cause)
		stopping = append(stopping, stoppingController{name, r.inner.TerminationChannel(name)})
	}
	r.mu.Unlock()

	var err error
	var pending []string
	switch {
	case req == nil:
		r.log.Warn("fence passed: stopping every controller here, without their StopFuncs, until the store answers again", "error", context.Cause(ep.fence.ctx))
		r.inner.RemoveAll()
		inMargin, cancel := context.WithTimeout(context.Background(), r.opts.Margin)
		pending, req = awaitStopped(stopping, inMargin.Done(), r.stopReq)
		cancel()
		if len(pending) > 0 && req == nil {
			r.log.Warn(fmt.Sprintf("still running %v after the fence passed, past their Margin: they may overlap the next holder: %s", r.opts.Margin, strings.Join(pending, ", ")))
			pending, req = awaitStopped(stopping, nil, r.stopReq)
		}
		if req != nil && len(pending) > 0 {
			// A stop request while controllers still stop: Close waits
			// until the lease may expire, Leave until its context ends.
			limit := ep.fence.passedAt().Add(r.opts.Margin)
			if req.leave {
				limit = time.Time{}
			}
			pending = awaitUntil(stopping, limit, req.ctx)
		}
	case req.leave:
		err = r.inner.Shutdown(req.ctx)
	default:
		ep.stopRenew()
		<-ep.renewed // no answer extends the fence from here on
		r.inner.RemoveAll()
		pending = awaitUntil(stopping, ep.fence.passedAt().Add(r.opts.Margin), context.Background())
	}
	ep.fence.stop(ErrClosed)
	ep.cancel()
	if ep.watchCancel != nil {
		ep.watchCancel()
	}
	if ep.retry != nil {
		ep.retry.Stop()
	}
	if ep.settle != nil {
		ep.settle.Stop()
	}
	if ep.unblock != nil {
		ep.unblock.Stop()
	}
	if ep.publishLater != nil {
		ep.publishLater.Stop()
	}
	if ep.fetchLater != nil {
		ep.fetchLater.Stop()
	}
	ep.wg.Wait()
	for name, s := range slots {
		s.end()
		if s.state == running || s.reason != "" {
			r.emit(Event{Kind: Released, Lease: ep.lease, Name: name, Revision: s.claim.Revision, Reason: cmp.Or(s.reason, reason)})
		}
	}
	err = r.giveUpLease(ep, req, pending, err)
	r.emit(Event{Kind: LeaseLost, Lease: ep.lease, Reason: reason, Err: err})
	return req, err
}

// giveUpLease revokes ep's lease, or leaves it to expire, as endEpoch's
// table says, and returns the error for Leave or Close: err, that of the
// controllers' shutdown, or one naming those still running (pending).
func (r *Replica) giveUpLease(ep *epoch, req *stopRequest, pending []string, err error) error {
	stillRunning := func(what string) error {
		return fmt.Errorf("ha: %s: controllers still running, the lease is left to expire: %s", what, strings.Join(pending, ", "))
	}
	switch {
	case req == nil:
		// Revoked by the next epoch, once its member key is written
		// (revokeOld): revoked now, the claims would go with the member
		// key, as in an early end, and the others would wait for them.
		return nil
	case req.leave && len(pending) > 0:
		err = stillRunning("Leave")
	case req.leave && err != nil:
		err = fmt.Errorf("ha: Leave: controllers still running, lease left to expire: %w", err)
	case req.leave:
		r.markLeaving(req.ctx, ep.lease)
		err = r.be.End(req.ctx, SessionID(ep.lease))
		// The fence passed before the stop (its cause is not the
		// ErrClosed of the stop): a lease etcd no longer knows is gone,
		// and the names with it.
		gone := errors.Is(err, ErrSessionEnded) && !errors.Is(context.Cause(ep.fence.ctx), ErrClosed)
		switch {
		case gone:
			r.log.Info("left: the lease had ended already, every name released", "cause", context.Cause(ep.fence.ctx))
			err = nil
		case err != nil:
			err = fmt.Errorf("ha: Leave: revoking the lease (the names move when it expires): %w", err)
		default:
			r.log.Info("left: every name released")
		}
	case len(pending) > 0:
		err = stillRunning("Close")
	default:
		r.log.Info("closed without leaving: the names move when the lease expires")
	}
	return err
}

// stoppingController is a controller endEpoch waits for.
type stoppingController struct {
	name       string
	terminated chan struct{}
}

// awaitStopped waits until every controller in cs has terminated, limit
// fires, or a stop request comes from reqs (nil channels never do). It
// returns the names of the controllers still running, sorted, and the
// stop request.
func awaitStopped(cs []stoppingController, limit <-chan struct{}, reqs <-chan stopRequest) ([]string, *stopRequest) {
	for i, c := range cs {
		select {
		case <-c.terminated:
			continue
		case <-limit:
			return stillRunning(cs[i:]), nil
		case req := <-reqs:
			return stillRunning(cs[i:]), &req
		}
	}
	return nil, nil
}

// awaitUntil waits until every controller in cs has terminated, the time
// limit passes (zero: none), or ctx ends, and returns the names of those
// still running.
func awaitUntil(cs []stoppingController, limit time.Time, ctx context.Context) []string {
	if !limit.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, limit)
		defer cancel()
	}
	pending, _ := awaitStopped(cs, ctx.Done(), nil)
	return pending
}

func stillRunning(cs []stoppingController) []string {
	var names []string
	for _, c := range cs {
		select {
		case <-c.terminated:
		default:
			names = append(names, c.name)
		}
	}
	slices.Sort(names)
	return names
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
// error says so. Later calls return the first call's error. A nil ctx is
// context.Background.
func (r *Replica) Leave(ctx context.Context) error {
	return r.stop(stopRequest{ctx: ctx, leave: true})
}

// Close stops every controller of this replica and stops renewing its
// lease at once, without telling etcd: the member key and the claims stay
// until the lease expires, as after a crash. It waits for the controllers
// (StopFuncs run while the fence is open) and the replica's goroutines,
// but never past the moment the lease may expire, at most TTL after the
// call; controllers still running then are named in the error, and their
// names may start elsewhere. Use Leave to hand the names over at once.
// Later calls return the first call's error.
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
		joined := r.joined
		r.mu.Unlock()
		if !joined {
			// No loop to stop: nothing runs, nothing is held.
			r.abort()
			r.finish()
			return
		}
		r.stopReq <- req // served by the loop, or by a Join that failed
		if req.leave {
			// Leave's requests go on until its context ends; its own
			// revocation uses that context.
			stop := context.AfterFunc(req.ctx, r.abort)
			defer func() {
				<-r.done
				stop()
			}()
		} else {
			r.abort()
		}
	})
	<-r.done
	return r.stopErr
}

// finish marks the replica stopped: it closes done, once, after stopErr was
// written, and ends the event subscriptions after their last event. Called
// by the loop as it ends, by a Join that failed after a stop request came,
// or by the stop request when the replica never joined.
func (r *Replica) finish() {
	r.events.end()
	close(r.done)
}
