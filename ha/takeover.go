// Handing a crashed member's names to their new owners in one write per
// record, on a store that offers it (TakeOver): the claims each survivor
// makes of its share would write every record once per survivor.

package ha

import (
	"context"
	"sync"
)

// TakeOver is what a Backend may implement besides Backend: a store that
// keeps many names in one record (Kubernetes' buckets), where each
// survivor's Claim of its share of a crashed member's names writes every
// record, lets the survivors split the records and rewrite each once for
// all the new owners. A Replica calls it when its view sees holdings go
// with their holder's session ended unseen (not released, not left);
// etcd's backend does not implement it.
type TakeOver interface {
	// TakeOver starts giving each name held by a session the backend
	// counts ended to the live session of member ownerOf(name) ("", or
	// a member whose session it does not count live: the name is left),
	// writing only the records that fall to this replica among the live
	// members, under session id. It returns at once: the Replica calls
	// it from its loop before it claims any of those names, so that the
	// backend knows a hand-over is under way when those claims come; the
	// writes run on goroutines the backend counts in wg, and end with
	// ctx. It is an optimization: the replica claims the names it owns
	// as usual afterwards (Claim finds those given to it already held by
	// it), and releases those given to it that its view says are not its
	// own. A failure is the backend's to log; each of its requests is
	// bounded by Options.RequestTimeout and by ctx.
	TakeOver(ctx context.Context, id SessionID, ownerOf func(name string) string, wg *sync.WaitGroup)
}

// takeOverLocked has the backend hand over the names of gone whose
// holdings went with their holder's lease, unreleased
// (endedWithLeaseLocked), to the owners this view gives them, if the
// backend can (TakeOver). The backend's writes run on goroutines counted
// in ep.wg, joined by endEpoch; a failure is left to the claims.
func (r *Replica) takeOverLocked(ep *epoch, gone map[string]claimView) {
	t, ok := r.be.(TakeOver)
	if !ok {
		return
	}
	owners := map[string]string{}
	for name, c := range gone {
		if r.endedWithLeaseLocked(c) {
			owners[name] = r.ownerLocked(name)
		}
	}
	if len(owners) == 0 {
		return
	}
	t.TakeOver(ep.ctx, SessionID(ep.lease), func(name string) string { return owners[name] }, &ep.wg) // its goroutines joined by endEpoch through ep.wg
}
