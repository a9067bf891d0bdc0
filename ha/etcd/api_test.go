// Tests of the Replica API: bad options, bad calls, and the Manager-like
// methods against etcd.

package etcd

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bgctl/controller"
	"github.com/bgctl/controller/ha"
	"github.com/bgctl/controller/ha/internal/probe"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// kinds returns the prefixes under which a group's keys of each kind live
// (members, claims, published sets), read from every field of k but the
// group's whole prefix, so that a kind added to the layout is checked too.
func kinds(k keys) []string {
	v := reflect.ValueOf(k)
	var out []string
	for i := range v.NumField() {
		if p := v.Field(i).String(); p != k.all {
			out = append(out, p)
		}
	}
	return out
}

// layoutElements returns the elements the key layout puts after a Prefix:
// "members", "claims", "name-sets".
func layoutElements() []string {
	k := keysOf("p")
	var out []string
	for _, p := range kinds(k) {
		out = append(out, strings.TrimSuffix(strings.TrimPrefix(p, k.all), "/"))
	}
	return out
}

// ha refuses a Prefix that holds an element of this package's key layout,
// from a list of its own (ha knows no layout): an element it let through
// would let a group "/p" and a group "/p/<element>" read each other's
// keys (TestGroupsNeverSeeEachOthersKeys). The elements come from the
// layout, so a renamed or added one is checked against ha's list.
func TestLayoutElementsAreRefusedInAPrefix(t *testing.T) {
	elems := layoutElements()
	if len(elems) < 3 {
		t.Fatalf("the layout has the elements %q: want members, claims and published sets at least", elems)
	}
	for _, elem := range elems {
		for _, prefix := range []string{elem, "/p/" + elem, "p/" + elem + "/q"} {
			r, err := ha.New(Store(new(clientv3.Client)), ha.Options{Prefix: prefix, ID: "x", Logger: quietLogger()})
			if err == nil {
				r.Close()
			}
			if !errors.Is(err, ha.ErrInvalidOptions) || !strings.Contains(err.Error(), "Prefix must not have") {
				t.Errorf("Prefix %q, which holds the key layout's element %q: New returned %v, want it refused", prefix, elem, err)
			}
		}
	}
}

// No key of one group reads as a key of another: every pair of accepted
// prefixes built from these elements and the layout's, every key of the
// first (members, claims with names that look like keys themselves, and
// published sets), none under any of the second's kinds of key unless the
// prefixes are one. Before the check, a's claim "members/x" under "/p"
// read to the group "/p/claims" as a member x.
func TestGroupsNeverSeeEachOthersKeys(t *testing.T) {
	layout := layoutElements()
	elems := append([]string{"p", "q", "members", "claims", "name-sets", "names", "claim", "m", ""}, layout...)
	var prefixes []string
	for _, a := range elems {
		for _, b := range elems {
			for _, lead := range []string{"", "/"} {
				prefix := lead + a + "/" + b
				r, err := ha.New(Store(new(clientv3.Client)), ha.Options{Prefix: prefix, ID: "x", Logger: quietLogger()})
				if err != nil {
					continue
				}
				if p := probe.Options(r).(ha.Options).Prefix; !slices.Contains(prefixes, p) {
					prefixes = append(prefixes, p)
				}
				r.Close()
			}
		}
	}
	ids := append([]string{"x", "members", "claims", "name-sets"}, layout...)
	names := []string{"x", "members/x", "claims/x", "names/x", "/members/x", "p/members/x", "q/claims/claims/x", "q/names/x/d/0-of-1", ""}
	for _, e := range layout {
		names = append(names, e+"/x", "q/"+e+"/x", "q/"+e+"/x/d/0-of-1")
	}
	for _, p1 := range prefixes {
		k1 := keysOf(p1)
		var keys []string
		for _, id := range ids {
			keys = append(keys, k1.members+id)
		}
		for _, name := range names {
			keys = append(keys, k1.claims+name)
		}
		for _, id := range ids {
			keys = append(keys, k1.chunkKey(id, "d", 0, 1))
		}
		for _, p2 := range prefixes {
			if p1 == p2 {
				continue
			}
			for _, key := range keys {
				for _, kind := range kinds(keysOf(p2)) {
					if strings.HasPrefix(key, kind) {
						t.Errorf("key %q of the group %q reads as a key of the group %q", key, p1, p2)
					}
				}
			}
		}
	}
	if len(prefixes) < 20 {
		t.Fatalf("only %d prefixes accepted: the test checks too little", len(prefixes))
	}
}

func TestDuplicateIDIsRefused(t *testing.T) {
	c := newCluster(t, 0, testOptions())
	c.join("same")
	opts := c.opts
	opts.Prefix, opts.ID = c.prefix, "same"
	cli := newClient(t, testEtcd)
	defer cli.Close()
	if _, err := ha.Join(context.Background(), Store(cli), opts); !errors.Is(err, ha.ErrDuplicateID) {
		t.Fatalf("second Join with the same ID: %v, want ErrDuplicateID", err)
	}
}

func TestReplicaMirrorsTheManager(t *testing.T) {
	c := newCluster(t, 0, testOptions())
	n := c.join("solo")
	r := n.r
	if err := r.UpdateController("", controller.ControllerParams{DoFunc: controller.NoopFunc}); err == nil {
		t.Error("an empty name was accepted")
	}
	if err := r.RemoveController("nope"); !errors.Is(err, controller.ErrControllerNotFound) {
		t.Errorf("RemoveController of an unknown name: %v", err)
	}
	if r.TriggerController("nope") {
		t.Error("TriggerController of an unknown name reported a trigger")
	}

	var runs, stops atomic.Int64
	var claim atomic.Value
	params := controller.ControllerParams{
		DoFunc: func(ctx context.Context) error {
			cl, ok := ha.ClaimFrom(ctx)
			if !ok {
				t.Error("no claim in DoFunc's context")
			}
			claim.Store(cl)
			runs.Add(1)
			return nil
		},
		StopFunc: func(ctx context.Context) error { stops.Add(1); return nil },
	}
	if err := r.UpdateController("job", params); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the first run", func() bool { return runs.Load() == 1 })
	st := r.Status()
	if len(st.Names) != 1 || st.Names[0].State != "running" || st.Names[0].Holder != "solo" || st.Names[0].Owner != "solo" {
		t.Fatalf("status: %+v", st)
	}
	cl := claim.Load().(ha.Claim)
	if st.Names[0].Revision != cl.Revision || cl.Key != c.prefix+"/claims/job" {
		t.Errorf("status revision %d, DoFunc's claim %+v", st.Names[0].Revision, cl)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	got, err := n.cli.Get(ctx, cl.Key)
	if err != nil || len(got.Kvs) != 1 || got.Kvs[0].CreateRevision != cl.Revision || string(got.Kvs[0].Value) != "solo" {
		t.Fatalf("claim key in etcd: %v (err %v)", got.Kvs, err)
	}
	if !r.TriggerController("job") {
		t.Error("TriggerController of a running name reported none")
	}
	waitFor(t, "the triggered run", func() bool { return runs.Load() == 2 })
	if err := r.UpdateController("job", params); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the run after the update", func() bool { return runs.Load() == 3 })
	if ms := r.GetStatusModel(); len(ms) != 1 || ms[0].Name != "job" || ms[0].Status.SuccessCount != 3 {
		t.Errorf("GetStatusModel: %+v", ms)
	}

	if err := r.RemoveControllerAndWait("job"); err != nil {
		t.Fatal(err)
	}
	if stops.Load() != 1 {
		t.Errorf("StopFunc ran %d times, want 1", stops.Load())
	}
	if got, err := n.cli.Get(ctx, cl.Key); err != nil || len(got.Kvs) != 0 {
		t.Errorf("claim key after RemoveControllerAndWait: %v (err %v)", got.Kvs, err)
	}
	if len(r.GetStatusModel()) != 0 {
		t.Error("the controller is still installed")
	}

	if err := r.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r.UpdateController("job", params); !errors.Is(err, ha.ErrClosed) {
		t.Errorf("UpdateController after Leave: %v", err)
	}
	if got, err := n.cli.Get(ctx, c.prefix+"/members/solo"); err != nil || len(got.Kvs) != 0 {
		t.Errorf("member key after Leave: %v (err %v)", got.Kvs, err)
	}
	delete(c.nodes, n.id)
	n.cli.Close()
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// Leave returns when its context ends, with an error, also while a name it
// released earlier has a StopFunc that ignores its context: the worker
// waiting to delete that name's claim gives up with the epoch, and the
// lease is left to expire.
func TestLeaveReturnsWhenItsContextEndsDuringARelease(t *testing.T) {
	c := newCluster(t, 0, testOptions())
	n := c.join("solo")
	r := n.r
	var ran atomic.Bool
	unblock := make(chan struct{})
	err := r.UpdateController("stuck", controller.ControllerParams{
		DoFunc:   func(context.Context) error { ran.Store(true); return nil },
		StopFunc: func(context.Context) error { <-unblock; return nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the first run", ran.Load)
	if err := r.RemoveController("stuck"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	left := make(chan error, 1)
	go func() { left <- r.Leave(ctx) }() // joined below, or by the cleanup after unblock
	select {
	case err := <-left:
		if err == nil {
			t.Error("Leave returned nil with a StopFunc still running")
		}
	case <-time.After(10 * time.Second):
		close(unblock)
		<-left
		t.Fatal("Leave was still blocked 9s after its context ended")
	}
	close(unblock)
	delete(c.nodes, n.id)
	n.cli.Close()
}

// A claim under the replica's own lease that it does not hold for a name
// (an acquire whose answer was lost to a timeout while the name moved) is
// deleted: the replica renews its lease, so the key would otherwise keep
// the name's owner waiting for good.
func TestStrayClaimUnderOwnLeaseIsDeleted(t *testing.T) {
	c := newCluster(t, 0, testOptions())
	n := c.join("solo")
	lease := ha.SessionID(probe.Session(n.r))
	key := c.prefix + "/claims/moved"
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := n.cli.Put(ctx, key, "solo", clientv3.WithLease(clientv3.LeaseID(lease))); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the stray claim's deletion", func() bool {
		got, err := n.cli.Get(ctx, key)
		return err == nil && len(got.Kvs) == 0
	})
}

// Every exported function and method that takes a context treats a nil
// one as context.Background, as Leave always did: none crashes the
// process, from the caller's goroutine or from the package's own.
func TestNilContextIsBackground(t *testing.T) {
	c := newCluster(t, 1, testOptions())
	n := c.newNode("solo")
	events := n.r.Events(nil) //nolint:staticcheck // a nil context is what the test passes
	c.register(n)
	if err := n.r.Join(nil); err != nil { //nolint:staticcheck
		t.Fatalf("Join(nil): %v", err)
	}
	awaitAcquired(t, events, 1)
	st, err := n.r.GroupStatus(nil) //nolint:staticcheck
	if err != nil || len(st.Members) != 1 || st.Members[0].TTL == nil {
		t.Errorf("GroupStatus(nil) = %+v, %v; want one member with its TTL", st.Members, err)
	}
	opts := c.opts
	opts.Prefix, opts.ID = c.prefix, "other"
	other, err := ha.Join(nil, Store(n.cli), opts) //nolint:staticcheck
	if err != nil {
		t.Fatalf("the package's Join(nil): %v", err)
	}
	if err := other.Leave(nil); err != nil { //nolint:staticcheck
		t.Errorf("Leave(nil): %v", err)
	}
	if err := n.r.Leave(nil); err != nil { //nolint:staticcheck
		t.Errorf("Leave(nil): %v", err)
	}
	c.forget(n)
	if !closedWithin(events, 5*time.Second) {
		t.Error("Events(nil)'s channel was not closed within 5s of Leave")
	}
}

// A Leave that comes while the replica waits for its controllers after
// etcd lost its lease (a fence pass) is complete once they stopped: the
// lease is gone, so the names have moved already. Its revocation, answered
// "lease not found", is not Leave's failure.
func TestLeaveAfterTheLeaseWasLostSucceeds(t *testing.T) {
	c := newCluster(t, 0, testOptions())
	n := c.newNode("solo")
	release := make(chan struct{})
	err := n.r.UpdateController("slow", controller.ControllerParams{
		DoFunc: func(ctx context.Context) error {
			<-ctx.Done()
			<-release // past its Margin: the replica waits, and Leave comes meanwhile
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	events := n.r.Events(t.Context())
	if err := n.r.Join(t.Context()); err != nil {
		t.Fatal(err)
	}
	lease := expectEvent(t, events, ha.Acquired, "slow", ha.LeaseGained).Lease
	op := newClient(t, testEtcd)
	defer op.Close()
	if _, err := op.Revoke(t.Context(), clientv3.LeaseID(lease)); err != nil {
		t.Fatal(err)
	}
	expectEvent(t, events, ha.FencePassed, "")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	left := make(chan error, 1)
	go func() { left <- n.r.Leave(ctx) }() // joined below
	// The loop takes the stop request from its channel while it waits for
	// the DoFunc; only then does the DoFunc return.
	waitFor(t, "the loop to take Leave's request", func() bool {
		return probe.Stopped(n.r)
	})
	close(release)
	if err := <-left; err != nil {
		t.Errorf("Leave after the lease was lost = %v, want nil: the lease is gone, every name released", err)
	}
	c.forget(n)
}

// Close during a Join that waits for etcd returns within TTL, as it does
// at any other moment: Join's requests (the grant, the member key, the
// version check) end with the Close, each of which could otherwise take
// RequestTimeout. Join then fails with ErrClosed.
func TestCloseDuringJoinReturnsWithinTTL(t *testing.T) {
	opts := testOptions()
	opts.RequestTimeout = 10 * time.Second // longer than TTL: only the Close may end the requests
	c := newCluster(t, 0, opts)
	n := c.newNode("solo")
	n.proxy.cut() // the grant waits
	joined := make(chan error, 1)
	go func() { joined <- n.r.Join(context.Background()) }() // joined below
	waitFor(t, "Join to start", func() bool {
		return probe.Joined(n.r)
	})
	start := time.Now()
	err := n.r.Close()
	took := time.Since(start)
	t.Logf("Close during Join took %v (TTL %v, RequestTimeout %v): %v", took, opts.TTL, opts.RequestTimeout, err)
	if took > opts.TTL {
		t.Errorf("Close during Join took %v, past TTL %v", took, opts.TTL)
	}
	select {
	case err := <-joined:
		if !errors.Is(err, ha.ErrClosed) {
			t.Errorf("Join interrupted by Close = %v, want ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Join still waits 10s after Close returned")
	}
	n.proxy.heal()
	c.forget(n)
}

// A replica that crashed and starts again under the same ID (a
// StatefulSet's pod name) joins once its previous incarnation's lease has
// run out, within TTL, instead of being refused as a duplicate; its names
// then run on it.
func TestRestartedReplicaKeepsItsID(t *testing.T) {
	c := newCluster(t, 5, testOptions())
	first := c.join("r0")
	c.waitPlacement(c.expected([]string{"r0"}), 10*time.Second)
	c.crash(first) // its lease is left to run out
	crashed := time.Now()
	again := c.join("r0")
	took := time.Since(crashed)
	t.Logf("the restarted r0 joined %v after the crash (TTL %v)", took.Round(time.Millisecond), c.opts.TTL)
	if took > c.opts.TTL+2*time.Second {
		t.Errorf("Join waited %v, past the previous lease's TTL %v", took, c.opts.TTL)
	}
	c.waitPlacement(c.expected([]string{"r0"}), 10*time.Second)
	c.rec.AssertNoOverlap(t)
	_ = again
}
