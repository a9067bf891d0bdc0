// Review tests of the paged listing (etcdBackend.listAll, relist) and of the direct
// reads of published name sets (keepFetch).

package etcd

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/bgctl/controller/ha/internal/probe"
	"github.com/bgctl/controller/ha/internal/runlog"
	"github.com/sirupsen/logrus"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// listingNode returns a replica, not joined, whose listings read page keys
// a request, and a prefix of its test's own to list.
func listingNode(t *testing.T, page int) (*node, string) {
	c := newCluster(t, 0, testOptions())
	n := c.newNode("r0")
	n.etcd().listPage = page
	return n, c.prefix + "/list/"
}

// A listing read a key a page while another client puts and deletes keys
// all over the range holds exactly the keys, values and revisions a
// single read at its revision gives: every page after the first reads at
// the first page's revision. TestListingReadsEveryPageAtOneRevision
// writes nothing while its first listing runs, and passes the revision
// itself to the second, so it cannot tell pages read at the current
// revision from pages read at the listing's.
func TestListingHoldsOneRevisionUnderConcurrentWrites(t *testing.T) {
	n, prefix := listingNode(t, 1)
	ctx := context.Background()
	const keys = 40
	for i := range keys {
		if _, err := n.cli.Put(ctx, fmt.Sprintf("%sk%02d", prefix, i), "v0"); err != nil {
			t.Fatal(err)
		}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // joined below
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			k := fmt.Sprintf("%sk%02d", prefix, (i*7)%keys)
			var err error
			switch i % 3 {
			case 0:
				_, err = n.cli.Delete(ctx, k)
			case 1:
				_, err = n.cli.Put(ctx, k, fmt.Sprint("v", i))
			default:
				_, err = n.cli.Put(ctx, k+"x", "new") // a key between two listed ones
			}
			if err != nil {
				t.Error(err)
				return
			}
		}
	}()
	for round := range 5 {
		listingIsOneRead(t, n, prefix, fmt.Sprint("round ", round))
	}
	close(stop)
	wg.Wait()
}

// Replicas whose listings take many pages (two keys a page; the
// handed-before listing of a settling join too) place every name as one
// listing would, through joins, a relist forced by a held watch, a crash
// and a leave, and never run a name twice.
func TestPagedListingsKeepPlacement(t *testing.T) {
	c := newCluster(t, 30, testOptions())
	st := newWatchStaller(t, testEtcd)
	mk := func(id string, via ...string) *node {
		var n *node
		if len(via) > 0 {
			n = c.newNodeVia(id, via...)
		} else {
			n = c.newNode(id)
		}
		n.etcd().listPage = 2
		c.register(n)
		if err := n.r.Join(context.Background()); err != nil {
			t.Fatal(err)
		}
		return n
	}
	mk("r0")
	mk("r1", st.addr())
	c.waitPlacement(c.expected([]string{"r0", "r1"}), 10*time.Second)
	mk("r2") // settles: its first listing looks for names handed over before it
	c.waitPlacement(c.expected([]string{"r0", "r1", "r2"}), 10*time.Second)

	// r1's watch is held: it is replaced after the window, by a relist.
	st.stall()
	c.crash(c.nodes["r0"])
	c.waitPlacement(c.expected([]string{"r1", "r2"}), 15*time.Second)
	if st.heldFrames() == 0 {
		t.Error("the staller held no frame: r1 never relisted, and this test showed less")
	}
	c.leave(c.nodes["r2"])
	c.waitPlacement(c.expected([]string{"r1"}), 15*time.Second)
	c.rec.AssertNoOverlap(t)
}

// A member whose published set does not decode (a later version's
// encoding, say) counts as registering every name, as before; it is
// warned about once, and its set is not read again and again while
// nothing of it changed. Fails at 499f0ea: keepFetch reads the set of
// every member still unconfirmed every half keepalive period, and a set
// that fails to decode is dropped (putChunkLocked), so the member stays
// unconfirmed: on an etcd whose revision moves for other writes (any
// shared cluster; on a quiet one the read is no later than the view and
// dropped), the whole set is read, decoded and warned about again about
// five times a second at TTL 2s (about once a second at the defaults),
// by every replica, for as long as the member lives.
func TestUndecodableSetIsNotReadAgainAndAgain(t *testing.T) {
	opts := testOptions()
	undecodable := &warnCounter{prefix: `member "later" published a set of names that does not decode`}
	l := quietLogger().(*logrus.Logger)
	l.AddHook(undecodable)
	opts.Logger = l
	c := newCluster(t, 0, opts)
	n := c.joinWith("r0", runlog.Names("common", 5))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lease, err := n.cli.Grant(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	ka, err := n.cli.KeepAlive(ctx, lease.ID)
	if err != nil {
		t.Fatal(err)
	}
	go func() { // ends with ctx
		for range ka {
		}
	}()
	k := keysOf(c.prefix)
	const d = "0123456789abcdef0123456789abcdef" // not r0's digest
	if _, err := n.cli.Put(ctx, k.chunkKey("later", d, 0, 1), "not deflate", clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
	if _, err := n.cli.Put(ctx, k.members+"later", memberValue("later", d, false), clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
	// Another user of the etcd cluster writes outside the prefix, so that
	// etcd's revision runs ahead of the last event r0's watch delivered,
	// as it does on any shared cluster.
	go func() { // ends with ctx
		for ctx.Err() == nil {
			_, _ = n.cli.Put(ctx, c.prefix+"-elsewhere", "x")
			time.Sleep(20 * time.Millisecond)
		}
	}()
	deadline := time.Now().Add(5 * time.Second)
	for undecodable.n.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("r0 never read later's set")
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(3 * time.Second)
	if got := undecodable.n.Load(); got > 2 {
		t.Errorf("r0 read later's undecodable set, unchanged, and warned about it %d times in 3s (every %v): the whole set is read again each half keepalive period while the member lives", got, probe.RenewEvery(c.opts)/2)
	}
}

// A serializable read at a revision the member has not applied is
// refused with the error readPage takes for a follower behind, and reads
// the page again linearizably: were etcd to answer otherwise, a listing
// on a lagging follower would fail instead of going to the leader.
func TestReadAheadOfTheMemberIsRecognized(t *testing.T) {
	needEtcd(t)
	cli := newClient(t, testEtcd)
	defer cli.Close()
	rev := etcdRevision(t, cli)
	_, err := cli.Get(context.Background(), "/any", clientv3.WithRev(rev+1000), clientv3.WithSerializable())
	if !isFutureRev(err) {
		t.Errorf("a serializable read at revision %d, past the store's %d: %v, want a future-revision error", rev+1000, rev, err)
	}
}

// listingIsOneRead lists prefix with n's backend (listAll), and fails the
// test unless the listing holds exactly the keys, values and revisions
// that one read at the listing's revision gives.
func listingIsOneRead(t *testing.T, n *node, prefix, what string) {
	t.Helper()
	ctx := context.Background()
	kvs, rev, err := n.etcd().listAll(ctx, prefix, 0)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := n.cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(rev))
	if err != nil {
		t.Fatal(err)
	}
	var got, want []string
	for _, kv := range kvs {
		got = append(got, fmt.Sprintf("%s=%s@%d", kv.Key, kv.Value, kv.ModRevision))
	}
	for _, kv := range resp.Kvs {
		want = append(want, fmt.Sprintf("%s=%s@%d", kv.Key, kv.Value, kv.ModRevision))
	}
	if !slices.Equal(got, want) {
		t.Errorf("%s: the paged listing at revision %d (latest %d) read\n%v\nbut one read at that revision has\n%v", what, rev, resp.Header.Revision, got, want)
	}
}
