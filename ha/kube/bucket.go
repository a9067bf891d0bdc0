// Buckets: a fixed number of Leases, never deleted, that names hash into.
// A session claims a bucket by one guarded write; the holding lives off
// the session's member Lease and does not renew; leaseTransitions, bumped
// by every claim, is the bucket's fencing token.

package kube

import (
	"context"
	"errors"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// errBucketHeld is claim's answer when the bucket is held by a session
// not proven ended, or another session's write won the race to it.
var errBucketHeld = errors.New("kube: bucket held by another session")

// errNotHeld is release's answer when the bucket was written since the
// holding's claim: someone took it, so it is not the session's any more.
var errNotHeld = errors.New("kube: bucket no longer held by this session")

// holding is one session's claim of one bucket, as the claiming write
// left it. It is a value: immutable once claim returns it.
//
// A bucket Lease <group>-b-<i> goes through these states (its holder
// names the state); the arrows are the only writes made to it, each one
// guarded (create only if absent, update on the resourceVersion read),
// so each has one winner.
//
//	absent ──create, holder S, leaseTransitions 0──▶ held by S
//	held by S ──release by S, on the claim's resourceVersion──▶ free (holder "")
//	free ──claim by T, leaseTransitions+1──▶ held by T
//	held by S ──claim by T once S is proven ended, leaseTransitions+1──▶ held by T
//
// Buckets are never deleted, so leaseTransitions only grows: it is a
// token per bucket, and a holding's token is larger than every earlier
// holding's of the bucket.
//
// # Why two sessions never both run a bucket
//
// A session S is proven ended when a quorum read finds no member Lease
// of S's ID, or one of another incarnation (a member Lease is created
// only if absent, so the old one was deleted): the deletion was S's own
// end, after it stopped its code, or an observer's guarded delete, after
// S's fence passed (observe.go). So T takes S's bucket only after S can
// run nothing more. A claim made by a session that was lost meanwhile
// (its member Lease deleted while the claim was in flight) may still be
// written; the caller installs a claimed bucket only while its fence is
// open at the answer, and that fence passed before the observer's delete,
// so such a claim runs nothing, and others see its holder gone and take
// it at once. A holding left in the Lease after a crash is the same
// case: it lives exactly as long as its session.
//
// # What the token protects
//
// A write to the bucket Lease itself on the holding's resourceVersion
// fails once anyone took the bucket; an external store that keeps a
// high-water mark of the token per bucket refuses a stale holder's
// writes. A stale write to another object, unguarded, the API server
// cannot refuse: that is what the fence is for.
type holding struct {
	bucket int
	token  int64                 // the bucket's leaseTransitions at the claim: grows with every claim of the bucket
	rv     string                // the bucket Lease's resourceVersion the claim produced
	lease  *coordinationv1.Lease // the bucket Lease as the claim wrote it
}

// claim takes bucket i for the session, with one guarded write: a create
// if the bucket Lease is absent, else an update on the resourceVersion
// read, if its holder is empty or proven ended (see holding). The answer
// carries the token and the resourceVersion. A bucket the session holds
// already (a retried claim) is answered as it is. errBucketHeld when it
// is held by a session not proven ended, or another claim won.
func (s *session) claim(ctx context.Context, i int) (holding, error) {
	g := s.g
	if i < 0 || i >= g.buckets {
		return holding{}, fmt.Errorf("kube: bucket %d out of [0, %d)", i, g.buckets)
	}
	if !s.live() {
		return holding{}, fmt.Errorf("%w: cannot claim bucket %d", errSessionLost, i)
	}
	name := g.bucketName(i)
	now := metav1.MicroTime{Time: time.Now()}
	cur, err := g.leases.Get(ctx, name, metav1.GetOptions{}) // quorum read
	if apierrors.IsNotFound(err) {
		l := &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: g.labels(kindBucket)},
			Spec: coordinationv1.LeaseSpec{
				HolderIdentity:   &s.identity,
				LeaseTransitions: new(int32(0)),
				AcquireTime:      &now,
			},
		}
		created, err := g.leases.Create(ctx, l, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return holding{}, fmt.Errorf("%w: %s was created meanwhile", errBucketHeld, name)
		}
		if err != nil {
			return holding{}, fmt.Errorf("kube: creating %s: %w", name, err)
		}
		return holdingOf(i, created), nil
	}
	if err != nil {
		return holding{}, fmt.Errorf("kube: reading %s: %w", name, err)
	}
	switch h := holder(cur); {
	case h == s.identity:
		// Ours already: a claim whose answer was lost, retried.
		return holdingOf(i, cur), nil
	case h != "":
		ended, err := g.sessionEnded(ctx, h)
		if err != nil {
			return holding{}, err
		}
		if !ended {
			return holding{}, fmt.Errorf("%w: %s is held by %s", errBucketHeld, name, h)
		}
	}
	next := cur.DeepCopy()
	next.Spec.HolderIdentity = &s.identity
	next.Spec.LeaseTransitions = new(transitions(cur) + 1)
	next.Spec.AcquireTime = &now
	got, err := g.leases.Update(ctx, next, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) {
		return holding{}, fmt.Errorf("%w: %s was written since it was read", errBucketHeld, name)
	}
	if err != nil {
		return holding{}, fmt.Errorf("kube: claiming %s: %w", name, err)
	}
	return holdingOf(i, got), nil
}

// release frees the bucket of h: holder "" on the resourceVersion its
// claim produced. The caller has stopped everything h runs. A conflict
// means someone took the bucket since (the session was proven ended):
// errNotHeld. leaseTransitions is left for the next claim to bump.
func (s *session) release(ctx context.Context, h holding) error {
	next := h.lease.DeepCopy()
	next.Spec.HolderIdentity = new("")
	_, err := s.g.leases.Update(ctx, next, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		return fmt.Errorf("%w: %s: %v", errNotHeld, h.lease.Name, err)
	}
	if err != nil {
		return fmt.Errorf("kube: releasing %s: %w", h.lease.Name, err)
	}
	return nil
}

// sessionEnded reports whether the session of identity is proven ended:
// a quorum read finds no member Lease of its ID, or one held by another
// identity (another incarnation of the ID, created after the old Lease
// was deleted).
func (g *group) sessionEnded(ctx context.Context, identity string) (bool, error) {
	id, ok := identityID(identity)
	if !ok {
		return false, fmt.Errorf("kube: holder %q is not a session identity", identity)
	}
	m, err := g.leases.Get(ctx, g.memberName(id), metav1.GetOptions{}) // quorum read
	if apierrors.IsNotFound(err) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("kube: reading the member Lease of %s: %w", id, err)
	}
	return holder(m) != identity, nil
}

// holdingOf returns the holding of bucket i that the Lease l, as a claim
// wrote or found it, stands for.
func holdingOf(i int, l *coordinationv1.Lease) holding {
	return holding{bucket: i, token: int64(transitions(l)), rv: l.ResourceVersion, lease: l}
}

// holder returns the Lease's holderIdentity, "" for none.
func holder(l *coordinationv1.Lease) string {
	if l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// transitions returns the Lease's leaseTransitions, 0 for none.
func transitions(l *coordinationv1.Lease) int32 {
	if l.Spec.LeaseTransitions == nil {
		return 0
	}
	return *l.Spec.LeaseTransitions
}
