// Package probe lets the tests of the stores' modules (ha/etcd, ha/kube)
// read what a Replica of package ha keeps unexported: its session, its
// fence, its view. Package ha sets every function when it is loaded and
// nothing else sets them; each takes the *ha.Replica (or ha.Options) as
// an any, since this package cannot import ha, which imports it.
package probe
