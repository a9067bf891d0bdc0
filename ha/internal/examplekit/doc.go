// Package examplekit holds what the stores' example programs
// (ha/kube/examples/replicas, ha/postgres/examples/replicas) share: their
// main's handling of the command line and exit status, the pages they
// serve (each replica's placement page and health), and the tally of
// where each name runs, which they print and check.
package examplekit
