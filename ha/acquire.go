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

// maxClaimBatch is how many names one claim transaction creates at most:
// etcd's default --max-txn-ops, which bounds each of a transaction's
// comparisons, its operations on success and those on failure. A server
// started with less answers ErrTooManyOps (errTooManyOps); the replica
// then halves the refused chunk into Replica.claimBatch until the server
// takes them.
const maxClaimBatch = 128

// maxClaimBytes bounds the bytes of one claim transaction: below etcd's
// default request limit (--max-request-bytes, 1.5 MiB) and the client's
// (2 MiB), so that long names are claimed in smaller batches rather than
// refused whole (backend.claimCost counts a name's bytes).
const maxClaimBytes = 1 << 20

// fitBytes returns how many of names, at least one, fit in maxClaimBytes.
func (r *Replica) fitBytes(names []string) int {
	total := 0
	for i, name := range names {
		total += r.be.claimCost(name)
		if total > maxClaimBytes && i > 0 {
			return i
		}
	}
	return len(names)
}

// claimed is the outcome of one name's claim.
type claimed struct {
	name string
	ok   bool       // the claim is ours
	rev  int64      // ok: its create revision
	view *claimView // not ok: the claim another lease holds, read at hdr
	hdr  int64
	err  error // the request failed: try again later
}

// claimQueue holds the names in state acquiring that no claim worker has
// taken yet: the loop adds them (stepLocked), the workers take them a
// batch at a time, without waiting for the loop.
type claimQueue struct {
	ready chan struct{} // capacity 1: names were added, or remain after a take

	mu    sync.Mutex
	names []string // guarded by mu
}

func newClaimQueue() *claimQueue {
	return &claimQueue{ready: make(chan struct{}, 1)}
}

func (q *claimQueue) add(name string) {
	q.mu.Lock()
	q.names = append(q.names, name)
	q.mu.Unlock()
	q.signal()
}

// take removes and returns up to n names, nil when there are none, and
// wakes another worker when some remain.
func (q *claimQueue) take(n int) []string {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.names) == 0 {
		return nil
	}
	batch := make([]string, min(n, len(q.names)))
	copy(batch, q.names)
	q.names = q.names[len(batch):]
	if len(q.names) > 0 {
		q.signal()
	} else {
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
	out := make([]claimed, 0, len(names))
	todo := names
	tooLarge := maxClaimBatch + 1 // a chunk the server refused as too large, halved
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
			if len(chunk) > 1 && errors.Is(err, errTooManyOps) {
				// The server takes fewer operations per transaction:
				// halve the chunk refused, for all workers, and try
				// again. Halved from the chunk, not from claimBatch: a
				// chunk cut short by tooLarge or fitBytes is smaller,
				// and a retry must never resend the same chunk.
				r.shrinkClaimBatch(len(chunk) / 2)
				continue
			}
			if len(chunk) > 1 && errors.Is(err, errTooLarge) {
				// The server takes smaller requests than maxClaimBytes:
				// halve for this call's chunks.
				tooLarge = len(chunk) / 2
				continue
			}
			todo = todo[len(chunk):]
			if err != nil {
				for _, name := range chunk {
					out = append(out, claimed{name: name, err: err})
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
func (r *Replica) claimChunk(ep *epoch, names []string) (got []claimed, absent []string, err error) {
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
	ctx, cancel := r.be.request(ep.ctx)
	defer cancel()
	return r.be.claim(ctx, sessionID(ep.lease), names)
}

// handleClaimedLocked applies the outcome of one name's claim: a claim
// ours, while the name is still ours, registered and the fence open, is
// installed (rule 1); ours otherwise is released at once; held elsewhere,
// it waits for its deletion; a failed request is tried again later.
func (r *Replica) handleClaimedLocked(ep *epoch, c claimed) {
	s := r.slots[c.name]
	if s == nil || s.state != acquiring {
		return
	}
	switch {
	case c.err != nil:
		delete(r.slots, c.name)
		s.end()
		r.log.Debug("claiming", controllerAttr(c.name), "error", c.err)
		r.retryLater(ep, c.name)
	case !c.ok:
		delete(r.slots, c.name)
		s.end()
		if c.view != nil && c.hdr > r.viewRev {
			// The view has not seen this key yet; wait for its deletion.
			r.claims[c.name] = *c.view
		}
		r.dirty[c.name] = struct{}{}
	default:
		s.claim = Claim{Key: r.keys.claims + c.name, Revision: c.rev}
		s.since = time.Now()
		r.opts.Metrics.acquired.Inc()
		p, registered := r.regs[c.name]
		registered = registered && !s.removed // registered again after a removal: claimed anew
		ours := registered && r.ownerLocked(c.name) == r.opts.ID
		switch {
		case ours && ep.fence.open():
			s.state = running
			r.installLocked(c.name, s, p)
			if cv, seen := r.claims[c.name]; !seen || cv.rev != c.rev {
				// The watch may have brought the claim's creation and a
				// deletion before this answer, and the reconcile since
				// found the slot acquiring: look again, or the name runs
				// without its claim (stepLocked releases it as lost).
				r.dirty[c.name] = struct{}{}
			}
			r.log.Info("claimed: running here", controllerAttr(c.name), "revision", c.rev)
			r.emit(Event{Kind: Acquired, Lease: ep.lease, Name: c.name, Revision: c.rev})
		case ours:
			r.releaseLocked(ep, c.name, s, false, ReasonLost)
		default:
			r.releaseLocked(ep, c.name, s, false, notOursReason(registered))
		}
	}
}
