// Status: which replica owns, holds and runs each name, as this replica
// sees it.

package ha

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/bgctl/controller"
)

// Status is one replica's view of the members and of every name
// registered on it. Replicas see changes at slightly different moments, so
// two replicas' statuses may disagree for a moment; the claims, not the
// views, keep a name from running twice. Its JSON writes durations as the
// core's status does, as strings such as "1.5s", and its keys in
// kebab-case ("join-error"), as every JSON this module and the core serve
// does.
type Status struct {
	// Prefix is the etcd key prefix of the group (Options.Prefix).
	Prefix string `json:"prefix"`
	// ID is this replica's member ID.
	ID string `json:"id"`
	// Mode is "spread" or "leader".
	Mode string `json:"mode"`
	// Lease is this replica's lease ID in hex; "" while it holds none (its
	// fence passed and it is joining again).
	Lease string `json:"lease,omitempty"`
	// Fence is the time left before this replica stops on its own unless
	// etcd answers a keepalive, to the millisecond; 0 without a lease.
	Fence controller.Duration `json:"fence"`
	// JoinError says why this replica, whose fence passed, is not a
	// member again yet: the error of its last attempt to join, which it
	// retries after a pause that doubles up to 200ms, or up to TTL while
	// another replica holds its ID. A message wrapping [ErrDuplicateID] means
	// another live replica joined under this ID meanwhile: two processes
	// share an ID, and this one runs nothing until the other leaves or
	// its lease expires. "" while a member, and before any attempt failed.
	JoinError string `json:"join-error,omitempty"`
	// Members are the live members, sorted by ID.
	Members []MemberStatus `json:"members"`
	// Names are the names registered on this replica, sorted.
	Names []NameStatus `json:"names"`
}

// MemberStatus is one live member, as a replica sees it.
type MemberStatus struct {
	// ID is the member's ID.
	ID string `json:"id"`
	// Lease is the lease of its member key, in hex.
	Lease string `json:"lease"`
	// Revision is the create revision of its member key: the oldest
	// member, the one [Leader] mode runs everything on, has the lowest.
	Revision int64 `json:"revision"`
	// TTL is the time etcd has left on the member's lease, in whole
	// seconds as etcd counts it. A member's fence, known to the member
	// alone, passes at least its Margin before. Set by
	// [Replica.GroupStatus], which asks etcd; nil from [Replica.Status],
	// and when etcd did not tell.
	TTL *controller.Duration `json:"ttl,omitempty"`
	// Renewed is how long ago the member last renewed its lease, as etcd
	// counts: its TTL less the time left at this replica's last reading
	// (every (TTL − Margin)/4), plus that reading's age; within half a
	// second, as etcd counts whole seconds. A replica renews every (TTL −
	// Margin)/4. Nil for this replica itself, and before the first
	// reading.
	Renewed *controller.Duration `json:"renewed,omitempty"`
	// NotRenewing is true when the member had not renewed its lease for
	// half its TTL or more at the last reading: it stopped, or cannot
	// reach etcd, and its names move when the lease runs out.
	NotRenewing bool `json:"not-renewing,omitempty"`
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
	// Since is when the claim was created, as this replica learned it:
	// from its own transaction's answer, or from the watch, within a
	// round trip of the creation. Nil without a holder, or for a claim
	// this replica found when it listed the prefix (its age unknown).
	Since *time.Time `json:"since,omitempty"`
	// Revision is the claim's create revision, 0 without a holder.
	Revision int64 `json:"revision,omitempty"`
	// State is "acquiring", "running" or "releasing" on this replica, or
	// "" when this replica neither holds nor wants it.
	State string `json:"state,omitempty"`
	// OwnerUnconfirmed is true when the Owner is not known to register the
	// name: its names differ from this replica's (a rolling upgrade) and
	// it has not published them yet, or it runs a version that does not.
	// It counts as registering the name meanwhile; if it does not, the
	// name runs nowhere until its names come, which the replicas publish
	// within a few etcd round trips of seeing that they differ.
	OwnerUnconfirmed bool `json:"owner-unconfirmed,omitempty"`
}

// Status returns this replica's view of the members and the names. It
// asks etcd nothing: see [Replica.GroupStatus] for the members' leases.
func (r *Replica) Status() Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := Status{Prefix: r.opts.Prefix, ID: r.opts.ID, Mode: r.opts.Mode.String(), Members: make([]MemberStatus, 0, len(r.members))}
	if r.lease != 0 {
		st.Lease = leaseHex(r.lease)
		st.Fence = controller.Duration(r.fence.remaining().Round(time.Millisecond))
	}
	if r.joinErr != nil {
		st.JoinError = r.joinErr.Error()
	}
	now := time.Now()
	for id, rev := range r.members {
		m := MemberStatus{ID: id, Lease: leaseHex(r.memberLeases[id]), Revision: rev}
		if a, ok := r.leaseLast[r.memberLeases[id]]; ok && id != r.opts.ID {
			renewed := controller.Duration(a.since(now).Round(time.Second))
			m.Renewed, m.NotRenewing = &renewed, a.stale()
		}
		st.Members = append(st.Members, m)
	}
	slices.SortFunc(st.Members, func(a, b MemberStatus) int { return strings.Compare(a.ID, b.ID) })
	st.Names = make([]NameStatus, 0, len(r.regs))
	unconfirmed := r.unconfirmedLocked()
	for name := range r.regs {
		c, held := r.claims[name]
		ns := NameStatus{Name: name, Owner: r.ownerLocked(name)}
		ns.OwnerUnconfirmed = unconfirmed[ns.Owner]
		if held {
			ns.Holder, ns.Revision, ns.Since = c.holder, c.rev, timeOrNil(c.since)
		}
		if s := r.slots[name]; s != nil {
			ns.State = s.state.String()
			if s.state != acquiring {
				// Known from the claim's creation, before the watch
				// brings the key into the view.
				ns.Holder, ns.Revision, ns.Since = r.opts.ID, s.claim.Revision, timeOrNil(s.since)
			}
		}
		st.Names = append(st.Names, ns)
	}
	slices.SortFunc(st.Names, func(a, b NameStatus) int { return strings.Compare(a.Name, b.Name) })
	return st
}

// GroupStatus is [Replica.Status] with the time etcd has left on each
// member's lease ([MemberStatus.TTL]). It asks etcd, one request per
// member, all at once, each within ctx and Options.RequestTimeout; the
// error names the members whose lease etcd did not tell, and the Status
// is complete but for their TTL. A nil ctx is context.Background.
func (r *Replica) GroupStatus(ctx context.Context) (Status, error) {
	ctx = orBackground(ctx)
	st := r.Status()
	errs := make([]error, len(st.Members))
	var wg sync.WaitGroup
	for i := range st.Members {
		m := &st.Members[i]
		// Owned by GroupStatus, joined below; each writes only its own
		// member and error.
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(ctx, r.opts.RequestTimeout)
			defer cancel()
			var id int64
			if _, err := fmt.Sscanf(m.Lease, "%x", &id); err != nil {
				errs[i] = fmt.Errorf("member %q: lease %q: %w", m.ID, m.Lease, err)
				return
			}
			left, _, err := r.be.PeerLeft(ctx, SessionID(id))
			switch {
			case errors.Is(err, ErrSessionEnded):
				errs[i] = fmt.Errorf("member %q: lease %s has expired", m.ID, m.Lease)
			case err != nil:
				errs[i] = fmt.Errorf("member %q: reading lease %s: %w", m.ID, m.Lease, err)
			default:
				ttl := controller.Duration(left)
				m.TTL = &ttl
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return st, fmt.Errorf("ha: GroupStatus: %w", err)
	}
	return st, nil
}

func leaseHex(id SessionID) string { return fmt.Sprintf("%x", int64(id)) }

// timeOrNil returns &t, or nil for the zero time.
func timeOrNil(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}
