// Package kube is where a backend for github.com/bgctl/controller/ha that
// keeps its leases in Kubernetes (coordination.k8s.io/v1 Lease objects)
// instead of etcd is being built. It has no API yet: nothing here is for a
// program to import.
//
// Its safety primitives exist, unexported, for the backend interface the
// shared part of ha will call: a member session per replica, one Lease,
// valid from the send time of its last answered renewal (session.go);
// observers that prove a silent session ended by a delete guarded by the
// version they saw unchanged for the lease duration on their own clock
// (observe.go); buckets, Leases never deleted, claimed by one guarded
// write, living off the holder's session, their leaseTransitions a token
// that only grows (bucket.go); and a feed of the group's Leases in commit
// order that lists again when its watch expires (feed.go). The safety
// argument is written where their states are declared.
//
// Beneath them lies the ground the backend stands on, tested against a
// real kube-apiserver rather than a fake:
//
//   - deploy/rbac.yaml, the ServiceAccount, Role and RoleBinding a
//     service's replicas will need: get, list, watch, create, update and
//     delete on Lease objects in their own namespace, and nothing else;
//   - tests that apply that manifest as it is, then, with the replicas'
//     credentials, go through a Lease's life (create, read, update, list,
//     watch, delete), see a write from a stale resourceVersion refused with
//     a Conflict (the optimistic concurrency a claim will rest on), and are
//     refused everything outside their own Leases.
//
// The tests build the kube-apiserver of a pinned Kubernetes release, and
// the etcd it stores into, from the Go module proxy, once per release, into
// the user cache directory (the first run takes some minutes), and start
// both on free loopback ports. A test that needs them fails, never skips,
// when they cannot be had; -kube.version picks another release.
package kube
