// The Store a Replica of package ha is made on: a group of replicas on
// the Lease objects of one namespace, each replica's backend a
// kubeBackend seen through ha's Backend interface.

package kube

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"

	"github.com/bgctl/controller/ha"
)

// StoreOptions tunes a Store. The zero value is the default of every
// field.
type StoreOptions struct {
	// Buckets is how many bucket Leases hold the group's claims: 256 if
	// 0. Every replica of a group must use the same: a replica whose
	// count differs from a live member's is refused when it begins.
	Buckets int

	// Metrics counts the store's requests the API server answered
	// "retry later" (see [Metrics]); register it beside ha's. Nil:
	// [DefaultMetrics].
	Metrics *Metrics
}

// Store returns the store of groups of replicas on the Lease objects
// (coordination.k8s.io/v1) of namespace, reached as cfg says: pass it to
// ha.New or ha.Join. The group is Options.Prefix, which must be a valid
// Lease name prefix (lower case letters, digits, '-' and '.'); the
// session's lease duration is Options.TTL. The replicas need RBAC on
// leases only (get, list, watch, create, update, delete) in namespace:
// deploy/rbac.yaml. Renewals go through a client with a rate limiter of
// their own, so that claim writes never hold one back; claims, reads and
// the watch use cfg's QPS and Burst. Every list and watch selects the
// group's Leases by label: other Leases in namespace are never read.
//
// A token file cfg names (BearerTokenFile, as rest.InClusterConfig sets
// it) is read again as soon as it changes, and each request carries
// what it holds then: a Pod's ServiceAccount token, which the kubelet
// rewrites, is used from its rewrite on, even if the old one is revoked
// at once (client-go alone reads the file once a minute). Store copies
// no token out of cfg. While the file cannot be read, or is empty (a
// rewrite in place), a request carries the last token the file held; one
// made before the file ever held a token goes as client-go makes it.
func Store(cfg *rest.Config, namespace string, o StoreOptions) ha.Store {
	return store{cfg: cfg, namespace: namespace, o: o}
}

// store is the ha.Store Store returns. Immutable.
type store struct {
	cfg       *rest.Config
	namespace string
	o         StoreOptions
}

// Backend returns the backend of the replica c describes: its own clients
// (leaseClients), its group, and a fresh observer.
func (s store) Backend(c ha.BackendConfig) (ha.Backend, error) {
	if s.cfg == nil {
		return nil, fmt.Errorf("%w: the Kubernetes client configuration must not be nil", ha.ErrInvalidOptions)
	}
	if s.namespace == "" {
		return nil, fmt.Errorf("%w: the namespace must not be empty", ha.ErrInvalidOptions)
	}
	cfg := withTokenFile(s.cfg)
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("kube: the HTTP client: %w", err)
	}
	m := cmp.Or(s.o.Metrics, DefaultMetrics)
	leases, renewals, err := leaseClients(cfg, hc, s.namespace, m)
	if err != nil {
		return nil, err
	}
	g, err := newGroup(leases, renewals, c.Group, s.o.Buckets, c.TTL)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ha.ErrInvalidOptions, err)
	}
	if err := checkInfixes("member ID", c.ID, false); err != nil {
		return nil, fmt.Errorf("%w: %w", ha.ErrInvalidOptions, err)
	}
	// Through the throttled-requests layer too: its 429s are the store's.
	cl, err := coordinationv1client.NewForConfigAndClient(cfg, m.client(hc, false))
	if err != nil {
		return nil, fmt.Errorf("kube: the version client: %w", err)
	}
	return seam{newKubeBackend(g, c.ID, c.Logger, serverVersion(cl.RESTClient()), c.RequestTimeout)}, nil
}

// seam is a kubeBackend as ha's Backend: each method converts between
// ha's types and this package's copies of them, and this package's
// errors to ha's sentinels (seamErr).
type seam struct{ b *kubeBackend }

// seamErr wraps err with the ha sentinel its cause stands for: an ended
// or lost session is ha.ErrSessionEnded, a live session of the same ID
// ha.ErrDuplicateID, a bucket too full for the names ha.ErrTooLarge.
func seamErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, errSessionEnded), errors.Is(err, errSessionLost):
		return fmt.Errorf("%w: %w", ha.ErrSessionEnded, err)
	case errors.Is(err, errDuplicateSession):
		return fmt.Errorf("%w: %w", ha.ErrDuplicateID, err)
	case errors.Is(err, errTooLarge), errors.Is(err, errClaimsTooLarge):
		return fmt.Errorf("%w: %w", ha.ErrTooLarge, err)
	}
	return err
}

func (s seam) CheckServers(ctx context.Context) { s.b.checkServers(ctx) }

// Request bounds a request by the request timeout, as ha's Backend
// says: ha reads and rewrites the member record, reads a peer's session
// and ends an old one through it, and a call whose answer never comes
// (a stream lost while the connection lives) must fail for ha to try
// again. A Claim alone takes parent back (claimParent): on Kubernetes a
// Claim of many names is a write for each of up to 256 buckets, paced
// by the client's rate limiter, longer than one request's timeout, and
// it bounds each of those writes by the request timeout instead.
func (s seam) Request(parent context.Context) (context.Context, context.CancelFunc) {
	return s.b.request(context.WithValue(parent, claimParent{}, parent))
}

// claimParent is the key under which Request keeps the context it was
// given, for Claim.
type claimParent struct{}

func (s seam) Begin(ctx context.Context, prev ha.SessionID, ttl time.Duration, digest string) (ha.Session, error) {
	got, err := s.b.begin(ctx, sessionID(prev), ttl, digest)
	if err != nil {
		return ha.Session{}, seamErr(err)
	}
	return ha.Session{ID: ha.SessionID(got.id), Sent: got.sent, JoinedAt: got.joinedAt}, nil
}

func (s seam) Renew(ctx context.Context, id ha.SessionID) (time.Duration, error) {
	valid, err := s.b.renew(ctx, sessionID(id))
	return valid, seamErr(err)
}

func (s seam) End(ctx context.Context, id ha.SessionID) error {
	return seamErr(s.b.end(ctx, sessionID(id)))
}

func (s seam) PutMember(ctx context.Context, id ha.SessionID, digest string, leaving bool) (bool, error) {
	written, err := s.b.putMember(ctx, sessionID(id), digest, leaving)
	return written, seamErr(err)
}

func (s seam) EnsureMember(ctx context.Context, id ha.SessionID, digest string) (ha.SessionID, bool, error) {
	under, found, err := s.b.ensureMember(ctx, sessionID(id), digest)
	return ha.SessionID(under), found, seamErr(err)
}

// Claim bounds each bucket write by the request timeout, not the whole
// call: it runs under the context Request was given, when ctx is one of
// Request's.
func (s seam) Claim(ctx context.Context, id ha.SessionID, names []string) ([]ha.Claimed, []string, error) {
	if parent, ok := ctx.Value(claimParent{}).(context.Context); ok {
		ctx = parent
	}
	got, absent, err := s.b.claim(ctx, sessionID(id), names)
	if err != nil {
		return nil, nil, seamErr(err)
	}
	out := make([]ha.Claimed, len(got))
	for i, c := range got {
		out[i] = ha.Claimed{Name: c.name, Mine: c.ok, Revision: c.rev, At: c.hdr}
		if c.ok {
			out[i].Key, out[i].Token = s.b.g.bucketName(bucketOf(c.name, s.b.g.buckets)), c.token
		} else if c.view != nil {
			out[i].Holder, out[i].Session, out[i].Revision = c.view.holder, ha.SessionID(c.view.lease), c.view.rev
		}
	}
	return out, absent, nil
}

var _ ha.TakeOver = seam{} // a replica on this store hands a crashed member's names over

// TakeOver notes that the replica's ha is handing over (so that its
// claims wait for the survivors' rewrites: awaitHandOvers), then hands
// an ended session's names to their owners on a goroutine counted in wg,
// one write per bucket this replica owns among the live members
// (takeOver), each bounded by the request timeout and ctx. A failure is
// logged at Debug: the claims that follow write what it did not.
func (s seam) TakeOver(ctx context.Context, id ha.SessionID, ownerOf func(name string) string, wg *sync.WaitGroup) {
	s.b.noteHandOver() // counted as running from here, so that a claim that comes first waits for it
	wg.Go(func() {
		defer s.b.handOverDone()
		if _, err := s.b.takeOver(ctx, sessionID(id), ownerOf); err != nil {
			s.b.log.Debug(fmt.Sprintf("kube: handing over the names of ended sessions: %v", err))
		}
	})
}

func (s seam) ClaimCost(name string) int { return s.b.claimCost(name) }

// ClaimLimits lets one Claim carry many names (group.claimBatch): it
// costs one write per bucket its names fall in, not one per name.
func (s seam) ClaimLimits() (names, bytes int) { return s.b.g.claimBatch() }

func (s seam) Release(ctx context.Context, c ha.Claim) error {
	rctx, cancel := s.b.request(ctx)
	defer cancel()
	return seamErr(s.b.release(rctx, c))
}

func (s seam) MemberSession(ctx context.Context) (ha.SessionID, bool, error) {
	id, found, err := s.b.memberSession(ctx)
	return ha.SessionID(id), found, seamErr(err)
}

var _ ha.Rounding = seam{} // a silent session's readings are never short

// Rounding is 0: timeLeft and peerLeft count D from a receipt of the
// member Lease's last version they know of, after that write's commit,
// itself after the send time its holder's fence counts from; so a
// silent member's names start elsewhere as soon as the readings put its
// end, without the second etcd's whole-second truncation needs.
//
// A renewal the observer has not seen yet (its feed stalled, or not
// there yet) is not counted: peerLeft read then puts the end at the
// version before's stamp, short of the holder's validity by up to the
// time between the two writes, and of its fence too
// (TestRoundingReviewPeerLeftIsShortOfAnUnseenRenewal). No reading frees
// a name here: a session's records leave the view, and a Claim takes
// its names, only once this replica's observer counts it ended, on its
// own proof or D after a time past the commit of the session's last
// renewal (observer), whatever ha's hold says
// (TestRoundingReviewShortReadingStartsNoNameEarly); ha's allowance
// would only delay the names further.
func (seam) Rounding() time.Duration { return 0 }

func (s seam) TimeLeft(ctx context.Context, id ha.SessionID) (time.Duration, time.Duration, error) {
	left, granted, err := s.b.timeLeft(ctx, sessionID(id))
	return left, granted, seamErr(err)
}

func (s seam) PeerLeft(ctx context.Context, id ha.SessionID) (time.Duration, time.Duration, error) {
	left, granted, err := s.b.peerLeft(ctx, sessionID(id))
	return left, granted, seamErr(err)
}

func (s seam) Publish(ctx context.Context, id ha.SessionID, digest, old string, chunks [][]byte) error {
	return seamErr(s.b.publish(ctx, sessionID(id), digest, old, chunks))
}

func (s seam) Fetch(ctx context.Context, member, digest string) ([]ha.Chunk, int64, error) {
	rctx, cancel := s.b.request(ctx)
	defer cancel()
	got, at, err := s.b.fetch(rctx, member, digest)
	if err != nil {
		return nil, 0, seamErr(err)
	}
	out := make([]ha.Chunk, len(got))
	for i, c := range got {
		out[i] = haChunk(c)
	}
	return out, at, nil
}

func (s seam) List(ctx context.Context) ([]ha.Change, int64, error) {
	got, at, err := s.b.list(ctx)
	if err != nil {
		return nil, 0, seamErr(err)
	}
	return haChanges(got), at, nil
}

func (s seam) HeldAt(ctx context.Context, at int64) (map[string]bool, error) {
	return s.b.heldAt(ctx, at)
}

// Watch starts the backend's feed and a goroutine that hands its batches
// on as ha's; both are counted in wg and end once Stop has returned.
func (s seam) Watch(from int64, wg *sync.WaitGroup) ha.Feed {
	ctx, cancel := context.WithCancel(context.Background())
	f := &seamFeed{in: s.b.watch(from, wg), out: make(chan ha.FeedBatch), cancel: cancel}
	wg.Go(func() { f.run(ctx) })
	return f
}

// seamFeed is a kubeFeed as ha's Feed: its goroutine (run) converts each
// batch. Immutable.
type seamFeed struct {
	in     feed
	out    chan ha.FeedBatch // unbuffered: run sends, the caller receives
	cancel context.CancelFunc
}

func (f *seamFeed) Batches() <-chan ha.FeedBatch { return f.out }

// Stop ends the backend's feed and run.
func (f *seamFeed) Stop() {
	f.cancel()
	f.in.stop()
}

// run hands each batch of the backend's feed on, converted, until Stop.
func (f *seamFeed) run(ctx context.Context) {
	for {
		var b feedBatch
		select {
		case b = <-f.in.batches():
		case <-ctx.Done():
			return
		}
		out := ha.FeedBatch{Changes: haChanges(b.changes), At: b.at, Err: seamErr(b.err)}
		select {
		case f.out <- out:
		case <-ctx.Done():
			return
		}
	}
}

// haChanges returns chs as ha's Changes.
func haChanges(chs []seamChange) []ha.Change {
	if chs == nil {
		return nil
	}
	out := make([]ha.Change, len(chs))
	for i, c := range chs {
		out[i] = ha.Change{Kind: ha.ChangeKind(c.kind), At: c.at, Member: c.member, Name: c.name,
			Session: ha.SessionID(c.session), Created: c.created, Digest: c.digest, Leaving: c.leaving, Chunk: haChunk(c.chunk)}
	}
	return out
}

// haChunk returns c as ha's Chunk.
func haChunk(c setChunk) ha.Chunk {
	return ha.Chunk{Member: c.member, Digest: c.digest, Index: c.i, Count: c.n, Data: c.data}
}
