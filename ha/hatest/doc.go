// Package hatest checks a store against the contract the Replicas of
// package ha rely on: the cases of [Cases], each run on a fresh group of
// the store under test. Every store of this repository passes all of
// them: the etcd store (ha/etcd) against a real etcd and the Kubernetes
// store (ha/kube) against a real kube-apiserver, in real time, and
// the in-memory store of package [github.com/bgctl/controller/ha/sim],
// the reference implementation, inside a testing/synctest bubble, exact
// and instant. A store of your own runs them from a test of its own,
// each case in a group of its own, as sim's conformance test does.
package hatest
