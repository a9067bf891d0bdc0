// An example's main: its flags parsed, then its run, and the exit
// status.

package examplekit

import (
	"flag"
	"fmt"
	"os"
)

// Main parses the command line into the flags defined on
// flag.CommandLine and calls run; it exits with status 2 on an argument
// that is no flag, 1 when run fails (printing the error after the
// command's name), and returns when run succeeds.
func Main(name string, run func() error) {
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "%s: unexpected arguments %q\n", name, flag.Args())
		flag.Usage()
		os.Exit(2)
	}
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(1)
	}
}
