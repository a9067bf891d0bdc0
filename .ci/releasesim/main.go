// Command releasesim is the Go half of .ci/release-simulation: it writes
// modules into a file-based GOPROXY, and runs a program built from
// docs/replicas-etcd.md against an etcd, checking what the etcd holds.
//
//	releasesim add -proxy DIR -version V [-query Q] [-time T] MODDIR...
//	releasesim run -etcd ADDR -prefix P -key K PROGRAM
package main

import (
	"fmt"
	"os"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: releasesim add|run ...")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "add":
		err = add(os.Args[2:])
	case "run":
		err = run(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q: want add or run", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "releasesim:", err)
		os.Exit(1)
	}
}
