// Command testservers builds the servers the tests of ha/etcd and ha/kube
// run against (an etcd, a kube-apiserver) before any test starts, so that
// a first run of ./test does not spend a test binary's time on building
// them: go test kills a test binary at -timeout + 1 minute from its start,
// and a cold build of kube-apiserver alone takes about five minutes on two
// cores.
//
//	go run ./internal/testservers [-etcd current,v3.5.23] [-kube current]
//
// Each server is built once per release into the user cache directory
// (package gobuild), where the tests find it; one already there costs a
// --version call. "current" names gobuild.CurrentEtcd or
// gobuild.CurrentKube. By default it builds the releases the tests pick
// without flags: the current etcd and $HA_ETCD_VERSION, and
// $HA_KUBE_VERSION else the current kube-apiserver.
package main

import (
	"cmp"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/bgctl/controller/ha/internal/gobuild"
)

func main() {
	etcd := flag.String("etcd", cmp.Or(os.Getenv("HA_ETCD_VERSION")+",", "")+"current", "the etcd releases to build, comma-separated (current: "+gobuild.CurrentEtcd+")")
	kube := flag.String("kube", cmp.Or(os.Getenv("HA_KUBE_VERSION"), "current"), "the kube-apiserver releases to build, comma-separated (current: "+gobuild.CurrentKube+")")
	flag.Parse()
	start := time.Now()
	failed := false
	build := func(name, release string, get func(string) (string, error)) {
		bin, err := get(release)
		if err != nil {
			fmt.Fprintf(os.Stderr, "testservers: %s %s: %v\n", name, release, err)
			failed = true
			return
		}
		fmt.Printf("testservers: %s %s at %s\n", name, release, bin)
	}
	for _, r := range releases(*etcd, gobuild.CurrentEtcd) {
		build("etcd", r, gobuild.Etcd)
	}
	for _, r := range releases(*kube, gobuild.CurrentKube) {
		build("kube-apiserver", r, gobuild.KubeAPIServer)
	}
	fmt.Printf("testservers: ready in %v\n", time.Since(start).Round(time.Second))
	if failed {
		os.Exit(1)
	}
}

// releases splits a comma-separated list, "current" read as current,
// without empty or repeated elements.
func releases(list, current string) []string {
	var out []string
	for r := range strings.SplitSeq(list, ",") {
		if r = strings.TrimSpace(r); r == "current" {
			r = current
		}
		if r != "" && !slices.Contains(out, r) {
			out = append(out, r)
		}
	}
	return out
}
