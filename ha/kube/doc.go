// Package kube is the store of github.com/bgctl/controller/ha on the
// Kubernetes API server: a service's replicas keep their group in the
// Lease objects (coordination.k8s.io/v1) of one namespace, with no etcd
// of their own to run. Make each replica on it with
//
//	r, err := ha.Join(ctx, kube.Store(cfg, namespace, kube.StoreOptions{}), ha.Options{Prefix: "my-service"})
//
// where cfg is the replica's rest.Config (rest.InClusterConfig in a Pod)
// and Prefix names the group's Leases. The replicas need RBAC on leases
// alone, in their namespace: deploy/rbac.yaml. The rest is ha's: each
// name on exactly one live replica, never two at once, DoFunc and
// StopFunc included. Where Kubernetes differs from etcd: the API server
// has no lease TTL, so a silent replica's session ends when another
// replica's observer has seen its Lease unchanged for the lease duration
// (Options.TTL) on its own clock; and ClaimFrom's Claim.Token is the
// name's bucket Lease's leaseTransitions, with Claim.Key that Lease's
// name (DESIGN.md). This module requires ha, which holds no store, and
// brings in no etcd client.
//
// It is made of safety primitives: a member session per replica, one Lease,
// valid from the send time of its last answered renewal, written through
// a client and rate limiter of its own (session.go, clients.go);
// observers that prove a silent session ended by a delete guarded by the
// version they saw unchanged for the lease duration on their own clock,
// that count a deletion they did not make as an end only D after a
// time they know to follow the session's last renewal, and that take a
// version of the Lease in which its session wrote its own end as that
// end at once (observe.go); claims of names as entries in a fixed set
// of bucket Leases, never deleted, changed by one update guarded by the
// resourceVersion read, their leaseTransitions a token that only grows
// per name (claims.go, claimwrite.go); and a feed of the group's Leases
// in commit order that lists again when its watch expires (feed.go). The
// safety argument is written where their states are declared. Made of
// them, kubeBackend (backend.go, backendfeed.go, backendview.go,
// backendsets.go, backendwatch.go, takeover.go) answers the calls of
// ha.Backend through Store (store.go), and passes every case of ha's
// conformance suite, package hatest, on the real API server
// (conformance_test.go).
//
// Beneath them lies the ground the backend stands on, tested against a
// real kube-apiserver rather than a fake:
//
//   - deploy/rbac.yaml, the ServiceAccount, Role and RoleBinding a
//     service's replicas need: get, list, watch, create, update and
//     delete on Lease objects in their own namespace, and nothing else;
//   - tests that apply that manifest as it is, then, with the replicas'
//     credentials, go through a Lease's life (create, read, update, list,
//     watch, delete), see a write from a stale resourceVersion refused with
//     a Conflict (the optimistic concurrency a claim rests on), and are
//     refused everything outside their own Leases.
//
// The tests build the kube-apiserver of a pinned Kubernetes release, and
// the etcd it stores into, from the Go module proxy, once per release, into
// the user cache directory (the first run takes some minutes), and start
// both on free loopback ports. A test that needs them fails, never skips,
// when they cannot be had; -kube.version picks another release.
//
// # In a production cluster
//
// In a Pod, make cfg with rest.InClusterConfig. The store reads the
// projected ServiceAccount token again as soon as the kubelet rewrites
// it, and sends what the file holds: a token revoked right after its
// replacement costs nothing (client-go alone reads the file once a
// minute, and would send the revoked token until then, failing every
// renewal). The group's Leases may share their namespace with any number
// of other Leases: the replicas list and watch theirs by label selector
// alone. A watch answered 410 Gone (the versions it asked for compacted
// away, as happens without the API server's watch cache after a stall
// of more than a compaction interval or two) makes the replicas list
// again; names run on through it. On a busy API server, apply
// deploy/flowcontrol.yaml beside deploy/rbac.yaml: the replicas' Lease
// requests then have a priority level of their own, which other clients'
// floods cannot fill; a 429's Retry-After is waited out within the
// renewal, and [Metrics] counts every answer 429 (or 5xx with
// Retry-After) the store got, the renewals' apart: register it beside
// ha's (or [DefaultMetrics] beside ha.DefaultMetrics). Several API servers behind a load balancer, each with a
// watch cache that lags the others', are safe: the watch only tells an
// observer what changed and when it first saw a version, so a lagging one
// takes over later, never sooner, and every proof that a session ended,
// and every claim, is a request etcd answers (a read naming no
// resourceVersion, a write or delete guarded by one). A replica whose
// connection moves to another server, or whose server dies, keeps its
// names if a renewal is answered before its fence passes, D − Margin
// after the send of the last one answered. DESIGN.md has the
// measurements and the tests.
//
// # What users run today, measured
//
// The backend's figures are to stand beside those of client-go's
// tools/leaderelection with a Lease lock, the leader election
// controller-runtime and most controllers use, measured on the same
// kube-apiserver by
//
//	go test -count=1 -v -timeout 30m -run '^TestClientGoLeaderElectionMeasurement$' -kube.lemeasure .
//
// (about 8 minutes; -kube.lemeasure.runs and -kube.lemeasure.steady set
// the runs of each case and the steady-state window). Three candidates
// run as the replicas, each with its own client through its own TCP
// proxy, which a partition cuts into a black hole; requests time out at
// RenewDeadline/2, as client-go's NewFromKubeconfig sets. A crash stops
// the leader without a release and cuts its proxy, so that nothing it
// sends afterwards arrives; a graceful leave cancels it with
// ReleaseOnCancel. The short setting is kube-vip's. client-go v0.36.3,
// kube-apiserver v1.36.3, one 2-core machine, three runs, min / median /
// max (durations rounded to 10ms):
//
//	LeaseDuration / RenewDeadline / RetryPeriod   15s / 10s / 2s           5s / 3s / 1s
//	crash, to another's OnStartedLeading          14.39s / 16.46s / 17.58s 4.93s / 5.12s / 6.85s
//	partition, cut to another's OnStartedLeading  15.69s / 17.08s / 17.19s 4.54s / 5.14s / 6.11s
//	  another's start less the cut one's
//	  OnStoppedLeading (< 0: two leaders)         5.24s / 5.46s / 6.15s    1.17s / 1.51s / 2.33s
//	heal, the old leader restarted follows        0s / 0s / 10ms           10ms / 10ms / 10ms
//	graceful leave, to another's OnStartedLeading 190ms / 340ms / 690ms    140ms / 250ms / 860ms
//	steady state, Lease writes per second (30s)   0.50 / 0.50 / 0.50       1.00 / 1.00 / 1.00
//	steady state, requests per second, all three  1.13 / 1.13 / 1.13       2.20 / 2.27 / 2.33
//
// What they show:
//
//   - A follower takes over LeaseDuration after it last saw the Lease
//     change, on its own clock, at its next try (tries are RetryPeriod to
//     2.2 RetryPeriod apart): up to 2.6s past LeaseDuration here, less
//     when a crash came late in the leader's renewal period.
//   - No partition here made two leaders at once by client-go's
//     callbacks. A cut-off leader gives up RetryPeriod + RenewDeadline after its last
//     renewal; the others start at least LeaseDuration after they saw it.
//     The difference (3s at the defaults, 1s at kube-vip's), with the
//     followers' lag, is all the old leader's code gets to stop in:
//     nothing waits for that code or bounds it, and client-go accepts
//     settings that leave no such time (4s / 3s / 1s) or less than none
//     (5s / 4s / 2s). The backend's fence is to count from the send
//     time of the last renewal instead, and keep Margin for the code to
//     return.
//   - A leader that lost its Lease does not become a follower: its Run
//     returns (controller-runtime's manager then stops with "leader
//     election lost"). Started again after the heal, it follows the new
//     leader at its first read.
//   - A graceful leave hands the Lease on at a follower's next try,
//     without waiting for the leaving leader's code to stop;
//     TestClientGoHandsOverBeforeTheLeavingLeadersCodeStops shows it on
//     every run. ha's Leave keeps a name until its code has returned.
//   - In steady state the leader writes once per RetryPeriod and each
//     follower reads once per try, for one name.
//
// # Whole replicas on this store, measured beside them
//
// The same cases for ha replicas on this store, on the same kube-apiserver
// and machine, at TTL (the Leases' duration) 15s and 5s, Margin its
// default, four replicas spreading 30 names over 256 buckets, each through
// a transport the test cuts, three runs, min / median / max, measured in
// the same go test run as client-go's (whose figures of that run were
// 14.75s / 16.83s / 16.83s and 5.79s / 5.88s / 7.29s for a crash):
//
//	go test -count=1 -v -timeout 40m -run '^(TestClientGoLeaderElectionMeasurement|TestReplicaMeasurement)$' -kube.lemeasure -kube.rmeasure .
//
//	TTL                                               15s                      5s
//	crash, to its names running elsewhere             14.36s / 14.45s / 14.52s 4.22s / 4.42s / 4.49s
//	partition, the cut replica runs nothing           10.14s / 10.15s / 10.17s 3.21s / 3.22s / 3.24s
//	partition, cut to its names running elsewhere     14.05s / 14.06s / 14.1s  4.62s / 4.65s / 4.65s
//	  elsewhere started less cut one stopped          3.9s / 3.92s / 3.94s     1.4s / 1.41s / 1.43s
//	heal, the healed replica runs a share again       60ms / 250ms / 270ms     180ms / 210ms / 260ms
//	graceful leave, Leave called to names elsewhere   50ms / 80ms / 100ms      100ms / 110ms / 160ms
//
// A crash or a partition moves names TTL after the others last saw the
// replica's Lease change (its last renewal, up to a renewal period before
// the crash), plus their watch's latency: the observers' proof is all
// the wait, for this store's readings of a silent session are never
// short, and no reading frees a name here (ha.Rounding 0),
// and the second ha allows for etcd's whole-second rounding does not
// apply (it did until this measurement: 16.29s / 16.55s / 16.72s and
// 5.31s / 5.41s / 5.46s). The difference with client-go is in what the
// cut-off replica's code gets: its fence stops it at TTL − Margin from
// its last answered renewal's send time, and the others start only once
// their observers have seen its Lease unchanged for TTL, 3.9s later at
// 15s, against client-go's 4.4–6.7s in which nothing bounds the old
// leader's code. A graceful Leave hands every name
// over once its code has returned, within a tenth of a second. Zero
// overlap in every run.
//
// At scale: three replicas sharing 100,000 names over the 256 buckets,
// each client at 50 requests a second (burst 100), TTL 10s, four runs,
// two of them beside other work on the machine:
//
//	go test -count=1 -timeout 30m -run TestReplicaScaleMeasurement -kube.replicascale=100000 -v .
//
//	placed, from the joins                          22.21s / 23.43s / 27.08s / 28.75s, 2,196 to 2,349 writes
//	steady state                                    1.6 writes a second (the three renewals)
//	a crash, to its 33,419 names running elsewhere  TTL + 2.56s / 3.08s / 4.69s / 4.79s, 272 to 274 writes
//	  the first of them                             TTL + 1.81s / 2.41s / 3.04s / 3.76s
//
// A crashed replica's share costs one write per bucket: the survivors'
// replicas hand it over (ha.TakeOver, takeover.go), each rewriting the
// buckets it owns once for both, as soon as its observer counts the
// session ended, and their claims then wait for those writes and find
// the names held with one list of the buckets. Before, each survivor
// claimed its own part with a write to nearly every bucket, each paced
// by its own client's limiter: TTL + 6.9s, 588 writes, the first at
// TTL + 4.5s. The measurement fails past TTL + 5s.
package kube
