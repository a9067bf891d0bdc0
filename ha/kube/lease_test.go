// A Lease's life as the replicas will live it, with their credentials:
// the operations the backend will use, and the optimistic concurrency a
// claim will rest on.

package kube

import (
	"context"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// The replicas create, read, update, list, watch and delete a Lease in
// their namespace; a write that names a resourceVersion older than the
// Lease's (an update, a delete's precondition) is refused with a Conflict
// and changes nothing.
func TestReplicaLeaseLifecycle(t *testing.T) {
	c := needCluster(t)
	applyManifest(t, c)
	ctx := t.Context()
	leases := c.replica.CoordinationV1().Leases(replicaNamespace)

	created, err := leases.Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "lifecycle-"},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: new("r1"), LeaseDurationSeconds: new(int32(10))},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	name := created.Name
	t.Cleanup(func() { // when the test fails before its delete
		_ = c.admin.CoordinationV1().Leases(replicaNamespace).Delete(context.Background(), name, metav1.DeleteOptions{})
	})

	read, err := leases.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get: %v", err)
	}
	if holder(read) != "r1" || read.ResourceVersion != created.ResourceVersion {
		t.Fatalf("get: holder %q at %s, want r1 at %s", holder(read), read.ResourceVersion, created.ResourceVersion)
	}

	// Two replicas read the Lease at one resourceVersion and both write:
	// the first wins, the second is refused.
	first, second := read.DeepCopy(), read.DeepCopy()
	first.Spec.HolderIdentity = new("r2")
	won, err := leases.Update(ctx, first, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("update at the current resourceVersion: %v", err)
	}
	if won.ResourceVersion == read.ResourceVersion {
		t.Fatalf("update: the resourceVersion stayed %s", won.ResourceVersion)
	}
	second.Spec.HolderIdentity = new("r3")
	if _, err := leases.Update(ctx, second, metav1.UpdateOptions{}); !apierrors.IsConflict(err) {
		t.Fatalf("update at the stale resourceVersion %s: got %v, want Conflict", read.ResourceVersion, err)
	}

	list, err := leases.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	var listed *coordinationv1.Lease
	for i := range list.Items {
		if list.Items[i].Name == name {
			listed = &list.Items[i]
		}
	}
	if listed == nil || holder(listed) != "r2" || listed.ResourceVersion != won.ResourceVersion {
		t.Fatalf("list: %s is %+v, want held by r2 at %s (the stale update must not land)", name, listed, won.ResourceVersion)
	}

	// A watch from the list's resourceVersion sees what follows it.
	w, err := leases.Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion, FieldSelector: "metadata.name=" + name})
	if err != nil {
		t.Fatalf("watch: %v", err)
	}
	defer w.Stop() // ends the watch's goroutine; its channel closes
	renewed := won.DeepCopy()
	renewed.Spec.RenewTime = &metav1.MicroTime{Time: time.Now().Truncate(time.Microsecond)}
	renewed, err = leases.Update(ctx, renewed, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("renewing update: %v", err)
	}
	ev := nextEvent(t, w)
	if got, ok := ev.Object.(*coordinationv1.Lease); ev.Type != watch.Modified || !ok || got.ResourceVersion != renewed.ResourceVersion || got.Spec.RenewTime == nil {
		t.Fatalf("watch: got %s %+v, want Modified at %s with a renewTime", ev.Type, ev.Object, renewed.ResourceVersion)
	}

	// A delete on condition of the resourceVersion it read: refused for
	// the stale one, done for the current one.
	stale := metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &won.ResourceVersion}}
	if err := leases.Delete(ctx, name, stale); !apierrors.IsConflict(err) {
		t.Fatalf("delete at the stale resourceVersion %s: got %v, want Conflict", won.ResourceVersion, err)
	}
	current := metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &renewed.ResourceVersion}}
	if err := leases.Delete(ctx, name, current); err != nil {
		t.Fatalf("delete at the current resourceVersion: %v", err)
	}
	if ev := nextEvent(t, w); ev.Type != watch.Deleted {
		t.Fatalf("watch: got %s %+v, want Deleted", ev.Type, ev.Object)
	}
	if _, err := leases.Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("get after delete: got %v, want NotFound", err)
	}
}

// nextEvent returns the watch's next event, failing the test after 10s or
// when the watch ends.
func nextEvent(t *testing.T, w watch.Interface) watch.Event {
	t.Helper()
	select {
	case ev, ok := <-w.ResultChan():
		if !ok {
			t.Fatal("watch: the channel closed")
		}
		return ev
	case <-time.After(10 * time.Second):
		t.Fatal("watch: no event within 10s")
	}
	panic("unreachable")
}
