// deploy/rbac.yaml applied as it is, and what it lets the replicas do and
// refuses them, asked of the server that enforces it.

package kube

import (
	"context"
	"crypto/rand"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/bgctl/controller/ha/kube/internal/kubetest"
)

const manifest = "deploy/rbac.yaml"

// leaseVerbs is what the replicas may do with the Leases of their
// namespace, and all they may do.
var leaseVerbs = []string{"get", "list", "watch", "create", "update", "delete"}

// readManifest decodes every object of deploy/rbac.yaml.
func readManifest(t testing.TB) []runtime.Object {
	t.Helper()
	b, err := os.ReadFile(manifest)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := kubetest.Decode(b)
	if err != nil {
		t.Fatalf("%s: %v", manifest, err)
	}
	return objs
}

// applyManifest makes the replicas' namespace and applies deploy/rbac.yaml
// in it as the administrator, creating each object or updating it to the
// file (the tests run several times against one server), then waits until
// the server's authorizer, which learns of RBAC objects by watching them,
// lets the replicas create Leases.
func applyManifest(t testing.TB, c *cluster) {
	t.Helper()
	manifestMu.Lock() // parallel tests: each apply reads, then updates on what it read
	defer manifestMu.Unlock()
	b, err := os.ReadFile(manifest)
	if err != nil {
		t.Fatal(err)
	}
	if err := kubetest.ApplyRBAC(t.Context(), c.admin, replicaNamespace, b); err != nil {
		t.Fatalf("applying %s: %v", manifest, err)
	}
	if err := kubetest.WaitAllowed(t.Context(), c.replica, replicaNamespace); err != nil {
		t.Fatal(err)
	}
}

// manifestMu makes the tests' applyManifest calls one at a time.
var manifestMu sync.Mutex

// newManifestNamespace makes a namespace of its own for a test, named
// prefix and a random suffix, and applies the manifest's Role and
// RoleBinding in it, binding the manifest's ServiceAccount (which stays in
// replicaNamespace): the replicas' credentials reach its Leases, and no
// other test's Leases share it. It returns the namespace once the
// replicas may create Leases there.
func newManifestNamespace(t testing.TB, c *cluster, prefix string) string {
	t.Helper()
	applyManifest(t, c) // the ServiceAccount
	ns := prefix + "-" + strings.ToLower(rand.Text()[:8])
	ctx := t.Context()
	if err := kubetest.Apply(ctx, c.admin.CoreV1().Namespaces(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	for _, obj := range readManifest(t) {
		var err error
		switch o := obj.(type) {
		case *rbacv1.Role:
			o.Namespace = ns
			err = kubetest.Apply(ctx, c.admin.RbacV1().Roles(ns), o)
		case *rbacv1.RoleBinding:
			o.Namespace = ns
			err = kubetest.Apply(ctx, c.admin.RbacV1().RoleBindings(ns), o)
		}
		if err != nil {
			t.Fatalf("applying %s's %T in %s: %v", manifest, obj, ns, err)
		}
	}
	if err := kubetest.WaitAllowed(ctx, c.replica, ns); err != nil {
		t.Fatal(err)
	}
	return ns
}

// replicaMay asks the server, as the replicas, whether they may do verb
// to resource of group in namespace.
func replicaMay(t testing.TB, verb, group, resource, namespace string) bool {
	t.Helper()
	ok, err := kubetest.Allowed(t.Context(), needCluster(t).replica, verb, group, resource, namespace)
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

// The manifest grants the replicas exactly the Lease verbs the backend
// uses, in their namespace, to their ServiceAccount; and the server, once
// it is applied, agrees.
func TestManifestGrantsTheReplicasTheirLeasesAlone(t *testing.T) {
	c := needCluster(t)
	var role *rbacv1.Role
	var binding *rbacv1.RoleBinding
	for _, obj := range readManifest(t) {
		switch o := obj.(type) {
		case *rbacv1.Role:
			role = o
		case *rbacv1.RoleBinding:
			binding = o
		}
	}
	if role == nil || binding == nil {
		t.Fatalf("%s: want a Role and a RoleBinding", manifest)
	}
	want := []rbacv1.PolicyRule{{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: leaseVerbs}}
	if len(role.Rules) != 1 || !slices.Equal(role.Rules[0].APIGroups, want[0].APIGroups) ||
		!slices.Equal(role.Rules[0].Resources, want[0].Resources) || !slices.Equal(role.Rules[0].Verbs, want[0].Verbs) ||
		len(role.Rules[0].ResourceNames) != 0 {
		t.Errorf("%s: the Role's rules are %+v, want %+v", manifest, role.Rules, want)
	}
	if binding.RoleRef.Kind != "Role" || binding.RoleRef.Name != role.Name || binding.Namespace != role.Namespace {
		t.Errorf("%s: the RoleBinding refers to %+v in %q, not the Role %q in %q", manifest, binding.RoleRef, binding.Namespace, role.Name, role.Namespace)
	}

	applyManifest(t, c)
	for _, verb := range leaseVerbs {
		if !replicaMay(t, verb, "coordination.k8s.io", "leases", replicaNamespace) {
			t.Errorf("the replicas may not %s Leases in %q", verb, replicaNamespace)
		}
	}
	for _, denied := range []struct{ verb, group, resource, namespace string }{
		{"patch", "coordination.k8s.io", "leases", replicaNamespace},
		{"deletecollection", "coordination.k8s.io", "leases", replicaNamespace},
		{"get", "coordination.k8s.io", "leases", otherNamespace},
		{"get", "", "configmaps", replicaNamespace},
		{"get", "", "secrets", replicaNamespace},
		{"list", "", "pods", replicaNamespace},
	} {
		if replicaMay(t, denied.verb, denied.group, denied.resource, denied.namespace) {
			t.Errorf("the replicas may %s %s in %q", denied.verb, denied.resource, denied.namespace)
		}
	}
}

// otherNamespace is another service's: the replicas may read nothing of it.
const otherNamespace = "other-service"

// Beyond the Leases of their namespace the server refuses the replicas:
// another namespace's Leases and ConfigMaps, their own namespace's
// ConfigMaps, and a patch of their own Leases.
func TestReplicaIsForbiddenBeyondItsLeases(t *testing.T) {
	c := needCluster(t)
	applyManifest(t, c)
	ctx := t.Context()
	if err := kubetest.Apply(ctx, c.admin.CoreV1().Namespaces(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: otherNamespace}}); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{otherNamespace, replicaNamespace} {
		if err := kubetest.Apply(ctx, c.admin.CoreV1().ConfigMaps(ns), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "settings"}, Data: map[string]string{"k": "v"}}); err != nil {
			t.Fatal(err)
		}
	}
	theirs := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "theirs"}}
	if err := kubetest.Apply(ctx, c.admin.CoordinationV1().Leases(otherNamespace), theirs); err != nil {
		t.Fatal(err)
	}
	ours, err := c.replica.CoordinationV1().Leases(replicaNamespace).Create(ctx,
		&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{GenerateName: "forbidden-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the replicas cannot create a Lease in their namespace: %v", err)
	}
	t.Cleanup(func() {
		_ = c.admin.CoordinationV1().Leases(replicaNamespace).Delete(context.Background(), ours.Name, metav1.DeleteOptions{})
	})

	for _, tc := range []struct {
		what string
		do   func() error
	}{
		{"get a Lease of another namespace", func() error {
			_, err := c.replica.CoordinationV1().Leases(otherNamespace).Get(ctx, "theirs", metav1.GetOptions{})
			return err
		}},
		{"list the Leases of another namespace", func() error {
			_, err := c.replica.CoordinationV1().Leases(otherNamespace).List(ctx, metav1.ListOptions{})
			return err
		}},
		{"create a Lease in another namespace", func() error {
			_, err := c.replica.CoordinationV1().Leases(otherNamespace).Create(ctx,
				&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "intruder"}}, metav1.CreateOptions{})
			return err
		}},
		{"get a ConfigMap of another namespace", func() error {
			_, err := c.replica.CoreV1().ConfigMaps(otherNamespace).Get(ctx, "settings", metav1.GetOptions{})
			return err
		}},
		{"get a ConfigMap of their own namespace", func() error {
			_, err := c.replica.CoreV1().ConfigMaps(replicaNamespace).Get(ctx, "settings", metav1.GetOptions{})
			return err
		}},
		{"patch their own Lease", func() error {
			_, err := c.replica.CoordinationV1().Leases(replicaNamespace).Patch(ctx, ours.Name,
				types.MergePatchType, []byte(`{"spec":{"holderIdentity":"patched"}}`), metav1.PatchOptions{})
			return err
		}},
	} {
		if err := tc.do(); !apierrors.IsForbidden(err) {
			t.Errorf("the replicas %s: got %v, want Forbidden", tc.what, err)
		}
	}
	// The refusals changed nothing.
	got, err := c.admin.CoordinationV1().Leases(replicaNamespace).Get(ctx, ours.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Spec.HolderIdentity != nil {
		t.Errorf("the refused patch set holderIdentity %q", *got.Spec.HolderIdentity)
	}
	if _, err := c.admin.CoordinationV1().Leases(otherNamespace).Get(ctx, "intruder", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the refused create in %q: getting its Lease: %v, want NotFound", otherNamespace, err)
	}
}

// Every primitive of the backend runs with the replicas' token, bound to
// the manifest's Role and nothing more: begin, renew, claim, release, the
// feed's list and watch, an observer's quorum read and guarded delete,
// end. (Every test of session_test.go, claimwrite_test.go and feed_test.go
// runs as the replicas too; this one puts them all in one place, so that
// a verb dropped from the Role fails here by name.)
func TestPrimitivesNeedNoMoreThanTheManifestRole(t *testing.T) {
	c := needCluster(t)
	g := newTestGroup(t, c, 4, nil)                 // applies the manifest; replica's token
	wait := feedLog(t, g, "")                       // list, watch
	s, _ := mustBegin(t, g, "r1")                   // create
	if _, err := s.renew(t.Context()); err != nil { // update
		t.Fatalf("renew: %v", err)
	}
	o := newObserver(otherReplica(t, c, g, nil))
	name := namesIn(g, 0, 1)[0]
	if _, err := s.change(t.Context(), o, 0, claimChange{claim: []string{name}}); err != nil { // get, create
		t.Fatalf("claim: %v", err)
	}
	if _, err := s.change(t.Context(), o, 0, claimChange{release: []string{name}}); err != nil { // get, update
		t.Fatalf("release: %v", err)
	}
	gone, _ := mustBegin(t, g, "r2")
	seeNow(t, o, gone) // get
	st, _ := o.stampOf(gone.identity)
	sleepUntil(st.due())
	if ended, err := o.expire(t.Context(), gone.identity); !ended || err != nil { // get, delete
		t.Fatalf("expire: ended %v, %v", ended, err)
	}
	if err := s.end(t.Context()); err != nil { // delete
		t.Fatalf("end: %v", err)
	}
	wait(func(chs []change) bool {
		return len(chs) > 0 && chs[len(chs)-1].kind == changeDelete && chs[len(chs)-1].lease.Name == s.name
	})
}
