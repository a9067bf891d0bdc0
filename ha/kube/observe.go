// Expiry judged by observers: with no TTL on the server, a member Lease
// is proven ended only by a delete that another replica makes after
// seeing it unchanged for its duration on its own clock, guarded so that
// it fails if the holder renewed meanwhile.

package kube

import (
	"context"
	"fmt"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// stamp is what an observer knows of one member Lease: the version it
// last saw, and when it first saw that version on its own monotonic
// clock.
type stamp struct {
	uid      types.UID
	rv       string        // the resourceVersion seen
	seen     time.Time     // monotonic: first receipt of rv (a watch event or a read), after its commit
	duration time.Duration // D, as leaseDurationSeconds says at rv
}

// due returns when the stamped version may be judged expired: seen + D.
func (st stamp) due() time.Time { return st.seen.Add(st.duration) }

// observer judges other sessions' member Leases expired, and proves it
// by deleting them.
//
// # The rule
//
// For each member Lease, the observer stamps every new resourceVersion it
// sees (from the feed or its own reads) with its monotonic receipt time
// t. If the version is still the current one at t + D, by a quorum read
// (a GET with no resourceVersion, served from etcd, never from the watch
// cache), the observer deletes the Lease with preconditions {UID,
// resourceVersion}. The delete succeeds only if nothing was committed to
// the Lease after that version; so the holder's last successful renewal
// is that version's (or an earlier one), sent at s < commit < t, and its
// validity s + D, and its fence s + D − Margin, passed before t + D. A
// renewal still in flight then fails its precondition (404) and the
// holder knows its session lost. Sample, D = 3 s:
//
//	t = 50.0  observer sees rv 41 (stamp: due 53.0)
//	t = 51.0  holder's renewal commits rv 42; the feed is stalled and
//	          the observer does not see it
//	t = 53.0  due: quorum read answers rv 42 → restamp (due 56.0), no delete
//	          (had the read come before the renewal: delete on rv 41 → 409,
//	          a wasted write, then a read and a restamp as above)
//
// # What a stalled or late feed can do
//
// A feed that stops delivering delays nothing but expiry of versions it
// never showed, and can never make a live holder look dead: the quorum
// read before the delete sees the renewal, and if the renewal commits
// between the read and the delete, the delete's precondition fails. A
// version delivered late is stamped late, which only delays its expiry.
// The observer never compares resourceVersions (they are opaque): a
// different one is a new version.
//
// # What is assumed
//
// Nobody deletes a member Lease but its session (end) and observers
// under this rule; leaseDurationSeconds is only written by the session
// that created the Lease. The rate difference of the holder's and the
// observer's monotonic clocks is covered by Margin; clocks need not be
// synchronized (renewTime is never read).
type observer struct {
	g *group // immutable

	mu     sync.Mutex
	stamps map[string]stamp // guarded by mu: member Lease name → its last seen version
}

// newObserver returns an observer of g's member Leases that has seen
// none.
func newObserver(g *group) *observer {
	return &observer{g: g, stamps: make(map[string]stamp)}
}

// see records the member Lease l as received at the monotonic time at:
// a version it has not stamped yet is stamped at; the version it has
// keeps its first stamp.
func (o *observer) see(l *coordinationv1.Lease, at time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if st, ok := o.stamps[l.Name]; ok && st.uid == l.UID && st.rv == l.ResourceVersion {
		return
	}
	d := o.g.duration
	if l.Spec.LeaseDurationSeconds != nil {
		d = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
	}
	o.stamps[l.Name] = stamp{uid: l.UID, rv: l.ResourceVersion, seen: at, duration: d}
}

// forget drops what the observer knows of the member Lease name, which is
// gone.
func (o *observer) forget(name string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.stamps, name)
}

// stampOf returns the observer's stamp of the member Lease name.
func (o *observer) stampOf(name string) (stamp, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	st, ok := o.stamps[name]
	return st, ok
}

// due returns the member Leases whose stamped version is due at now.
func (o *observer) due(now time.Time) []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var names []string
	for name, st := range o.stamps {
		if !now.Before(st.due()) {
			names = append(names, name)
		}
	}
	return names
}

// expire proves the session of the member Lease name ended if it can: if
// the stamped version is due, it reads the Lease with a quorum read, and
// if that shows the same version, deletes it on condition of it
// (deleteIfUnchanged). It answers true when the Lease is gone, by its
// delete or before it; false when it is not due, or a newer version was
// found (and stamped).
func (o *observer) expire(ctx context.Context, name string) (bool, error) {
	st, ok := o.stampOf(name)
	if !ok || time.Now().Before(st.due()) {
		return false, nil
	}
	cur, err := o.g.leases.Get(ctx, name, metav1.GetOptions{}) // no resourceVersion: a quorum read
	if apierrors.IsNotFound(err) {
		o.forget(name)
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("kube: reading %s: %w", name, err)
	}
	if cur.UID != st.uid || cur.ResourceVersion != st.rv {
		o.see(cur, time.Now())
		return false, nil
	}
	return o.deleteIfUnchanged(ctx, name)
}

// deleteIfUnchanged deletes the member Lease name on condition of the
// UID and resourceVersion the observer stamped, if that stamp is due. It
// answers true when the Lease is gone (deleted by this call or already
// before it): its session is proven ended. When the precondition fails
// (the holder renewed after the stamped version; a wasted write), it
// reads the Lease again, stamps what it finds, and answers false.
func (o *observer) deleteIfUnchanged(ctx context.Context, name string) (bool, error) {
	st, ok := o.stampOf(name)
	if !ok || time.Now().Before(st.due()) {
		return false, nil
	}
	err := o.g.leases.Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &st.uid, ResourceVersion: &st.rv}})
	if err == nil || apierrors.IsNotFound(err) {
		o.forget(name)
		return true, nil
	}
	if !apierrors.IsConflict(err) {
		return false, fmt.Errorf("kube: deleting %s on condition of version %s: %w", name, st.rv, err)
	}
	cur, err := o.g.leases.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		o.forget(name)
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("kube: reading %s: %w", name, err)
	}
	o.see(cur, time.Now())
	return false, nil
}
