// Whole ha replicas on the Kubernetes store measured in the cases
// client-go's leader election is measured in (leaderelection_test.go),
// at the same settings' lease durations, on the same API server: a crash,
// a partition and its heal, a graceful leave.

package kube

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"testing"
	"time"
)

var (
	replicaMeasure = flag.Bool("kube.rmeasure", false, "measure whole ha replicas on Kubernetes (crash, partition, heal, graceful leave) at the lease durations of -kube.lemeasure's settings; takes about 4 minutes")
	replicaRuns    = flag.Int("kube.rmeasure.runs", 3, "with -kube.rmeasure: how many times each case runs")
)

// TestReplicaMeasurement measures, for four replicas spreading 30 names
// over the default 256 buckets, each through a transport a test can cut,
// at TTL = the lease duration of controller-runtime's defaults (15 s) and
// of kube-vip's short setting (5 s), Margin its default: a crash (cut
// and Close) to every name of the crashed replica running elsewhere; a
// partition (cut) to the cut replica running nothing (its fence), and to
// every one of its names running elsewhere; the heal to the healed
// replica running a share again; a Leave to its names running elsewhere.
// Zero overlap throughout. A measurement, off by default:
//
//	go test -count=1 -v -timeout 30m -run '^TestReplicaMeasurement$' -kube.rmeasure .
func TestReplicaMeasurement(t *testing.T) {
	if !*replicaMeasure {
		t.Log("a measurement of about 4 minutes, off by default; run it with: go test -count=1 -v -timeout 30m -run '^TestReplicaMeasurement$' -kube.rmeasure .")
		return
	}
	c := needCluster(t)
	var report []string
	for _, s := range []leSetting{controllerRuntimeDefaults, shortSetting} {
		var crash, stops, starts, gap, heal, leave []time.Duration
		for run := range *replicaRuns {
			t.Run(fmt.Sprintf("%s/%d", s.leaseDuration, run), func(t *testing.T) {
				cr, st, sa, he, le := measureReplicas(t, s.leaseDuration)
				crash, stops, starts, gap, heal, leave = append(crash, cr), append(stops, st), append(starts, sa), append(gap, sa-st), append(heal, he), append(leave, le)
			})
		}
		line := func(what, figures string) string { return fmt.Sprintf("  %-62s %s", what+":", figures) }
		report = append(report, fmt.Sprintf("TTL %v (Margin its default):", s.leaseDuration),
			line("crash takeover (crash to its names running elsewhere)", spread(crash, fmtDuration)),
			line("partition: the cut replica runs nothing (its fence)", spread(stops, fmtDuration)),
			line("partition takeover (cut to its names running elsewhere)", spread(starts, fmtDuration)),
			line("partition gap (elsewhere started - cut one stopped)", spread(gap, fmtDuration)),
			line("heal: the healed replica runs a share again", spread(heal, fmtDuration)),
			line("graceful leave (Leave called to its names elsewhere)", spread(leave, fmtDuration)),
		)
	}
	t.Logf("ha replicas on the Kubernetes store, four replicas (one crashes, one is cut and healed, one leaves), 30 names, 256 buckets, each through its own cuttable transport, against kube-apiserver %s; %d runs, min / median / max:\n%s",
		c.release, *replicaRuns, strings.Join(report, "\n"))
}

// measureReplicas runs one round of the cases at TTL d and returns their
// times: crash takeover, partition stop and takeover, heal, leave.
func measureReplicas(t *testing.T, d time.Duration) (crash, stops, starts, heal, leave time.Duration) {
	g := newKubeReplicas(t, 30)
	g.ttl, g.buckets = d, 256
	for _, id := range []string{"a", "b", "c", "d"} {
		g.join(id)
	}
	g.waitPlaced("four replicas placing", 60*time.Second, "a", "b", "c", "d")

	g.cuts["d"].off.Store(true)
	at := time.Now()
	_ = g.rs["d"].Close()
	delete(g.rs, "d")
	g.waitPlaced("after d crashed", d+60*time.Second, "a", "b", "c")
	crash = time.Since(at)

	g.cuts["c"].off.Store(true)
	at = time.Now()
	for g.runs.on("c") > 0 {
		if time.Since(at) > 2*d {
			t.Fatalf("c, cut off, still runs %d names %v later", g.runs.on("c"), 2*d)
		}
		time.Sleep(10 * time.Millisecond) // a measurement's poll
	}
	stops = time.Since(at)
	g.waitPlaced("after c was cut off", d+60*time.Second, "a", "b")
	starts = time.Since(at)

	g.cuts["c"].off.Store(false)
	at = time.Now()
	for g.runs.on("c") == 0 {
		if time.Since(at) > 60*time.Second {
			t.Fatalf("c, healed, runs nothing 60s later")
		}
		time.Sleep(10 * time.Millisecond) // a measurement's poll
	}
	heal = time.Since(at)
	g.waitPlaced("after the heal", 60*time.Second, "a", "b", "c")

	ctx, cancel := context.WithTimeout(context.Background(), 2*d)
	defer cancel()
	at = time.Now()
	if err := g.rs["b"].Leave(ctx); err != nil {
		t.Errorf("Leave(b): %v", err)
	}
	delete(g.rs, "b")
	g.waitPlaced("after b left", 60*time.Second, "a", "c")
	leave = time.Since(at)
	return crash, stops, starts, heal, leave
}
