// Package gobuild builds the servers the stores' tests run against (etcd,
// kube-apiserver) with the go command from the Go module proxy: a binary
// per release, built once into the user cache directory under a file
// lock, and kept only once it runs and reports that release. The tests of
// ha/etcd and of ha/kube share one etcd binary per release this way.
package gobuild
