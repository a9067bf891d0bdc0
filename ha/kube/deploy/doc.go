// Package deploy holds the manifests that run replicas on a cluster, to
// apply with kubectl:
//
//   - rbac.yaml: the ServiceAccount my-service and a Role and RoleBinding
//     that let it keep Leases in namespace my-service, and nothing more.
//   - flowcontrol.yaml: a PriorityLevelConfiguration and a FlowSchema
//     that serve the replicas' Lease requests, renewals among them, at a
//     priority level of their own, so that other clients flooding the API
//     server cannot queue them (API Priority and Fairness).
//   - deployment.yaml: the example (examples/replicas) as a Deployment of
//     three pods running as that ServiceAccount, each one replica whose ID
//     is its pod's name.
//
// RBAC is rbac.yaml, for programs that apply it themselves: the example
// does, on the kube-apiserver it starts when given no cluster.
package deploy
