// Published sets of names at their edges: a set republished while the old
// lease goes, names registered at run time, and the Prefixes a service
// may use.

package etcd

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bgctl/controller/ha"
	"github.com/bgctl/controller/ha/internal/nameset"
	"github.com/bgctl/controller/ha/internal/place"
	"github.com/bgctl/controller/ha/internal/runlog"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// bigNames returns n names of size random letters and digits each: a set
// that deflates to more than one chunk (nameset.MaxChunk) when n × size is about
// 1 MB, as 100,000 realistic names do.
func bigNames(n, size int, seed uint64) []string {
	const alnum = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	rng := rand.New(rand.NewPCG(seed, 7))
	names := make([]string, n)
	for i := range names {
		b := make([]byte, size)
		for j := range b {
			b[j] = alnum[rng.IntN(len(alnum))]
		}
		names[i] = fmt.Sprintf("big-%03d-%s", i, b)
	}
	return names
}

// reorderer is a gRPC client hook for one replica: it can hold the
// answers to its keepalives (the server renews the lease, the replica
// does not hear of it, so its fence passes while its old lease lives),
// and it can order the new epoch's revocation of the old lease between
// the publication of chunk 0 and chunk 1 of its set of names.
type reorderer struct {
	loseKeepAliveAnswers atomic.Bool
	armed                atomic.Bool
	chunk0Put            chan struct{} // closed once chunk 0 was put, armed
	revoked              chan struct{} // closed once a revocation was answered, armed
	once0, onceRev       sync.Once
	revokeErr            atomic.Value // of the revocation that closed revoked
}

func newReorderer() *reorderer {
	return &reorderer{chunk0Put: make(chan struct{}), revoked: make(chan struct{})}
}

func (h *reorderer) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if !h.armed.Load() {
		return invoker(ctx, method, req, reply, cc, opts...)
	}

	switch {
	case strings.HasSuffix(method, "/LeaseRevoke"):
		select { // the revocation is slow: it reaches etcd after chunk 0
		case <-h.chunk0Put:
		case <-ctx.Done():
			return ctx.Err()
		}
		err := invoker(ctx, method, req, reply, cc, opts...)
		if err == nil || isLeaseNotFound(err) {
			h.revokeErr.Store(fmt.Sprint(err))
			h.onceRev.Do(func() { close(h.revoked) })
		}
		return err
	case method == "/etcdserverpb.KV/Put":
		key := string(req.(*etcdserverpb.PutRequest).Key)
		if strings.Contains(key, "/name-sets/") && strings.HasSuffix(key, "/0-of-2") {
			err := invoker(ctx, method, req, reply, cc, opts...)
			if err == nil {
				h.once0.Do(func() { close(h.chunk0Put) })
			}
			return err
		}
		if strings.Contains(key, "/name-sets/") && strings.HasSuffix(key, "/1-of-2") {
			select { // chunk 1 goes after the revocation
			case <-h.revoked:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

// slowStream loses every answer of a keepalive stream while
// loseKeepAliveAnswers: the server renewed the lease, the replica hears an
// error.
type slowStream struct {
	grpc.ClientStream
	h *reorderer
}

func (s slowStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err == nil && s.h.loseKeepAliveAnswers.Load() {
		return status.Error(codes.Unavailable, "the answer was lost on its way back")
	}
	return err
}

func (h *reorderer) stream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	cs, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil || !strings.HasSuffix(method, "/LeaseKeepAlive") {
		return cs, err
	}
	return slowStream{cs, h}, nil
}

// nodeWithHook makes (not joins) a replica named id whose client goes
// through h's interceptors.
func (c *cluster) nodeWithHook(id string, h *reorderer) *node {
	c.t.Helper()
	n := &node{id: id, proxy: newProxy(c.t, c.etcdAddrs()...)}
	cli, err := clientv3.New(clientv3.Config{Endpoints: n.proxy.addrs(), DialTimeout: 2 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(h.unary), grpc.WithChainStreamInterceptor(h.stream)}})
	if err != nil {
		c.t.Fatal(err)
	}
	n.cli = cli
	return c.addNode(n)
}

// A set of names published in more than one chunk (about 1 MB
// of names deflated: 100,000 realistic names) is republished under the
// new lease after a fence pass, to the same keys, while the new epoch
// revokes the old lease (revokeOld) concurrently. When the revocation
// lands between the new epoch's puts of chunk 0 and chunk 1, every
// observer sees: chunk 0 put again (ignored, the set is complete), then
// chunk 1 deleted with the old lease (deleteChunkLocked drops the whole
// set, chunk 0 included), then chunk 1 put (a new, partial set that never
// completes, since chunk 0 is never written again). The member then counts
// as registering every name, for good: the names another version
// registers and it does not, hashed to it, run nowhere until its
// registrations change or the observer lists again.
//
// Here the old replica x (common names only) passes its fence because the
// answers to its keepalives are held (the server renewed them: the old
// lease lives on), and the revocation is held until chunk 0 is put, as a
// revocation retried after a slow or leaderless endpoint is. Before the fix it failed every
// run: the extra names hashed to x stay unplaced.
func TestChunkedSetSurvivesOldLeaseRevokedMidPublish(t *testing.T) {
	opts := testOptions()
	// The old lease must outlive the new epoch's put of chunk 0 (1 MB of
	// names, under -race on a loaded machine): at testOptions' TTL of 2s
	// it ran out first in 3 of 4 runs on a busy machine, and the
	// interleaving the test is about never happened.
	opts.TTL, opts.Margin = 6*time.Second, 1500*time.Millisecond
	c := newCluster(t, 0, opts)
	common := bigNames(160, 6000, 1)
	if got := len(nameset.Encode(slices.Sorted(slices.Values(common)))); got != 2 {
		t.Fatalf("the common names deflate to %d chunks, want 2", got)
	}
	extra := runlog.Names("extra", 40)
	regs := map[string][]string{"x": common, "o": append(slices.Clone(common), extra...)}
	h := newReorderer()
	x := c.nodeWithHook("x", h)
	for _, name := range common {
		if err := x.r.UpdateController(name, c.rec.Params("x", name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := x.r.Join(t.Context()); err != nil {
		t.Fatal(err)
	}
	c.joinWith("o", regs["o"])
	want := place.Expected(regs)
	onX := 0
	for _, name := range extra {
		if place.Owner(name, []string{"o", "x"}) == "x" {
			onX++
		}
	}
	t.Logf("%d of %d extra names hash to x over both members", onX, len(extra))
	took := c.waitPlacement(want, opts.TTL+5*time.Second)
	t.Logf("placed %v after o joined", took)

	ev := x.r.Events(t.Context())
	h.armed.Store(true)
	h.loseKeepAliveAnswers.Store(true)
	sawFence := false
	deadline := time.After(10 * time.Second)
wait:
	for {
		select {
		case e := <-ev:
			switch e.Kind {
			case ha.FencePassed:
				sawFence = true
				h.loseKeepAliveAnswers.Store(false)
			case ha.LeaseGained:
				if sawFence {
					break wait
				}
			}
		case <-deadline:
			t.Fatal("x did not pass its fence and join again within 10s")
		}
	}
	select {
	case <-h.revoked:
	case <-time.After(5 * time.Second):
		select {
		case <-h.chunk0Put:
			t.Fatal("chunk 0 was put again, but the old lease was not revoked")
		default:
			t.Fatal("chunk 0 was not put again under the new lease, nor the old lease revoked")
		}
	}
	if e := h.revokeErr.Load(); e != "<nil>" {
		t.Fatalf("the old lease had ended before its revocation (%v): no interleaving", e)
	}
	t.Log("x joined again; the old lease was revoked between chunk 0 and chunk 1 of its set")
	bound := opts.TTL + 5*time.Second
	start := time.Now()
	for c.rec.Misplaced(want) > 0 && time.Since(start) < bound {
		time.Sleep(20 * time.Millisecond)
	}
	if n := c.rec.Misplaced(want); n > 0 {
		var unconfirmed []string
		for _, ns := range c.nodes["o"].r.Status().Names {
			if ns.OwnerUnconfirmed {
				unconfirmed = append(unconfirmed, ns.Name)
			}
		}
		var nowhere []string
		placed := c.rec.Placement()
		for _, name := range extra {
			if _, ok := placed[name]; !ok {
				nowhere = append(nowhere, name)
			}
		}
		t.Errorf("%v after x joined again, %d names are not where they belong; extra names running nowhere: %v; o marks %d names owner-unconfirmed", bound, n, nowhere, len(unconfirmed))
	}
	c.assertRunsOnlyWhereRegistered(regs)
	c.rec.AssertNoOverlap(t)
}

// A service whose names come and go at run time (one per
// tenant, per object it watches) registers each new name on every replica
// a few milliseconds apart. In each such window the replicas' digests
// differ, and every replica publishes its whole set of names, then
// withdraws it: O(names) bytes written to etcd, and read back by every
// other replica's watch, per name added, where the doc promises "when all
// do [agree], the common case, nothing more is written". Registering n
// names one at a time this way costs O(n²) bytes; each set is also kept
// in etcd's history until compaction.
//
// Three replicas of 20,000 names; 10 names are added, each on r0, r1 and
// r2 20ms apart, 500ms between names. The bound, 64 KB of sets of names
// published per name added (the sets' chunks written to etcd, read back
// from its history), failed every run, by two orders of magnitude; at
// 100,000 names the cost is five times as large. The bytes through the
// replicas' connections are logged, not bounded: a watch that a loaded
// machine leaves silent for the fence window is replaced by a listing of
// every claim, which says nothing of what was published.
// publishedBytes returns the bytes of the values put under prefix in
// revisions from to to, read back from etcd's history by a watch of its
// own, once etcd says the watch has caught up with to.
func publishedBytes(t *testing.T, cli *clientv3.Client, prefix string, from, to int64) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	wch := cli.Watch(ctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(from))
	// etcd answers a progress request only while the watch is caught up:
	// asked again until it is.
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var n int64
	for {
		select {
		case resp, ok := <-wch:
			if !ok {
				t.Fatalf("the watch of %s ended before it caught up with revision %d: %v", prefix, to, ctx.Err())
			}
			if err := resp.Err(); err != nil {
				t.Fatalf("watching %s from revision %d: %v", prefix, from, err)
			}
			for _, ev := range resp.Events {
				if ev.Kv.ModRevision <= to && ev.Type == clientv3.EventTypePut {
					n += int64(len(ev.Kv.Value))
				}
			}
			if resp.IsProgressNotify() && resp.Header.Revision >= to {
				return n
			}
		case <-tick.C:
			if err := cli.RequestProgress(ctx); err != nil {
				t.Fatalf("asking for the watch's progress: %v", err)
			}
		}
	}
}

func TestRuntimeRegistrationPublishesNoWholeSets(t *testing.T) {
	const n, added = 20000, 10
	opts := testOptions()
	// The defaults, as a service of this size runs: 20,000 names under
	// -race on two busy cores, and a difference waits publishAfter,
	// (TTL − Margin)/4 = 1.875s, before a replica publishes its set; the
	// replicas' digests, written 20ms apart, reach each other well within
	// it unless the machine is loaded past what a service would tolerate.
	opts.TTL, opts.Margin = 10*time.Second, 2500*time.Millisecond
	c := newCluster(t, 0, opts)
	for i := range n {
		c.names = append(c.names, fmt.Sprintf("tenant-%x", place.Score("t", fmt.Sprint(i))))
	}
	setBytes := 0
	for _, ch := range nameset.Encode(slices.Sorted(slices.Values(c.names))) {
		setBytes += len(ch)
	}
	ids := []string{"r0", "r1", "r2"}
	var nodes []*node
	for _, id := range ids {
		nd := c.newNode(id)
		c.register(nd)
		nodes = append(nodes, nd)
	}
	for _, nd := range nodes {
		if err := nd.r.Join(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	c.waitPlacement(c.expected(ids), time.Minute)
	time.Sleep(time.Second)
	op := newClient(t, testEtcd)
	defer op.Close()
	revision := func() int64 { return etcdRevision(t, op) }
	traffic := func() (b int64) {
		for _, nd := range nodes {
			b += nd.proxy.bytes.Load()
		}
		return b
	}
	rev0, bytes0 := revision(), traffic()
	for i := range added {
		name := fmt.Sprintf("late-%d", i)
		c.names = append(c.names, name)
		for _, nd := range nodes {
			if err := nd.r.UpdateController(name, c.rec.Params(nd.id, name)); err != nil {
				t.Fatal(err)
			}
			time.Sleep(20 * time.Millisecond)
		}
		time.Sleep(500 * time.Millisecond)
	}
	c.waitPlacement(c.expected(ids), 30*time.Second)
	time.Sleep(time.Second)
	rev, bytes := revision(), traffic()-bytes0
	published := publishedBytes(t, op, keysOf(c.prefix).names, rev0+1, rev)
	perName := published / added
	t.Logf("%d names added at run time to %d replicas of %d names (a set deflates to %d bytes): %d etcd revisions, %d bytes of sets of names published, %d bytes through the replicas' connections (their watches and listings included): %d bytes published per name added",
		added, len(ids), n, setBytes, rev-rev0, published, bytes, perName)
	if perName > 64<<10 {
		t.Errorf("each name registered at run time published %d bytes of sets of names, %.1f whole sets, want under 64 KB", perName, float64(perName)/float64(setBytes))
	}
	// Each replica stops its 6,667 controllers with Leave, as a service
	// of this size would: the cleanup's Close, bound to Margin once the
	// client is gone, ran out on two cores loaded by other tests.
	for _, nd := range nodes {
		c.leave(nd)
	}
	c.rec.AssertNoOverlap(t)
}

// Prefixes a service would choose are accepted: a "names" element (the
// sets of names once lived under it, and "/dns/names" was refused, so a
// rolling upgrade of such a service could not begin) or a "claims-v2" one.
// Only the elements the keys use, members, claims and name-sets, are
// refused (TestGroupsNeverSeeEachOthersKeys).
func TestNaturalPrefixesAreAccepted(t *testing.T) {
	for _, prefix := range []string{"/dns/names", "/registry/names/controllers", "/svc/claims-v2"} {
		_, err := ha.New(Store(&clientv3.Client{}), ha.Options{Prefix: prefix, ID: "web-0"})
		if err != nil {
			t.Errorf("New with Prefix %q, accepted by the release before digests: %v", prefix, err)
		}
	}
}
