// Status: which replica owns, holds and runs each name, as this replica
// sees it.

package ha

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Status is one replica's view of the members and of every name
// registered on it. Replicas see changes at slightly different moments, so
// two replicas' statuses may disagree for a moment; the claims, not the
// views, keep a name from running twice.
type Status struct {
	// ID is this replica's member ID.
	ID string `json:"id"`
	// Mode is "spread" or "leader".
	Mode string `json:"mode"`
	// Lease is this replica's lease ID in hex; "" while it holds none (its
	// fence passed and it is joining again).
	Lease string `json:"lease,omitempty"`
	// Fence is the time left before this replica stops on its own unless
	// etcd answers a keepalive; 0 without a lease.
	Fence time.Duration `json:"fence"`
	// JoinError says why this replica, whose fence passed, is not a
	// member again yet: the error of its last attempt to join, which it
	// retries every 200ms or so. A message wrapping [ErrDuplicateID] means
	// another live replica joined under this ID meanwhile: two processes
	// share an ID, and this one runs nothing until the other leaves or
	// its lease expires. "" while a member, and before any attempt failed.
	JoinError string `json:"joinError,omitempty"`
	// Members are the live members' IDs, sorted.
	Members []string `json:"members"`
	// Names are the names registered on this replica, sorted.
	Names []NameStatus `json:"names"`
}

// NameStatus is where one name stands, as a replica sees it.
type NameStatus struct {
	// Name is the controller's name.
	Name string `json:"name"`
	// Owner is the member that should run it, by the Mode; "" with no
	// members.
	Owner string `json:"owner"`
	// Holder is the member whose claim key exists for it (this replica as
	// soon as it created the claim, others once the watch shows it); ""
	// when none.
	Holder string `json:"holder,omitempty"`
	// State is "acquiring", "running" or "releasing" on this replica, or
	// "" when this replica neither holds nor wants it.
	State string `json:"state,omitempty"`
	// Revision is the claim's create revision while this replica holds
	// it, else 0.
	Revision int64 `json:"revision,omitempty"`
}

// Status returns this replica's view of the members and the names.
func (r *Replica) Status() Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := Status{ID: r.opts.ID, Mode: r.opts.Mode.String(), Members: make([]string, 0, len(r.members))}
	if r.lease != 0 {
		st.Lease = fmt.Sprintf("%x", int64(r.lease))
		st.Fence = r.fence.remaining()
	}
	if r.joinErr != nil {
		st.JoinError = r.joinErr.Error()
	}
	for id := range r.members {
		st.Members = append(st.Members, id)
	}
	slices.Sort(st.Members)
	st.Names = make([]NameStatus, 0, len(r.regs))
	for name := range r.regs {
		ns := NameStatus{Name: name, Owner: r.ownerLocked(name), Holder: r.claims[name].holder}
		if s := r.slots[name]; s != nil {
			ns.State = s.state.String()
			if s.state != acquiring {
				// Known from the claim's creation, before the watch
				// brings the key into the view.
				ns.Holder, ns.Revision = r.opts.ID, s.claim.Revision
			}
		}
		st.Names = append(st.Names, ns)
	}
	slices.SortFunc(st.Names, func(a, b NameStatus) int { return strings.Compare(a.Name, b.Name) })
	return st
}
