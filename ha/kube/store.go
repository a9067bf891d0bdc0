// The Store a Replica of package ha is made on: a group of replicas on
// the Lease objects of one namespace, each replica's backend a
// kubeBackend (backend.go).

package kube

import (
	"cmp"
	"fmt"

	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"

	"github.com/bgctl/controller/ha"
)

// StoreOptions tunes a Store. The zero value is the default of every
// field.
type StoreOptions struct {
	// Buckets is how many bucket Leases hold the group's claims: 256 if
	// 0. Every replica of a group must use the same: a replica whose
	// count differs from a live member's is refused when it begins.
	Buckets int

	// Metrics counts the store's requests the API server answered
	// "retry later" (see [Metrics]); register it beside ha's. Nil:
	// [DefaultMetrics].
	Metrics *Metrics
}

// Store returns the store of groups of replicas on the Lease objects
// (coordination.k8s.io/v1) of namespace, reached as cfg says: pass it to
// ha.New or ha.Join. The group is Options.Prefix, which must be a valid
// Lease name prefix (lower case letters, digits, '-' and '.'); the
// session's lease duration is Options.TTL. The replicas need RBAC on
// leases only (get, list, watch, create, update, delete) in namespace:
// deploy/rbac.yaml. Renewals go through a client with a rate limiter of
// their own, so that claim writes never hold one back; claims, reads and
// the watch use cfg's QPS and Burst. Every list and watch selects the
// group's Leases by label: other Leases in namespace are never read.
//
// A token file cfg names (BearerTokenFile, as rest.InClusterConfig sets
// it) is read again as soon as it changes, and each request carries
// what it holds then: a Pod's ServiceAccount token, which the kubelet
// rewrites, is used from its rewrite on, even if the old one is revoked
// at once (client-go alone reads the file once a minute). Store copies
// no token out of cfg. While the file cannot be read, or is empty (a
// rewrite in place), a request carries the last token the file held; one
// made before the file ever held a token goes as client-go makes it.
func Store(cfg *rest.Config, namespace string, o StoreOptions) ha.Store {
	return store{cfg: cfg, namespace: namespace, o: o}
}

// store is the ha.Store Store returns. Immutable.
type store struct {
	cfg       *rest.Config
	namespace string
	o         StoreOptions
}

// Backend returns the backend of the replica c describes: its own clients
// (leaseClients), its group, and a fresh observer.
func (s store) Backend(c ha.BackendConfig) (ha.Backend, error) {
	if s.cfg == nil {
		return nil, fmt.Errorf("%w: the Kubernetes client configuration must not be nil", ha.ErrInvalidOptions)
	}
	if s.namespace == "" {
		return nil, fmt.Errorf("%w: the namespace must not be empty", ha.ErrInvalidOptions)
	}
	cfg := withTokenFile(s.cfg)
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("kube: the HTTP client: %w", err)
	}
	m := cmp.Or(s.o.Metrics, DefaultMetrics)
	leases, renewals, err := leaseClients(cfg, hc, s.namespace, m)
	if err != nil {
		return nil, err
	}
	g, err := newGroup(leases, renewals, c.Group, s.o.Buckets, c.TTL)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ha.ErrInvalidOptions, err)
	}
	if err := checkInfixes("member ID", c.ID, false); err != nil {
		return nil, fmt.Errorf("%w: %w", ha.ErrInvalidOptions, err)
	}
	// Through the throttled-requests layer too: its 429s are the store's.
	cl, err := coordinationv1client.NewForConfigAndClient(cfg, m.client(hc, false))
	if err != nil {
		return nil, fmt.Errorf("kube: the version client: %w", err)
	}
	return newKubeBackend(g, c.ID, c.Logger, serverVersion(cl.RESTClient()), c.RequestTimeout), nil
}
