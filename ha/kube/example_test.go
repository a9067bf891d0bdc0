// Examples for the package documentation. They need a Kubernetes API
// server, so they are compiled but not run; examples/replicas is the
// runnable program, on a kube-apiserver it starts.

package kube_test

import (
	"context"
	"fmt"
	"log"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"

	"github.com/bgctl/controller"
	"github.com/bgctl/controller/ha"
	"github.com/bgctl/controller/ha/kube"
)

// Every replica of the service, a Pod of one Deployment or StatefulSet,
// runs the same code: join the group on the Leases of its namespace
// (deploy/rbac.yaml gives its ServiceAccount what it needs), register
// every controller, leave on shutdown. Each controller runs on one
// replica. The pod's name is a stable ID: a container restarted in its
// pod waits in Join for its earlier run's session to end.
func ExampleStore() {
	cfg, err := rest.InClusterConfig() // the Pod's ServiceAccount, its token file read again as it rotates
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := ha.Join(ctx, kube.Store(cfg, "my-namespace", kube.StoreOptions{}),
		ha.Options{Prefix: "my-service", ID: "my-service-0", TTL: 15 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	_ = r.UpdateController("pod-gc", controller.ControllerParams{
		DoFunc:      func(ctx context.Context) error { return nil }, // one step of work
		RunInterval: time.Minute,
	})

	// ... on shutdown: the other replicas take pod-gc over once its
	// code has returned.
	if err := r.Leave(ctx); err != nil {
		log.Print(err)
	}
}

// A write of the user's own that must never come from a former holder
// of the name, even one that was frozen and woke up after its claim
// moved, carries the claim's token, and the object refuses any token
// below the highest written (DESIGN.md, "Token"). Here the object is a
// Lease of the user's (any object with annotations does), and the
// update is guarded by the resourceVersion read, so that two writers
// cannot both pass the check: on a conflict, read again and decide anew.
func ExampleStore_fencedWrite() {
	cfg, err := rest.InClusterConfig()
	if err != nil {
		log.Fatal(err)
	}
	leases := coordinationv1client.NewForConfigOrDie(cfg).Leases("my-namespace")
	_ = controller.ControllerParams{DoFunc: func(ctx context.Context) error {
		claim, ok := ha.ClaimFrom(ctx)
		if !ok {
			return nil // not run by a Replica
		}
		obj, err := leases.Get(ctx, "my-data", metav1.GetOptions{})
		if err != nil {
			return err
		}
		key := "example.com/token." + claim.Name
		if mark, _ := strconv.ParseInt(obj.Annotations[key], 10, 64); claim.Token < mark {
			return fmt.Errorf("%s is held with token %d now, above ours (%d): not writing", claim.Name, mark, claim.Token)
		}
		if obj.Annotations == nil {
			obj.Annotations = map[string]string{}
		}
		obj.Annotations[key] = strconv.FormatInt(claim.Token, 10)
		obj.Annotations["example.com/data"] = "written by the holder of " + claim.Name
		_, err = leases.Update(ctx, obj, metav1.UpdateOptions{}) // a 409 Conflict if anyone wrote since the Get
		return err
	}}
}
