// Where the replicas run: the cluster of a kubeconfig, the Pod's own, or
// an etcd and a kube-apiserver started here.

package main

import (
	"context"
	"fmt"
	"os"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/bgctl/controller/ha/kube/deploy"
	"github.com/bgctl/controller/ha/kube/internal/kubetest"
)

// cluster is what the replicas run on.
type cluster struct {
	cfg       *rest.Config // the replicas' client configuration
	namespace string       // of the group's Leases
	whole     bool         // the server was started here: the whole group runs in this process
	stop      func()       // stops the servers started here; nothing otherwise
}

// connect returns the cluster of kubeconfig, or, when it is empty, of the
// Pod this runs in, or else starts one here.
func connect(ctx context.Context, kubeconfig, namespace string) (*cluster, error) {
	if kubeconfig != "" || os.Getenv("KUBERNETES_SERVICE_HOST") != "" {
		rules := clientcmd.NewDefaultClientConfigLoadingRules()
		rules.ExplicitPath = kubeconfig // empty in a Pod: its ServiceAccount
		cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{})
		cfg, err := cc.ClientConfig()
		if err != nil {
			return nil, err
		}
		if namespace == "" {
			if namespace, _, err = cc.Namespace(); err != nil {
				return nil, err
			}
		}
		return &cluster{cfg: cfg, namespace: namespace, stop: func() {}}, nil
	}
	if namespace != "" && namespace != kubetest.ReplicaNamespace {
		return nil, fmt.Errorf("-namespace %s: on the server started here the replicas may keep Leases in %s alone", namespace, kubetest.ReplicaNamespace)
	}
	return startCluster(ctx)
}

// startCluster starts an etcd and a kube-apiserver, applies deploy/rbac.yaml
// and returns the configuration of its ServiceAccount, once the server
// lets it keep Leases.
func startCluster(ctx context.Context) (c *cluster, err error) {
	fmt.Printf("no cluster given: starting etcd %s and kube-apiserver %s (built from the Go module proxy the first time: minutes)\n",
		kubetest.CurrentEtcd, kubetest.CurrentKube)
	s, err := kubetest.Start(kubetest.CurrentKube, kubetest.CurrentEtcd)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			s.Stop()
		}
	}()
	as := func(token string) (*rest.Config, *kubernetes.Clientset, error) {
		cfg := &rest.Config{Host: s.API.URL, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAFile: s.API.CAFile}}
		cs, err := kubernetes.NewForConfig(cfg)
		return cfg, cs, err
	}
	_, admin, err := as(s.API.AdminToken)
	if err != nil {
		return nil, err
	}
	if err := kubetest.ApplyRBAC(ctx, admin, kubetest.ReplicaNamespace, deploy.RBAC); err != nil {
		return nil, fmt.Errorf("applying deploy/rbac.yaml: %w", err)
	}
	cfg, replica, err := as(s.API.ReplicaToken)
	if err != nil {
		return nil, err
	}
	if err := kubetest.WaitAllowed(ctx, replica, kubetest.ReplicaNamespace); err != nil {
		return nil, err
	}
	return &cluster{cfg: cfg, namespace: kubetest.ReplicaNamespace, whole: true, stop: s.Stop}, nil
}
