// Handing a crashed member's names to their new owners in one write per
// record, on a store that offers it (TakeOver): the claims each survivor
// makes of its share would write every record once per survivor.

package ha

import "context"

// TakeOver is what a Backend may implement besides Backend: a store that
// keeps many names in one record (Kubernetes' buckets), where each
// survivor's Claim of its share of a crashed member's names writes every
// record, lets the survivors split the records and rewrite each once for
// all the new owners. A Replica calls it when its view sees holdings go
// with their holder's session ended unseen (not released, not left);
// etcd's backend does not implement it.
type TakeOver interface {
	// TakeOver gives each name held by a session the backend counts
	// ended to the live session of member ownerOf(name) ("", or a member
	// whose session it does not count live: the name is left), writing
	// only the records that fall to this replica among the live members,
	// under session id. It is an optimization: the replica claims the
	// names it owns as usual afterwards (Claim finds those given to it
	// already held by it), and releases those given to it that its view
	// says are not its own. ErrSessionEnded: id has ended. Each of its
	// requests is bounded by Options.RequestTimeout and by ctx.
	TakeOver(ctx context.Context, id SessionID, ownerOf func(name string) string) error
}

// takeOverLocked has the backend hand over the names of gone whose
// holdings went with their holder's lease, unreleased
// (endedWithLeaseLocked), to the owners this view gives them, if the
// backend can (TakeOver). The call runs on a goroutine owned by the
// loop, joined by endEpoch through ep.wg; a failure is logged at Debug
// and left to the claims.
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
	ep.wg.Add(1)
	go func() { // owned by the loop; joined by endEpoch through ep.wg
		defer ep.wg.Done()
		if err := t.TakeOver(ep.ctx, SessionID(ep.lease), func(name string) string { return owners[name] }); err != nil {
			r.log.Debug("handing over the names of ended sessions", "error", err)
		}
	}()
}
