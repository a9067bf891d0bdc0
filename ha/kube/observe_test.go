// The observer's judgement of ends, by the evidence it is given, with no
// server: what counts from the stamp, what from the receipt, and what
// ends nothing.

package kube

import (
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// memberLease returns a member Lease of g for identity at version rv.
func memberLease(g *group, identity, uid, rv string) *coordinationv1.Lease {
	id, _ := identityID(identity)
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: g.memberName(id), UID: types.UID(uid), ResourceVersion: rv, Labels: g.labels(kindMember)},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: new(identity), LeaseDurationSeconds: new(int32(g.duration / time.Second))},
	}
}

// endedLease is memberLease for identity, UID u1, carrying the end mark
// of session said (endedAnnotation).
func endedLease(g *group, identity, said, rv string) *coordinationv1.Lease {
	l := memberLease(g, identity, "u1", rv)
	l.Annotations = map[string]string{endedAnnotation: said}
	return l
}

// Each kind of evidence, with times set in the past so that nothing
// waits (D = 2 s): a session is ended when D has passed since a time
// known to follow its last renewal, or at once after the observer's own
// guarded delete or its session's own end mark; evidence that may be
// out of order ends nothing.
func TestObserverEndsOnItsOwnEvidenceOnly(t *testing.T) {
	g, err := newGroup(nil, nil, "g", 4, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	const x, y = "r1/old", "r1/new"
	now := time.Now()
	ago := func(d time.Duration) time.Time { return now.Add(-d) }
	for _, tc := range []struct {
		what  string
		do    func(o *observer)
		ended map[string]bool
	}{
		{"the feed's deletion after its versions: D from the stamp", func(o *observer) {
			o.observe(change{kind: changePut, lease: memberLease(g, x, "u1", "5"), at: ago(3 * time.Second)})
			o.observe(change{kind: changeDelete, lease: memberLease(g, x, "u1", "6"), at: ago(time.Second)})
		}, map[string]bool{x: true}},
		{"the feed's deletion after a recent version: not yet", func(o *observer) {
			o.observe(change{kind: changePut, lease: memberLease(g, x, "u1", "5"), at: ago(time.Second)})
			o.observe(change{kind: changeDelete, lease: memberLease(g, x, "u1", "6"), at: ago(time.Second)})
		}, map[string]bool{x: false}},
		{"the feed's deletion of a Lease only reads showed: D from the event", func(o *observer) {
			o.see(memberLease(g, x, "u1", "5"), ago(3*time.Second))
			o.observe(change{kind: changeDelete, lease: memberLease(g, x, "u1", "9"), at: ago(time.Second)})
		}, map[string]bool{x: false}},
		{"a read finds it absent: D from the read, not the stamp", func(o *observer) {
			o.see(memberLease(g, x, "u1", "5"), ago(10*time.Second))
			o.absent(x, ago(time.Second))
		}, map[string]bool{x: false}},
		{"a read found it absent D ago", func(o *observer) {
			o.absent(x, ago(2*time.Second))
		}, map[string]bool{x: true}},
		{"another incarnation read while the old one is stamped: ends nothing (reads may be answered out of order)", func(o *observer) {
			o.see(memberLease(g, y, "u2", "7"), ago(10*time.Second))
			o.see(memberLease(g, x, "u1", "5"), ago(9*time.Second)) // an older read answered later
		}, map[string]bool{x: false, y: false}},
		{"a listing without a Lease the feed showed: D from the listing", func(o *observer) {
			o.observe(change{kind: changePut, lease: memberLease(g, x, "u1", "5"), at: ago(10 * time.Second)})
			o.observe(change{kind: changeSnapshot, at: ago(3 * time.Second)})
		}, map[string]bool{x: true}},
		{"a listing without a Lease only a read showed: ends nothing (the listing may be older)", func(o *observer) {
			o.see(memberLease(g, x, "u1", "5"), ago(10*time.Second))
			o.observe(change{kind: changeSnapshot, at: ago(3 * time.Second)})
		}, map[string]bool{x: false}},
		{"a listing with another incarnation in place of one the feed showed", func(o *observer) {
			o.observe(change{kind: changePut, lease: memberLease(g, x, "u1", "5"), at: ago(10 * time.Second)})
			o.observe(change{kind: changeSnapshot, leases: []*coordinationv1.Lease{memberLease(g, y, "u2", "8")}, at: ago(time.Second)})
		}, map[string]bool{x: false, y: false}},
		{"its own guarded delete: at once; an old version read later is not stamped", func(o *observer) {
			o.see(memberLease(g, x, "u1", "5"), now)
			o.proven(x)
			o.see(memberLease(g, x, "u1", "5"), now)
		}, map[string]bool{x: true}},
		{"a read's absence, then the feed's deletion after its versions: D from the stamp (the feed showed every version)", func(o *observer) {
			o.observe(change{kind: changePut, lease: memberLease(g, x, "u1", "5"), at: ago(3 * time.Second)})
			o.absent(x, now)
			o.observe(change{kind: changeDelete, lease: memberLease(g, x, "u1", "6"), at: now})
		}, map[string]bool{x: true}},
		{"a read's absence, then the feed's late versions and deletion: D from the read or the last version the feed showed, not an earlier one", func(o *observer) {
			o.observe(change{kind: changePut, lease: memberLease(g, x, "u1", "5"), at: ago(3 * time.Second)})
			o.absent(x, ago(500*time.Millisecond))
			o.observe(change{kind: changePut, lease: memberLease(g, x, "u1", "6"), at: ago(200 * time.Millisecond)}) // stamped while ending
			o.observe(change{kind: changeDelete, lease: memberLease(g, x, "u1", "7"), at: now})
		}, map[string]bool{x: false}},
		{"a stamp never moves back: a read answered before the feed's later version takes the lock after it", func(o *observer) {
			o.observe(change{kind: changePut, lease: memberLease(g, x, "u1", "5"), at: ago(3 * time.Second)})
			o.observe(change{kind: changePut, lease: memberLease(g, x, "u1", "6"), at: ago(time.Second)})
			o.see(memberLease(g, x, "u1", "5"), ago(2500*time.Millisecond))
			o.observe(change{kind: changeDelete, lease: memberLease(g, x, "u1", "7"), at: now})
		}, map[string]bool{x: false}},
		{"a member of a wider D seen: another's absence counts that D, not the group's", func(o *observer) {
			wide := memberLease(g, y, "u2", "7")
			wide.Spec.LeaseDurationSeconds = new(int32(6))
			o.see(wide, ago(10*time.Second))
			o.absent(x, ago(3*time.Second))
		}, map[string]bool{x: false}},
		{"a Lease's D shortened after its last renewal: the earlier, longer D counts", func(o *observer) {
			o.observe(change{kind: changePut, lease: memberLease(g, x, "u1", "5"), at: ago(2500 * time.Millisecond)})
			short := memberLease(g, x, "u1", "6")
			short.Spec.LeaseDurationSeconds = new(int32(1))
			o.observe(change{kind: changePut, lease: short, at: ago(1500 * time.Millisecond)})
			o.observe(change{kind: changeDelete, lease: memberLease(g, x, "u1", "7"), at: now})
		}, map[string]bool{x: false}},
		{"its own end mark, fed or read: at once, and a version after it revives nothing", func(o *observer) {
			o.observe(change{kind: changePut, lease: endedLease(g, x, x, "6"), at: now})
			o.see(endedLease(g, y, y, "7"), now)
			o.observe(change{kind: changePut, lease: memberLease(g, x, "u1", "8"), at: now})
		}, map[string]bool{x: true, y: true}},
		{"an end mark naming another session than the Lease's holder: ends nothing", func(o *observer) {
			o.observe(change{kind: changePut, lease: endedLease(g, x, y, "6"), at: now})
			o.see(endedLease(g, y, x, "7"), now)
		}, map[string]bool{x: false, y: false}},
		{"never seen, never read: not ended", func(o *observer) {}, map[string]bool{x: false}},
	} {
		t.Run(tc.what, func(t *testing.T) {
			o := newObserver(g)
			tc.do(o)
			for id, want := range tc.ended {
				if got := o.ended(id); got != want {
					t.Errorf("ended(%s) = %v, want %v", id, got, want)
				}
			}
		})
	}
}
