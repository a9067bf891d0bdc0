// The two clients a replica reaches its Leases through: renewals on a
// rate limiter of their own, so that claim writes never delay them.

package kube

import (
	"fmt"
	"net/http"

	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"
)

// leaseClients returns the Lease clients of a replica in namespace, for
// newGroup: leases, for claims, reads and the feed, as cfg says
// (including cfg's RateLimiter, if it sets one); and renewals, for the
// session's writes to its own member Lease, with a token-bucket rate
// limiter of its own, never cfg's RateLimiter, which other clients may
// share: at cfg's QPS and Burst, raised to client-go's defaults (5 a
// second, 10 at once) if lower, or none if cfg's QPS is negative (no
// limit). A session writes its Lease once every (D − Margin)/4, so that
// limiter never holds a renewal back, while a cfg made gentle on the
// server (QPS 1) slows only the claims. Both send through hc (one
// transport, whose HTTP/2 connection carries requests side by side):
// what could make a renewal wait is a client-side limiter, and that is
// not shared. Each client counts in m, if not nil, the answers that ask
// it to retry later (Metrics), the renewals' as renewals.
//
// A sample at QPS 5, Burst 10, D = 10 s, Margin = 2 s: a takeover queues
// 256 bucket writes on leases' limiter, the last sent about 50 s later;
// a renewal due meanwhile, every (D − Margin)/4 = 2 s, takes a token
// from renewals' bucket, full at 10, and goes at once.
func leaseClients(cfg *rest.Config, hc *http.Client, namespace string, m *Metrics) (leases, renewals coordinationv1client.LeaseInterface, err error) {
	cl, err := coordinationv1client.NewForConfigAndClient(cfg, m.client(hc, false))
	if err != nil {
		return nil, nil, fmt.Errorf("kube: the Lease client: %w", err)
	}
	own := rest.CopyConfig(cfg)
	own.RateLimiter = nil // RESTClientForConfigAndClient makes one from QPS and Burst
	if own.QPS >= 0 {
		own.QPS = max(own.QPS, rest.DefaultQPS)
		own.Burst = max(own.Burst, rest.DefaultBurst)
	}
	ren, err := coordinationv1client.NewForConfigAndClient(own, m.client(hc, true))
	if err != nil {
		return nil, nil, fmt.Errorf("kube: the renewals' Lease client: %w", err)
	}
	return cl.Leases(namespace), ren.Leases(namespace), nil
}
