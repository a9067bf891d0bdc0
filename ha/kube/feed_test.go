// The feed against real kube-apiservers, with the replicas' credentials:
// changes in commit order, and a listing when the watch's history has
// expired (410 Gone).

package kube

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// uncachedServer starts, for the test, another kube-apiserver on the
// cluster's etcd that serves watches from etcd itself (no watch cache),
// and returns its Lease client with the replicas' token. A watch from a
// resourceVersion that etcd has compacted away is then answered 410 Gone,
// as the shared server's watch cache, which ignores etcd's compactions,
// would answer only once it had dropped the version itself (minutes
// later, after enough writes).
func uncachedServer(t *testing.T, c *cluster) *kubernetes.Clientset {
	t.Helper()
	api, err := startAPIServer(c.apiBin, c.release, c.etcdURL, t.TempDir(), "--watch-cache=false")
	if err != nil {
		t.Fatalf("another kube-apiserver: %v", err)
	}
	t.Cleanup(api.proc.Stop) // before t.TempDir's removal: cleanups run last first
	cfg := &rest.Config{
		Host:            api.url,
		BearerToken:     api.replicaToken,
		TLSClientConfig: rest.TLSClientConfig{CAFile: api.caFile},
		QPS:             1000, Burst: 1000,
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hc.CloseIdleConnections)
	cs, err := kubernetes.NewForConfigAndClient(cfg, hc)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// compactEtcd compacts the cluster's etcd history up to revision rv (a
// resourceVersion is an etcd revision), through etcd's JSON gateway: the
// module has no etcd client, and needs none for this one request.
func compactEtcd(t *testing.T, c *cluster, rv string) {
	t.Helper()
	body := fmt.Sprintf(`{"revision": %q, "physical": true}`, rv)
	resp, err := http.Post(c.etcdURL+"/v3/kv/compaction", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("compacting etcd to %s: %s", rv, resp.Status)
	}
	http.DefaultClient.CloseIdleConnections()
}

// feedLog runs g's feed from rv on a goroutine until the test ends, and
// returns a function that waits until the changes it reported satisfy
// done (failing the test after 10 s) and returns them.
func feedLog(t *testing.T, g *group, rv string) (wait func(done func([]change) bool) []change) {
	t.Helper()
	var mu sync.Mutex
	var log []change // guarded by mu
	ctx, stop := context.WithCancel(t.Context())
	ended := make(chan error, 1)
	go func() { // joined by the cleanup below
		ended <- g.feed(ctx, rv, func(ch change) {
			mu.Lock()
			defer mu.Unlock()
			log = append(log, ch)
		})
	}()
	t.Cleanup(func() {
		stop()
		if err := <-ended; !errors.Is(err, context.Canceled) {
			t.Errorf("feed: %v, want context.Canceled", err)
		}
	})
	return func(done func([]change) bool) []change {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			mu.Lock()
			got := append([]change(nil), log...)
			mu.Unlock()
			if done(got) {
				return got
			}
			if time.Now().After(deadline) {
				t.Fatalf("after 10 s the feed reported %s", describe(got))
			}
		}
	}
}

// describe renders changes for a failure message.
func describe(chs []change) string {
	var b strings.Builder
	for _, ch := range chs {
		switch ch.kind {
		case changeSnapshot:
			fmt.Fprintf(&b, "[snapshot at %s:", ch.rv)
			for _, l := range ch.leases {
				fmt.Fprintf(&b, " %s", l.Name)
			}
			b.WriteString("] ")
		case changePut:
			fmt.Fprintf(&b, "[put %s at %s] ", ch.lease.Name, ch.rv)
		case changeDelete:
			fmt.Fprintf(&b, "[delete %s at %s] ", ch.lease.Name, ch.rv)
		}
	}
	return b.String()
}

// The feed reports a group's Leases, and only them, change by change in
// commit order after a first listing; resumed from a resourceVersion
// whose history etcd compacted away, it is answered 410 Gone and lists
// again, reporting the group as it is now in one snapshot.
func TestFeedInOrderAndRelistAfterExpiry(t *testing.T) {
	c := needCluster(t)
	g := newTestGroup(t, c, 4, nil)
	other := newTestGroup(t, c, 4, nil) // another group in the namespace: never reported
	ctx := t.Context()

	wait := feedLog(t, g, "")
	wait(func(chs []change) bool { return len(chs) > 0 })
	s, _ := mustBegin(t, g, "r1")
	if _, _, err := other.begin(ctx, "r1"); err != nil {
		t.Fatal(err)
	}
	o := newObserver(g)
	name := namesIn(g, 2, 1)[0]
	if _, err := s.change(ctx, o, 2, claimChange{claim: []string{name}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.change(ctx, o, 2, claimChange{release: []string{name}}); err != nil {
		t.Fatal(err)
	}
	if err := s.end(ctx); err != nil {
		t.Fatal(err)
	}
	got := wait(func(chs []change) bool { return len(chs) >= 5 })
	want := []struct {
		kind changeKind
		name string
	}{{changeSnapshot, ""}, {changePut, s.name}, {changePut, g.bucketName(2)}, {changePut, g.bucketName(2)}, {changeDelete, s.name}}
	if len(got) != len(want) {
		t.Fatalf("the feed reported %s, want a snapshot, member put, bucket put twice, member delete", describe(got))
	}
	for i, w := range want {
		if got[i].kind != w.kind || (w.name != "" && got[i].lease.Name != w.name) {
			t.Fatalf("the feed reported %s, want a snapshot, member put, bucket put twice, member delete", describe(got))
		}
	}
	if len(got[0].leases) != 0 {
		t.Fatalf("the first snapshot of a new group: %s, want it empty", describe(got[:1]))
	}
	claimed, err1 := claimsOf(got[2].lease)
	released, err2 := claimsOf(got[3].lease)
	if err1 != nil || err2 != nil || claimed[name].session != s.identity || len(released) != 0 {
		t.Fatalf("the bucket's puts show claims %v (%v) then %v (%v), want %s held by %s then none", claimed, err1, released, err2, name, s.identity)
	}

	// Resumed from the first snapshot's version after etcd compacted it
	// away: the uncached server answers 410, and the feed lists again.
	leases := uncachedServer(t, c).CoordinationV1().Leases(replicaNamespace)
	uncached, err := newGroup(leases, leases, g.name, g.buckets, g.duration)
	if err != nil {
		t.Fatal(err)
	}
	s2, _ := mustBegin(t, g, "r2")
	compactEtcd(t, c, s2.lease.ResourceVersion)
	resumed := feedLog(t, uncached, got[0].rv)
	chs := resumed(func(chs []change) bool { return len(chs) > 0 })
	if chs[0].kind != changeSnapshot {
		t.Fatalf("resumed from a compacted version, the feed reported %s, want a snapshot first", describe(chs))
	}
	var names []string
	for _, l := range chs[0].leases {
		names = append(names, l.Name)
	}
	if want := []string{g.bucketName(2), s2.name}; fmt.Sprint(names) != fmt.Sprint(want) {
		t.Fatalf("the snapshot after 410 holds %v, want %v (the group now)", names, want)
	}
	// And it watches on from the listing.
	if _, err := s2.renew(ctx); err != nil {
		t.Fatal(err)
	}
	resumed(func(chs []change) bool {
		last := chs[len(chs)-1]
		return last.kind == changePut && last.lease.Name == s2.name && last.rv == s2.lease.ResourceVersion
	})
}
