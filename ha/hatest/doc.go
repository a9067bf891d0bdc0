// Package hatest checks a store against the contract the Replicas of
// package ha rely on: the cases of [Cases], each run on a fresh group of
// the store under test. The etcd store (ha/etcd) runs them against a real
// etcd in real time, and package ha against an in-memory store inside a
// testing/synctest bubble, exact and instant; the Kubernetes store
// (ha/kube) holds ten of them, ported to its own harness, against a real
// kube-apiserver.
package hatest
