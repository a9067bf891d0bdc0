// Package kubetest builds and starts a real kube-apiserver and the etcd it
// stores into, for the tests of ha/kube and for its example: each server
// is built once per release with the go command from the Go module proxy
// into the user cache directory (<cache>/bgctl-controller-ha/<name>/<release>),
// under a file lock, and started on loopback ports with RBAC, a static
// token for an administrator and one for the replicas' ServiceAccount
// (my-service in namespace my-service, the subject of deploy/rbac.yaml).
package kubetest
