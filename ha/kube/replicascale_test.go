// What whole ha replicas on the Kubernetes store cost at scale, on the
// real API server: the time and the writes for three replicas to place
// -kube.replicascale names, for the survivors to run a crashed replica's
// share, and the writes a second in steady state, at a client rate limit
// a user can set.

package kube

import (
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/bgctl/controller/ha"
)

var (
	replicaScale    = flag.Int("kube.replicascale", 0, "run TestReplicaScaleMeasurement with this many names (the README measures 1000 and 100000)")
	replicaScaleQPS = flag.Float64("kube.replicascale.qps", 50, "with -kube.replicascale: each replica's client rate limit for claims and reads (burst: twice that)")
	replicaScaleD   = flag.Duration("kube.replicascale.d", 10*time.Second, "with -kube.replicascale: the replicas' TTL, the lease duration D")
)

// TestReplicaScaleMeasurement measures three ha replicas on the
// Kubernetes store (256 buckets), each with -kube.replicascale names
// registered and its clients limited to -kube.replicascale.qps: the time
// and the writes until every name runs on exactly one of them; the
// writes a second over 3·D of steady state; then one replica is cut off
// and closed (a crash), and the time and the writes until its names run
// on the two others, against D + 5 s. Zero overlap throughout. A
// measurement, run on demand:
//
//	go test -run TestReplicaScaleMeasurement -kube.replicascale=100000 -v .
func TestReplicaScaleMeasurement(t *testing.T) {
	n := *replicaScale
	if n == 0 {
		t.Log("a measurement, not a test: run it with -kube.replicascale=100000")
		return
	}
	c := needCluster(t)
	applyManifest(t, c)
	d := *replicaScaleD
	group := "s" + strings.ToLower(rand.Text()[:10])
	rec := newRuns()
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("name-%06d", i)
	}
	var writes atomic.Int64
	cuts := map[string]*cut{}
	rs := map[string]*ha.Replica{}
	t.Cleanup(func() {
		for _, r := range rs {
			_ = r.Close()
		}
		rec.mu.Lock()
		defer rec.mu.Unlock()
		if rec.overlaps != 0 {
			t.Errorf("%d starts while another run of the name was in progress; want none", rec.overlaps)
		}
	})
	for _, id := range []string{"a", "b", "c"} {
		cfg := replicaConfig(c, nil)
		cfg.QPS, cfg.Burst = float32(*replicaScaleQPS), int(2**replicaScaleQPS)
		ct := &cut{}
		cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
			ct.rt = writeCounter{rt: rt, n: &writes}
			return ct
		}
		log := logrus.New()
		log.SetLevel(logrus.ErrorLevel)
		r, err := ha.New(Store(cfg, replicaNamespace, StoreOptions{}), ha.Options{Prefix: group, ID: id, TTL: d, Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		for _, nm := range names {
			p := rec.params(id, nm)
			p.StopFunc = func(context.Context) error { return nil } // 100,000 sleeps would measure the sleeps
			if err := r.UpdateController(nm, p); err != nil {
				t.Fatal(err)
			}
		}
		cuts[id], rs[id] = ct, r
	}
	placed := func(what string, limit time.Duration, on ...string) time.Duration {
		start := time.Now()
		for {
			where, all := rec.placement(names)
			good := all
			for _, id := range where {
				good = good && (id == on[0] || id == on[1] || (len(on) > 2 && id == on[2]))
			}
			if good {
				return time.Since(start)
			}
			if time.Since(start) > limit {
				t.Fatalf("%s: not placed within %v", what, limit)
			}
			time.Sleep(50 * time.Millisecond) // a measurement's poll
		}
	}
	start := time.Now()
	w0 := writes.Load()
	for _, id := range []string{"a", "b", "c"} {
		go func() { // joined below: placed waits for every name to run
			if err := rs[id].Join(context.Background()); err != nil {
				t.Errorf("Join(%s): %v", id, err)
			}
		}()
	}
	took := placed("three replicas", 5*time.Minute, "a", "b", "c")
	t.Logf("%d names placed over three replicas %v after they began joining (%v after the last name started), %d writes", n, time.Since(start).Round(10*time.Millisecond), took.Round(10*time.Millisecond), writes.Load()-w0)

	time.Sleep(d) // let the joins' last writes settle before the steady window
	w1 := writes.Load()
	steady := 3 * d
	time.Sleep(steady) // the steady-state window: nothing happens but renewals
	t.Logf("steady state: %d writes in %v, %.2f a second (three sessions renewing every (D − Margin)/4)", writes.Load()-w1, steady, float64(writes.Load()-w1)/steady.Seconds())

	where, _ := rec.placement(names)
	var ofC []string
	for nm, id := range where {
		if id == "c" {
			ofC = append(ofC, nm)
		}
	}
	w2 := writes.Load()
	cuts["c"].off.Store(true)
	crashed := time.Now()
	_ = rs["c"].Close()
	delete(rs, "c")
	placed("after c crashed", 5*time.Minute, "a", "b")
	since := time.Since(crashed)
	first, last, moved := rec.startedBetween(ofC, crashed)
	t.Logf("c's share (%d names, %d moved) runs on a and b %v after the crash (D + %v), %d writes; the first started %v after the crash, the last %v after the first",
		len(ofC), moved, since.Round(10*time.Millisecond), (since - d).Round(10*time.Millisecond), writes.Load()-w2,
		first.Sub(crashed).Round(10*time.Millisecond), last.Sub(first).Round(10*time.Millisecond))
	if since > d+5*time.Second {
		t.Logf("over D + 5 s at %v requests a second", *replicaScaleQPS)
	}
}
