// Manifests applied as the administrator, and what the server then lets a
// user do.

package kubetest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
)

// Decode returns the objects of a YAML manifest, one per document.
func Decode(manifest []byte) ([]runtime.Object, error) {
	var objs []runtime.Object
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(manifest)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, err
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			return nil, err
		}
		objs = append(objs, obj)
	}
}

// ApplyRBAC makes namespace and applies, as admin, the ServiceAccounts,
// Roles and RoleBindings of manifest, creating each object or updating it
// to the manifest; it refuses a manifest that holds any other kind.
func ApplyRBAC(ctx context.Context, admin kubernetes.Interface, namespace string, manifest []byte) error {
	objs, err := Decode(manifest)
	if err != nil {
		return err
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}
	if err := Apply(ctx, admin.CoreV1().Namespaces(), ns); err != nil {
		return err
	}
	for _, obj := range objs {
		switch o := obj.(type) {
		case *corev1.ServiceAccount:
			err = Apply(ctx, admin.CoreV1().ServiceAccounts(o.Namespace), o)
		case *rbacv1.Role:
			err = Apply(ctx, admin.RbacV1().Roles(o.Namespace), o)
		case *rbacv1.RoleBinding:
			err = Apply(ctx, admin.RbacV1().RoleBindings(o.Namespace), o)
		default:
			return fmt.Errorf("the manifest holds a %T, which ApplyRBAC does not apply", obj)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// ObjectClient is what Apply needs of a typed client.
type ObjectClient[T metav1.Object] interface {
	Create(context.Context, T, metav1.CreateOptions) (T, error)
	Get(context.Context, string, metav1.GetOptions) (T, error)
	Update(context.Context, T, metav1.UpdateOptions) (T, error)
}

// Apply creates obj, or updates the object of its name to it.
func Apply[T metav1.Object](ctx context.Context, client ObjectClient[T], obj T) error {
	_, err := client.Create(ctx, obj, metav1.CreateOptions{})
	if !apierrors.IsAlreadyExists(err) {
		return err
	}
	cur, err := client.Get(ctx, obj.GetName(), metav1.GetOptions{})
	if err != nil {
		return err
	}
	obj.SetResourceVersion(cur.GetResourceVersion())
	_, err = client.Update(ctx, obj, metav1.UpdateOptions{})
	return err
}

// Allowed asks the server whether the user of cs may do verb to resource
// of group in namespace.
func Allowed(ctx context.Context, cs kubernetes.Interface, verb, group, resource, namespace string) (bool, error) {
	review := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
		ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: namespace, Verb: verb, Group: group, Resource: resource},
	}}
	got, err := cs.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, review, metav1.CreateOptions{})
	if err != nil {
		return false, fmt.Errorf("asking whether %s may be done to %s in %q: %w", verb, resource, namespace, err)
	}
	return got.Status.Allowed, nil
}

// WaitAllowed waits up to 10 s until the user of cs may create Leases in
// namespace: the server's authorizer learns of RBAC objects by watching
// them, a moment after they were applied.
func WaitAllowed(ctx context.Context, cs kubernetes.Interface, namespace string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		ok, err := Allowed(ctx, cs, "create", "coordination.k8s.io", "leases", namespace)
		if err != nil || ok {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("10s after applying the manifest, the replicas still may not create Leases in %q", namespace)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
