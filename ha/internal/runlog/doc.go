// Package runlog records every DoFunc run and StopFunc call of a test's
// names across the replicas that run them, and checks that no name ever
// ran on two replicas at once. The tests of every store use it.
package runlog
