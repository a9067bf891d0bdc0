// What claims in bucket Leases cost at scale, on the real API server:
// the writes and the time for three replicas to claim 100,000 names, and
// for the survivors to take a crashed replica's third, at a client rate
// limit a user can set (DESIGN.md, "Writes, by the numbers").

package kube

import (
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"hash/fnv"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

var (
	claimScale = flag.Int("kube.claimscale", 0, "run TestClaimScaleMeasurement with this many names (issue 26: 100000)")
	claimQPS   = flag.Float64("kube.claimscale.qps", 50, "with -kube.claimscale: each replica's client rate limit for claim writes (burst: twice that)")
	claimD     = flag.Duration("kube.claimscale.d", 10*time.Second, "with -kube.claimscale: the lease duration D")
)

// writeCounter counts the writes (POST, PUT, DELETE) a client sends.
type writeCounter struct {
	rt http.RoundTripper
	n  *atomic.Int64
}

func (w writeCounter) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method != http.MethodGet {
		w.n.Add(1)
	}
	return w.rt.RoundTrip(req)
}

// scaleOwner is the owner of name among ids by rendezvous hashing (the
// rule ha's placement uses, in its own words here: this module cannot
// import ha's unexported code).
func scaleOwner(name string, ids []string) string {
	best, bestH := "", uint64(0)
	for _, id := range ids {
		h := fnv.New64a()
		h.Write([]byte(id))
		h.Write([]byte{0})
		h.Write([]byte(name))
		if v := h.Sum64(); best == "" || v > bestH {
			best, bestH = id, v
		}
	}
	return best
}

// TestClaimScaleMeasurement measures, for -kube.claimscale names over 256
// buckets and three replicas, each on clients limited to
// -kube.claimscale.qps, the writes and the time until every name is
// claimed by its owner, all three claiming at once; then one replica
// stops renewing (a crash), and the first survivor whose observer proves
// its end gives its names to their new owners: the writes and the time
// from the crash, against D + 5 s. A measurement, run on demand:
//
//	go test -run TestClaimScaleMeasurement -kube.claimscale=100000 -v .
func TestClaimScaleMeasurement(t *testing.T) {
	n := *claimScale
	if n == 0 {
		t.Log("a measurement, not a test: run it with -kube.claimscale=100000")
		return
	}
	c := needCluster(t)
	applyManifest(t, c)
	const buckets = 256
	name := "scale" + strings.ToLower(rand.Text()[:8])
	base, err := newGroup(nil, nil, name, buckets, *claimD)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.admin.CoordinationV1().Leases(replicaNamespace).DeleteCollection(context.Background(),
			metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: groupLabel + "=" + name})
	})
	ids := []string{"r0", "r1", "r2"}
	var writes atomic.Int64
	reps := map[string]replica{}
	stops := map[string]func() (time.Time, error){}
	for _, id := range ids {
		cfg := replicaConfig(c, nil)
		cfg.QPS, cfg.Burst = float32(*claimQPS), int(2**claimQPS)
		cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return writeCounter{rt: rt, n: &writes} }
		g := groupOn(t, c, base, cfg)
		s, _ := mustBegin(t, g, id)
		reps[id] = replica{s: s, o: newObserver(g)}
		stops[id] = renewing(s)
	}
	defer func() {
		for _, stop := range stops {
			_, _ = stop()
		}
	}()

	// Which names each replica owns, bucket by bucket.
	owned := map[string]map[int][]string{}
	for _, id := range ids {
		owned[id] = map[int][]string{}
	}
	for k := range n {
		nm := fmt.Sprintf("default/endpoint-%07d", k)
		o := scaleOwner(nm, ids)
		owned[o][bucketOf(nm, buckets)] = append(owned[o][bucketOf(nm, buckets)], nm)
	}

	// claimAll has r change every bucket as ask says, eight at a time.
	claimAll := func(r replica, ask func(i int) claimChange) (retries int64) {
		var wg sync.WaitGroup
		sem := make(chan struct{}, 8)
		var failed atomic.Int64
		for i := range buckets {
			ch := ask(i)
			if len(ch.claim) == 0 && len(ch.give) == 0 {
				continue
			}
			wg.Add(1)
			sem <- struct{}{}
			go func() { // joined below
				defer wg.Done()
				defer func() { <-sem }()
				if _, err := r.s.change(context.Background(), r.o, i, ch); err != nil {
					failed.Add(1)
					t.Errorf("%s's change of bucket %d: %v", r.s.identity, i, err)
				}
			}()
		}
		wg.Wait()
		return failed.Load()
	}

	writes.Store(0)
	start := time.Now()
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Add(1)
		go func() { // joined below
			defer wg.Done()
			claimAll(reps[id], func(i int) claimChange { return claimChange{claim: owned[id][i]} })
		}()
	}
	wg.Wait()
	took := time.Since(start)
	startWrites := writes.Load()
	held := map[string]int{}
	for i := range buckets {
		claims, _ := bucketNow(t, c, base, i)
		for _, e := range claims {
			held[e.session]++
		}
	}
	t.Logf("claim scale: %d names over %d buckets, 3 replicas at %.0f writes/s each, claiming at once: all claimed in %v with %d writes (renewals included; %.1f per bucket); held: %v",
		n, buckets, *claimQPS, took.Round(time.Millisecond), startWrites, float64(startWrites)/buckets, held)
	for _, id := range ids {
		want := 0
		for _, names := range owned[id] {
			want += len(names)
		}
		if held[reps[id].s.identity] != want {
			t.Errorf("%s holds %d names, owns %d", id, held[reps[id].s.identity], want)
		}
	}

	// r2 crashes: it stops renewing. The survivors' observers stamp its
	// Lease now (as their feeds would have), and the first to prove its
	// end gives its names to their owners among the survivors.
	_, _ = stops["r2"]()
	delete(stops, "r2")
	crashed := time.Now()
	dead := reps["r2"].s.identity
	l, err := c.admin.CoordinationV1().Leases(replicaNamespace).Get(t.Context(), base.memberName("r2"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	survivors := []string{"r0", "r1"}
	for _, id := range survivors {
		reps[id].o.see(l, crashed)
	}
	var prover replica
	for prover.s == nil {
		if time.Since(crashed) > 3**claimD {
			t.Fatalf("no survivor proved r2's end within %v", 3**claimD)
		}
		time.Sleep(20 * time.Millisecond)
		for _, id := range survivors {
			if ok, err := reps[id].o.expire(t.Context(), dead); err != nil {
				t.Fatal(err)
			} else if ok {
				prover = reps[id]
				break
			}
		}
	}
	proved := time.Since(crashed)
	writes.Store(0)
	retries := claimAll(prover, func(i int) claimChange {
		give := map[string]string{}
		for _, nm := range owned["r2"][i] {
			give[nm] = reps[scaleOwner(nm, survivors)].s.identity
		}
		return claimChange{give: give}
	})
	moved := time.Since(crashed)
	held = map[string]int{}
	for i := range buckets {
		claims, _ := bucketNow(t, c, base, i)
		for _, e := range claims {
			held[e.session]++
		}
	}
	verdict := "within"
	if moved > *claimD+5*time.Second {
		verdict = "PAST"
	}
	t.Logf("claim scale: r2 crashed holding %d names; proven ended %v after (D = %v); its names given to their new owners %v after the crash (%s D + 5 s) with %d writes (renewals included), %d failed; held: %v",
		countNames(owned["r2"]), proved.Round(time.Millisecond), *claimD, moved.Round(time.Millisecond), verdict, writes.Load(), retries, held)
	if held[dead] != 0 {
		t.Errorf("%d names still held by the crashed session", held[dead])
	}
}

// countNames counts the names of a bucket-by-bucket assignment.
func countNames(by map[int][]string) int {
	total := 0
	for _, names := range by {
		total += len(names)
	}
	return total
}
