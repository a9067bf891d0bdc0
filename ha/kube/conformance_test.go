// The contract every store keeps (package hatest), against the
// kube-apiserver the tests start, in real time: each case on the Store a
// user gets (Store, its Backend), on the replicas' credentials.

package kube

import (
	"context"
	"crypto/rand"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/bgctl/controller/ha"
	"github.com/bgctl/controller/ha/hatest"
)

// Each case in a group of its own, side by side (the waits overlap),
// and beside the package's other parallel tests.
func TestBackendConformanceKube(t *testing.T) {
	t.Parallel()
	c := needCluster(t)
	for _, tc := range hatest.Cases() {
		t.Run(tc.Name, func(t *testing.T) {
			t.Parallel()
			tc.Test(t, newConformGroup(t, c))
		})
	}
}

// newConformGroup returns a group of its own on the Store, with one
// bucket, so that the names a case claims together are one record's and
// one write's, as one request holds them all on etcd (how claims spread
// over buckets is TestBackendClaimPositionsAreThoseOfTheirBuckets'). Its
// replicas' transports share the faults of Begin (beginFaults). A
// watcher, a replica with no session, runs the group's feed until the
// test ends (watchAlong), as the group's other replicas would: on
// Kubernetes a session nobody renews ends only once another replica's
// observer proves it. The administrator deletes the group's Leases when
// the test ends.
func newConformGroup(t *testing.T, c *cluster) hatest.Group {
	t.Helper()
	applyManifest(t, c)
	group := "c" + strings.ToLower(rand.Text()[:10])
	deleteGroupAtEnd(t, c, group)
	faults := &beginFaults{}
	cfg := replicaConfig(c, nil)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		c.track(&http.Client{Transport: rt})
		return faultyCreates{rt: rt, f: faults}
	}
	st := Store(cfg, replicaNamespace, StoreOptions{Buckets: 1})
	backend := func(id string) ha.Backend {
		w := hatest.TTL - hatest.TTL/4
		b, err := st.Backend(ha.BackendConfig{Group: group, ID: id, TTL: hatest.TTL, RequestTimeout: 5 * time.Second,
			RenewEvery: w / 4, Window: w, Logger: slog.New(slog.DiscardHandler), Stopping: t.Context()})
		if err != nil {
			t.Fatalf("the backend of %s: %v", id, err)
		}
		return b
	}
	watchAlong(t, backend("watcher"))
	return hatest.Group{
		Backend:   backend,
		Slack:     time.Second,
		Early:     300 * time.Millisecond,
		NoHistory: true,
		SlowBegin: func(d time.Duration) { faults.hold.Store(int64(d)) },
		LoseBegin: func() { faults.lose.Store(true) },
		EndEarly: func(id string) {
			name := group + "-r" + memberInfix + id
			if err := c.admin.CoordinationV1().Leases(replicaNamespace).Delete(t.Context(), name, metav1.DeleteOptions{}); err != nil {
				t.Fatalf("deleting %s by hand: %v", name, err)
			}
		},
		NewReplica: func(id string, o ha.Options) (*ha.Replica, error) {
			o.Prefix, o.ID = group+"-r", id
			deleteGroupAtEnd(t, c, o.Prefix)
			return ha.New(Store(replicaConfig(c, nil), replicaNamespace, StoreOptions{Buckets: 4}), o)
		},
	}
}

// watchAlong runs the group's feed through b, from a listing, as a
// replica does, until the test ends: its observer stamps the others'
// member Leases and proves ended the sessions nobody renews. A feed that
// fails fails the test. Its goroutine is joined by the test's cleanup.
func watchAlong(t *testing.T, b ha.Backend) {
	t.Helper()
	_, from, err := b.List(t.Context())
	if err != nil {
		t.Fatalf("the watcher's listing: %v", err)
	}
	var wg sync.WaitGroup
	f := b.Watch(from, &wg)
	done := make(chan struct{})
	failed := make(chan error, 1)
	wg.Go(func() {
		for {
			select {
			case fb := <-f.Batches():
				if fb.Err != nil {
					failed <- fb.Err
					return
				}
			case <-done:
				return
			}
		}
	})
	t.Cleanup(func() {
		close(done)
		f.Stop()
		wg.Wait()
		select {
		case err := <-failed:
			t.Errorf("the watcher's feed failed: %v", err)
		default:
		}
	})
}

// beginFaults are the faults a group's Begin may meet, shared by its
// replicas' transports (faultyCreates): the next create of a Lease has
// its answer held back by hold, or lost if lose is set. A Begin's
// member Lease is the only Lease the cases create after arming them.
type beginFaults struct {
	hold atomic.Int64 // nanoseconds
	lose atomic.Bool
}

// faultyCreates sends every request through rt, and hands the answer to
// a create (POST) over as f says, once per fault armed.
type faultyCreates struct {
	rt http.RoundTripper // immutable
	f  *beginFaults
}

// errAnswerLost is what a create whose answer faultyCreates lost
// answers, the create carried out.
var errAnswerLost = errors.New("test: the answer to the create was lost")

func (fc faultyCreates) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method != http.MethodPost {
		return fc.rt.RoundTrip(req)
	}
	lose, hold := fc.f.lose.Swap(false), time.Duration(fc.f.hold.Swap(0))
	resp, err := fc.rt.RoundTrip(req)
	if lose && err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return nil, errAnswerLost
	}
	time.Sleep(hold)
	return resp, err
}

// deleteGroupAtEnd has the administrator delete group's Leases when the
// test ends.
func deleteGroupAtEnd(t *testing.T, c *cluster, group string) {
	t.Cleanup(func() {
		err := c.admin.CoordinationV1().Leases(replicaNamespace).DeleteCollection(context.Background(),
			metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: groupLabel + "=" + group})
		if err != nil {
			t.Errorf("deleting group %s: %v", group, err)
		}
	})
}
