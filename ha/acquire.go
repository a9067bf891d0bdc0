// Claiming: a few workers create the claims of the names a replica owns,
// many names to an etcd transaction.

package ha

import (
	"errors"
	"sync"
	"time"
)

// claimWorkers is how many claim transactions one replica has in flight at
// once: with claimBatch names each, enough to keep etcd busy (one
// transaction at a time nearly does), few enough that etcd's queue of
// writes stays short, for a keepalive waits behind it.
const claimWorkers = 2

// fitBytes returns how many of names, at least one, fit in the bytes
// one Claim takes (ClaimLimiter).
func (r *Replica) fitBytes(names []string) int {
	total := 0
	for i, name := range names {
		total += ClaimCostOf(r.be, name)
		if total > r.maxClaimBytes && i > 0 {
			return i
		}
	}
	return len(names)
}

// claimQueue holds the names in state acquiring that no claim worker has
// taken yet: the loop adds them (stepLocked), the workers take them a
// batch at a time, without waiting for the loop.
type claimQueue struct {
	ready chan struct{} // capacity 1: names were added, or remain after a take

	mu    sync.Mutex
	names []string // guarded by mu
	// filling is true while the loop's step adds names, until its flush:
	// a take then leaves fewer than a batch for that step's flush to
	// wake a worker for. Guarded by mu.
	filling bool
}

func newClaimQueue() *claimQueue {
	return &claimQueue{ready: make(chan struct{}, 1)}
}

// add queues name, and wakes a worker once batch names are queued: a
// worker woken for fewer would send a smaller Claim than the backend
// takes, and on a store whose Claim costs a write per bucket touched
// (Kubernetes) each small batch costs as many writes as a full one. The
// loop wakes one for the rest when its step ends (flush).
func (q *claimQueue) add(name string, batch int) {
	q.mu.Lock()
	q.names = append(q.names, name)
	q.filling = true
	full := len(q.names) >= batch
	q.mu.Unlock()
	if full {
		q.signal()
	}
}

// flush ends the loop's step of adds, and wakes a worker for the names
// left.
func (q *claimQueue) flush() {
	q.mu.Lock()
	q.filling = false
	q.mu.Unlock()
	q.signal()
}

// take removes and returns up to n names, nil when there are none or,
// while the loop's step adds names, fewer than n; it wakes another worker
// when a batch of n remains, or any once the loop's step flushed.
func (q *claimQueue) take(n int) []string {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.names) == 0 || q.filling && len(q.names) < n {
		return nil // none, or less than a batch while the loop's step adds more
	}
	batch := make([]string, min(n, len(q.names)))
	copy(batch, q.names)
	q.names = q.names[len(batch):]
	if len(q.names) >= n || len(q.names) > 0 && !q.filling {
		q.signal()
	} else if len(q.names) == 0 {
		q.names = nil // lets the array go
	}
	return batch
}

func (q *claimQueue) signal() {
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// claimWorker claims the names queued in ep.claims, a batch at a time,
// until the epoch ends. Owned by the loop, which starts claimWorkers of
// them with the epoch; joined by endEpoch through ep.wg.
func (r *Replica) claimWorker(ep *epoch) {
	defer ep.wg.Done()
	for {
		if names := ep.claims.take(int(r.claimBatch.Load())); names != nil {
			r.claimAll(ep, names)
			continue
		}
		select {
		case <-ep.claims.ready:
		case <-ep.ctx.Done():
			return
		}
	}
}

// claimAll creates the claims of names that are absent, in transactions of
// claimBatch names each, and reports every outcome to the loop at once. A
// transaction whose comparisons fail (some claim exists) reads every key
// instead: the names held elsewhere are settled, and those that were
// absent are claimed again, in one batch more, then one by one, so that a
// name taken by another replica never costs the others more than that.
func (r *Replica) claimAll(ep *epoch, names []string) {
	out := make([]Claimed, 0, len(names))
	todo := names
	tooLarge := r.maxClaimNames + 1 // a chunk the server refused as too large, halved
	for round := 0; len(todo) > 0; round++ {
		var absent []string
		for len(todo) > 0 {
			size := min(int(r.claimBatch.Load()), tooLarge)
			if round >= 2 {
				size = 1 // a single key is created, or read: never absent again
			}
			chunk := todo[:min(size, len(todo))]
			chunk = chunk[:r.fitBytes(chunk)]
			got, missing, err := r.claimChunk(ep, chunk)
			if len(chunk) > 1 && errors.Is(err, ErrTooManyOps) {
				// The server takes fewer operations per transaction:
				// halve the chunk refused, for all workers, and try
				// again. Halved from the chunk, not from claimBatch: a
				// chunk cut short by tooLarge or fitBytes is smaller,
				// and a retry must never resend the same chunk.
				r.shrinkClaimBatch(len(chunk) / 2)
				continue
			}
			if len(chunk) > 1 && errors.Is(err, ErrTooLarge) {
				// The server takes smaller requests than it declared:
				// halve for this call's chunks.
				tooLarge = len(chunk) / 2
				continue
			}
			todo = todo[len(chunk):]
			if err != nil {
				for _, name := range chunk {
					out = append(out, Claimed{Name: name, err: err})
				}
				continue
			}
			out = append(out, got...)
			absent = append(absent, missing...)
		}
		todo = absent
	}
	r.report(ep, result{kind: acquired, claims: out})
}

// shrinkClaimBatch lowers claimBatch to at most n, unless another worker
// lowered it further meanwhile.
func (r *Replica) shrinkClaimBatch(n int) {
	for {
		cur := r.claimBatch.Load()
		if int(cur) <= n || r.claimBatch.CompareAndSwap(cur, int32(n)) {
			return
		}
	}
}

// claimChunk claims names under the epoch's lease (backend.claim), once
// the fence has room for them and a request may be in flight.
func (r *Replica) claimChunk(ep *epoch, names []string) (got []Claimed, absent []string, err error) {
	// etcd answers a keepalive only once it has applied the writes before
	// it, so claims that pile up there can pass the fence of the replica
	// making them. While two keepalives in a row went unanswered (less
	// than half the fence's window left), add no more.
	for ep.fence.remaining() < r.opts.window()/2 {
		if !pause(ep.ctx, r.opts.keepAliveEvery()/4) {
			return nil, nil, ep.ctx.Err()
		}
	}
	select {
	case ep.sem <- struct{}{}:
	case <-ep.ctx.Done():
		return nil, nil, ep.ctx.Err()
	}
	defer func() { <-ep.sem }()
	ctx, cancel := r.request(ep.ctx)
	defer cancel()
	return r.be.Claim(ctx, SessionID(ep.lease), names)
}

// handleClaimedLocked applies the outcome of one name's claim: a claim
// ours, while the name is still ours, registered and the fence open, is
// installed (rule 1); ours otherwise is released at once; held elsewhere,
// it waits for its deletion; a failed request is tried again later.
func (r *Replica) handleClaimedLocked(ep *epoch, c Claimed) {
	s := r.slots[c.Name]
	if s == nil || s.state != acquiring {
		return
	}
	switch {
	case c.err != nil:
		delete(r.slots, c.Name)
		s.end()
		r.log.Debug("claiming", controllerAttr(c.Name), "error", c.err)
		r.retryLater(ep, c.Name)
	case !c.Mine:
		delete(r.slots, c.Name)
		s.end()
		if c.Holder != "" && c.At > r.viewRev {
			// The view has not seen this holding yet; wait for its deletion.
			r.claims[c.Name] = claimView{holder: c.Holder, lease: c.Session, rev: c.Revision}
		}
		r.dirty[c.Name] = struct{}{}
	default:
		s.claim = c.claim()
		s.since = time.Now()
		r.opts.Metrics.acquired.Inc()
		p, registered := r.regs[c.Name]
		registered = registered && !s.removed // registered again after a removal: claimed anew
		ours := registered && r.ownerLocked(c.Name) == r.opts.ID
		switch {
		case ours && ep.fence.open():
			s.state = running
			r.installLocked(c.Name, s, p)
			if cv, seen := r.claims[c.Name]; !seen || cv.rev != c.Revision {
				// The watch may have brought the claim's creation and a
				// deletion before this answer, and the reconcile since
				// found the slot acquiring: look again, or the name runs
				// without its claim (stepLocked releases it as lost).
				r.dirty[c.Name] = struct{}{}
			}
			r.log.Info("claimed: running here", controllerAttr(c.Name), "revision", c.Revision)
			r.emit(Event{Kind: Acquired, Lease: ep.lease, Name: c.Name, Revision: c.Revision})
		case ours:
			r.releaseLocked(ep, c.Name, s, false, ReasonLost)
		default:
			r.releaseLocked(ep, c.Name, s, false, notOursReason(registered))
		}
	}
}
