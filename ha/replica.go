// Replica: one member of a service's replicas, and the API that mirrors
// controller.Manager.

package ha

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/bgctl/controller"
)

// orBackground returns ctx, or context.Background for a nil ctx: every
// exported method taking a context accepts nil for it.
func orBackground(ctx context.Context) context.Context {
	if ctx == nil {
		return context.Background()
	}
	return ctx
}

// ErrClosed is returned by the methods of a [Replica] that has left or
// been closed.
var ErrClosed = errors.New("ha: replica closed")

// ErrDuplicateID is returned by [Join] when another live replica uses the
// same ID under the same prefix.
var ErrDuplicateID = errors.New("ha: another live replica has this ID")

// Replica is one member of the replicas of a service. The service
// registers every controller on every replica, with the same
// [controller.ControllerParams] it would give a [controller.Manager]; each
// name runs on one live replica at a time, the one the [Mode] picks, and
// moves when members come and go. See the package documentation for the
// model and the safety argument.
//
// [New] makes a Replica, [Replica.Join] makes it a member and starts its
// goroutines ([Join] does both); [Replica.Leave] or [Replica.Close] stops
// them and joins them. Every method is safe for concurrent use.
type Replica struct {
	// Immutable after New.
	be Backend // the store's, from Store.Backend in New
	// short is how much short of the truth be's TimeLeft and PeerLeft
	// may answer: its Rounding, or a second (defaultRounding).
	short time.Duration
	opts  Options
	log   *slog.Logger // the inner Manager's sink, with replica=<ID>
	inner *controller.Manager

	// wake (capacity 1) tells the loop that registrations changed; stopReq
	// (capacity 1) carries the one stop request, sent once under stopOnce;
	// the loop closes done as it ends, after setting stopErr (finish), or
	// the stop request itself when the loop never started.
	wake     chan struct{}
	stopReq  chan stopRequest
	stopOnce sync.Once
	done     chan struct{}
	stopErr  error // written by the loop before it closes done

	events eventHub // Events' subscribers; guarded by its own lock

	// maxClaimNames and maxClaimBytes are the backend's ClaimLimits.
	// Immutable after New.
	maxClaimNames, maxClaimBytes int
	// claimBatch is how many names a Claim call holds: maxClaimNames,
	// halved by the claim workers for a server that takes fewer operations
	// (claimAll). Atomic.
	claimBatch atomic.Int32

	// stopping parents every etcd request of the loop and of its epochs;
	// abort cancels it when Close is called or Leave's context ends, so
	// that no request keeps them past their bound.
	stopping context.Context
	abort    context.CancelFunc

	mu sync.Mutex
	// Guarded by mu; who writes what:
	//
	//	regs, joined, closed                    the API methods
	//	slots                                   the loop; UpdateController rebinds a running slot's context, unregister marks a slot removed
	//	dirty, allDirty                         the loop, and the API methods to mark names
	//	members, claims, viewRev, lease, fence  the loop
	//	memberLeases, listedRev, heard          the loop
	//	memberLost                              the loop (set from the watch, cleared when it writes the key)
	//	joinErr                                 the loop, as it joins again
	//	memberNames, sets, badSets              the loop (from the watch)
	//	digest                                  the API methods, as names are registered and unregistered
	//	place                                   whoever computes an owner (a cache of members, memberNames and sets); nil: to rebuild
	//
	// The invariant the safety argument (doc.go, rules 1 and 2) rests on:
	// a controller is installed in the inner Manager, always under mu,
	// only while its slot is running; a removed controller that has not
	// terminated yet keeps its slot in releasing, and with it the claim.
	regs     map[string]controller.ControllerParams // registered names
	slots    map[string]*slot                       // names claimed here, or being claimed
	dirty    map[string]struct{}                    // names to reconcile
	allDirty bool                                   // reconcile every name
	members  map[string]int64                       // live member IDs, with their key's create revision
	place    *placement                             // computed from the view by placementLocked; nil: to rebuild
	claims   map[string]claimView                   // claim keys in the view, by name
	viewRev  int64                                  // the etcd revision the view is at
	lease    SessionID                              // of the current epoch; 0 between epochs
	fence    *fence                                 // of the current epoch; a passed one between epochs
	joinErr  error                                  // the last attempt to join again failed with it; nil: none did, or one succeeded since
	closed   bool                                   // Leave or Close was called

	// Which names each member registers (names.go).
	digest      namesDigest         // of regs' names
	memberNames map[string]string   // each live member's digest, from its key; "": it gives none (an earlier version)
	sets        map[string]*nameSet // sets of names other members published, by "<ID>/<digest>"
	// badSets are the sets that did not decode, by "<ID>/<digest>": not
	// read again (keepFetch) until the member's digest changes or a
	// chunk is written again. Forgotten with the view.
	badSets map[string]struct{}

	memberLeases map[string]SessionID // the lease of each member's key
	listedRev    int64                // the revision of the view's last listing
	heard        time.Time            // when the watch last spoke, or the view was listed, or the epoch began
	// memberLost: the watch showed this replica's member key deleted, or
	// written under another lease, while this epoch's lease lives.
	memberLost bool
	// handed: while the first epoch settles (Options.Settle), the names
	// whose claim the watch showed deleted since, which may be claimed at
	// once; nil otherwise. Set by Join, filled by the watch, cleared by the
	// loop when the settling ends.
	handed map[string]struct{}
	joined bool // Join was called and has not failed; the loop runs or is about to

	// Early lease ends (earlyend.go). Guarded by mu; written by the loop,
	// and leaseLast by the lease poller; kept from one epoch to the next.
	//
	//	leaving      members whose key shows them leaving, with the lease it is under
	//	gone         members whose key the view saw go (or found gone at a listing)
	//	leaseLast    for each member's lease, the last reading, and when it runs out if not renewed
	//	quarantine   names not to claim before a time: their claim ended with a lease that ended early
	//	gates        members whose lease ended unseen, maybe early: no free name is claimed before a time
	//	prevClaims, prevMembers, prevLeaving  the view of the epoch that ended at a fence pass, for the next listing
	leaving     map[string]SessionID
	gone        map[string]goneMember
	leaseLast   map[SessionID]leaseAnswer
	quarantine  map[string]quarantined
	gates       map[string]gate
	prevClaims  map[string]claimView
	prevMembers map[string]SessionID
	prevLeaving map[string]SessionID
}

// claimView is what the view knows of a claim key.
type claimView struct {
	holder string // the key's value: the holder's ID
	lease  SessionID
	rev    int64     // create revision
	since  time.Time // when the watch brought its creation; zero: it was there when the view was listed
}

// slotState is where a name claimed by this replica stands. The
// transitions, all made by the loop under Replica.mu:
//
//	(none) ──acquire sent──▶ acquiring ──claim created, fence open──▶ running
//	acquiring ──claim held by another, or the request failed──▶ (none)
//	acquiring ──claim created, but the name is no longer ours──▶ releasing
//	running ──the name moved, was removed, or its claim was lost──▶ releasing
//	releasing ──controller terminated, claim deleted──▶ (none)
//	any ──end of the epoch (fence passed, Leave, Close)──▶ (none)
//
// A controller is installed in the inner Manager only in state running.
type slotState uint8

const (
	acquiring slotState = iota
	running
	releasing
)

func (s slotState) String() string {
	return [...]string{"acquiring", "running", "releasing"}[s]
}

// slot is a name this replica holds or is acquiring. Guarded by
// Replica.mu.
type slot struct {
	state  slotState
	claim  Claim     // set on leaving acquiring
	reason Reason    // why its controller was removed; "" while it runs, or when it never ran
	since  time.Time // when the claim's creation was answered; set with claim
	stray  bool      // a claim of this lease found without a slot, released at once; never counted as held
	// removed: the name was unregistered while it had this slot. The slot
	// is released as for a removal even if the name is registered again
	// before the loop saw it: the new registration claims anew and runs
	// as a new controller, as on a Manager. Set by unregister.
	removed bool
	ctx     context.Context // the controller's Context: userCtx's values, the claim, cancelled with the fence
	userCtx context.Context // the registration's Context ctx was made from
	cancel  context.CancelCauseFunc
	unhook  func() bool   // stops the fence from cancelling ctx
	done    chan struct{} // closed when the slot ends
	lost    chan struct{} // closed when the epoch ends under the slot, before its controller is waited for
}

func newSlot(state slotState) *slot {
	return &slot{state: state, done: make(chan struct{}), lost: make(chan struct{})}
}

// abandon cancels the slot's context with cause as its epoch ends, and
// wakes those who wait for the name to stop here: from now on they wait
// for its controller alone (see RemoveControllerAndWait).
func (s *slot) abandon(cause error) {
	if s.cancel != nil {
		s.cancel(cause)
	}
	close(s.lost)
}

// end releases the slot's context and wakes those waiting for it.
func (s *slot) end() {
	s.unbind()
	close(s.done)
}

func (s *slot) unbind() {
	if s.cancel != nil {
		s.unhook()
		s.cancel(context.Canceled)
		s.ctx, s.cancel, s.unhook = nil, nil, nil
	}
}

type stopRequest struct {
	ctx   context.Context
	leave bool // true: Leave, false: Close
}

// New makes a Replica on store (the etcd store of the module
// github.com/bgctl/controller/ha/etcd, or the Kubernetes store of
// github.com/bgctl/controller/ha/kube) that is not a member yet: it
// checks opts, makes the inner [controller.Manager] and asks store for
// its Backend, but sends nothing and starts no goroutine. Register the
// service's controllers on it, then call [Replica.Join]: the replica then
// knows every name from its first view of the members, and claims only
// its share (see Options.Settle). Leave or Close before Join release the
// Replica, which holds nothing.
func New(store Store, opts Options) (*Replica, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: the store must not be nil", ErrInvalidOptions)
	}
	opts, err := opts.normalize()
	if err != nil {
		return nil, err
	}
	inner := controller.NewManager(managerOptions(opts)...)
	r := &Replica{
		opts:    opts,
		log:     inner.Logger(),
		inner:   inner,
		wake:    make(chan struct{}, 1),
		stopReq: make(chan stopRequest, 1),
		done:    make(chan struct{}),
		regs:    make(map[string]controller.ControllerParams),
		slots:   make(map[string]*slot),
		dirty:   make(map[string]struct{}),
		members: make(map[string]int64),
		claims:  make(map[string]claimView),

		memberNames: make(map[string]string),
		sets:        make(map[string]*nameSet),
		badSets:     make(map[string]struct{}),

		memberLeases: make(map[string]SessionID),
		leaving:      make(map[string]SessionID),
		gone:         make(map[string]goneMember),
		leaseLast:    make(map[SessionID]leaseAnswer),
		quarantine:   make(map[string]quarantined),
		gates:        make(map[string]gate),
	}
	r.stopping, r.abort = context.WithCancel(context.Background())
	r.be, err = store.Backend(BackendConfig{
		Group: opts.Prefix, ID: opts.ID, TTL: opts.TTL, RequestTimeout: opts.RequestTimeout,
		RenewEvery: opts.keepAliveEvery(), Window: opts.window(),
		Logger: r.log, Stopping: r.stopping,
	})
	if err != nil {
		r.abort()
		return nil, err
	}
	r.short = rounding(r.be)
	r.maxClaimNames, r.maxClaimBytes = ClaimLimitsOf(r.be)
	r.claimBatch.Store(int32(r.maxClaimNames))
	return r, nil
}

// Join is [New], then [Replica.Join]: the replica is a member when it
// returns, and claims names as they are registered. A nil ctx is
// context.Background.
func Join(ctx context.Context, store Store, opts Options) (*Replica, error) {
	r, err := New(store, opts)
	if err != nil {
		return nil, err
	}
	if err := r.Join(ctx); err != nil {
		r.abort() // releases the context: nothing else was made
		return nil, err
	}
	return r, nil
}

// ErrJoined is returned by [Replica.Join] on a replica that joined
// already.
var ErrJoined = errors.New("ha: the replica has joined already")

// Join makes this process a member of the replicas sharing the Prefix: it
// grants a lease of Options.TTL, writes its member key under it, and
// starts the replica's goroutines (the loop, which owns the keepalive
// goroutine and the request workers). ctx bounds only the grant and the
// write (and the version check), and the wait below; a Close meanwhile
// ends them, and Join then returns an error wrapping [ErrClosed]. The
// client must outlive the Replica; closing it without Leave is how a
// crash looks to the others.
//
// A replica that starts again under the ID of one that crashed or is
// frozen (a StatefulSet's pod name, a host name, a container restarted
// in its pod) finds its member record held by the earlier run's session:
// Join waits, within ctx, for that session to end, and then joins. On
// etcd its lease runs out at most TTL after its last renewal; on
// Kubernetes the other replicas' observers prove it ended D after they
// last saw it renewed, or the restarted replica's own readings do, D
// after its first (so at most about TTL after the restart). While the
// session is being renewed, another live replica has this ID, and Join
// returns an error wrapping [ErrDuplicateID], within a few renewals.
//
// After a failed Join the replica may Join again. It returns [ErrClosed]
// after Leave or Close, and [ErrJoined] once it has joined. A nil ctx is
// context.Background.
func (r *Replica) Join(ctx context.Context) error {
	ctx = orBackground(ctx)
	r.mu.Lock()
	switch {
	case r.closed:
		r.mu.Unlock()
		return fmt.Errorf("%w: Join", ErrClosed)
	case r.joined:
		r.mu.Unlock()
		return ErrJoined
	}
	r.joined = true
	r.mu.Unlock()
	// Close (and a Leave whose context ended) ends Join's requests too, so
	// that it returns within its bound at any moment.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(r.stopping, cancel)()
	ep, err := r.startEpoch(ctx, 0)
	if err != nil {
		r.mu.Lock()
		closed := r.closed
		r.joined = closed // a failed Join may be tried again
		r.mu.Unlock()
		if closed {
			// A Leave or Close came meanwhile and waits for done: nothing
			// runs and nothing is held.
			r.abort()
			r.finish()
			return fmt.Errorf("%w: Join: stopped while joining: %w", ErrClosed, err)
		}
		return err
	}
	if sc, ok := r.be.(ServerChecker); ok {
		sc.CheckServers(ctx)
	}
	if r.opts.Mode == Spread && r.opts.Settle > 0 {
		// Before the loop starts, which alone reads both from here on.
		r.mu.Lock()
		r.handed = make(map[string]struct{})
		r.mu.Unlock()
		ep.settle = time.NewTimer(r.opts.Settle)
	}
	r.opts.Metrics.add(r) // removed by run as it ends
	go r.run(ep)          // joined by Leave and Close, through r.done
	return nil
}

// managerOptions are the options of a replica's inner Manager: the
// Logger, the user's options, then the replica's ID on every line of the
// Manager's sink, which the replica's own lines share.
func managerOptions(opts Options) []controller.Option {
	mopts := make([]controller.Option, 0, len(opts.ManagerOptions)+2)
	if opts.Logger != nil {
		mopts = append(mopts, controller.WithLogger(opts.Logger))
	}
	mopts = append(mopts, opts.ManagerOptions...)
	return append(mopts, controller.WithLogAttrs(slog.String("replica", opts.ID)))
}

// ID returns the replica's member ID.
func (r *Replica) ID() string { return r.opts.ID }

// UpdateController registers a controller under name, or updates the
// registration, on this replica. The controller runs here only while this
// replica holds the name's claim; then the update reaches it at once, as
// [controller.Manager.UpdateController] would. The service registers the
// same names on every replica; while versions differ (a rolling upgrade)
// a name runs only on a replica that registers it (see the package
// documentation).
//
// DoFunc's context carries the [Claim] ([ClaimFrom]) and is cancelled,
// with cause [ErrFencePassed], when the replica's fence passes; so is
// StopFunc's. It returns [ErrClosed] after Leave or Close, and an error for
// an empty name, or one that is not valid UTF-8 or holds a NUL byte:
// every store keeps names as text (Kubernetes in a Lease's JSON,
// PostgreSQL in a text column), which holds neither, and a name its
// store refused would fail every claim of the batch it is in.
func (r *Replica) UpdateController(name string, params controller.ControllerParams) error {
	if name == "" {
		return errEmptyName("UpdateController")
	}
	if !utf8.ValidString(name) || strings.IndexByte(name, 0) >= 0 {
		return fmt.Errorf("ha: UpdateController(%q): a replicated controller's name must be valid UTF-8 without NUL bytes", name)
	}
	if err := params.Validate(); err != nil {
		// Refused here, where the mistake is made, rather than logged
		// later by whichever replica claims the name.
		return fmt.Errorf("ha: UpdateController(%q): %w", name, err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.updateControllerLocked(name, params)
}

func (r *Replica) updateControllerLocked(name string, params controller.ControllerParams) error {
	if r.closed {
		return fmt.Errorf("%w: UpdateController(%q)", ErrClosed, name)
	}
	if _, had := r.regs[name]; !had {
		r.digest.add(name)
	}
	r.regs[name] = params
	if s := r.slots[name]; s != nil && s.state == running && !s.removed {
		r.installLocked(name, s, params)
	}
	r.markDirtyLocked(name)
	return nil
}

// TriggerController makes the named controller run DoFunc at once if it
// runs on this replica, as [controller.Manager.TriggerController] does. It
// returns false when the name does not run here.
func (r *Replica) TriggerController(name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.slots[name]; s != nil && s.state == running && !s.removed {
		return r.inner.TriggerController(name)
	}
	return false
}

// RemoveController unregisters name on this replica. If it runs here, it
// is removed and, once it has stopped (StopFunc included), its claim is
// deleted; without waiting for that. A name registered again meanwhile
// runs, as on a Manager, as a new controller: once the removed one has
// stopped (StopFunc included) and its claim is deleted, the replica claims
// the name anew. Unregister a name on every replica, or another replica
// that still has it registered takes it over. The error wraps
// [controller.ErrControllerNotFound] for a name not registered.
func (r *Replica) RemoveController(name string) error {
	_, _, err := r.unregister(name)
	return err
}

// RemoveControllerAndWait is [Replica.RemoveController], then waits until
// the name no longer runs on this replica and its claim is released, or
// the replica has closed. When the replica's epoch ends meanwhile (its
// fence passed), the claim is given up with the lease, and it waits only
// until the controller has terminated: a DoFunc may call it for another
// name without keeping its own replica from stopping.
func (r *Replica) RemoveControllerAndWait(name string) error {
	s, term, err := r.unregister(name)
	if err == nil {
		r.awaitUnregistered(s, term)
	}
	return err
}

// awaitUnregistered waits, for RemoveControllerAndWait, until the slot s
// of a name unregistered has ended, or its epoch ended and term (its
// controller's termination channel) is closed, or the replica stopped.
func (r *Replica) awaitUnregistered(s *slot, term chan struct{}) {
	if s == nil {
		select {
		case <-term:
		case <-r.done:
		}
		return
	}
	select {
	case <-s.done:
	case <-r.done:
	case <-s.lost:
		select {
		case <-term:
		case <-r.done:
		}
	}
}

// unregister forgets name's registration and returns its slot, if any,
// with the termination channel of its controller (closed when none is
// installed).
func (r *Replica) unregister(name string) (*slot, chan struct{}, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.unregisterLocked(name)
}

func (r *Replica) unregisterLocked(name string) (*slot, chan struct{}, error) {
	if _, ok := r.regs[name]; !ok {
		return nil, nil, errNotRegistered(name)
	}
	delete(r.regs, name)
	r.digest.remove(name)
	if s := r.slots[name]; s != nil {
		s.removed = true
	}
	r.markDirtyLocked(name)
	// Taken before the loop removes the controller, which forgets the
	// name. Without a slot, a controller may still be stopping here (its
	// epoch ended just now): the channel is that one's.
	return r.slots[name], r.inner.TerminationChannel(name), nil
}

// GetStatusModel returns the status of the controllers running on this
// replica, sorted by name, as [controller.Manager.GetStatusModel] does.
// [Replica.Status] tells which replica runs the others.
func (r *Replica) GetStatusModel() controller.ControllerStatuses {
	return r.inner.GetStatusModel()
}

// Running reports whether name's controller runs on this replica now: this
// replica holds its claim and has installed it. It takes the replica's lock
// and looks one name up, so it costs the same at 100,000 names as at ten;
// [Replica.Status] builds the whole view instead.
func (r *Replica) Running(name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.slots[name]
	return s != nil && s.state == running && !s.removed
}

// Manager returns the Manager this replica installs the names it runs
// into, for what reads it: [controller.StatusHandler] and
// [controller.HealthHandler] serve the controllers running here, and its
// metrics are those given in Options.ManagerOptions.
//
// Register, update, trigger and remove controllers through the Replica,
// never on this Manager: a controller installed on it directly runs
// without a claim, on every replica that does so, and is removed when the
// replica's lease ends.
func (r *Replica) Manager() *controller.Manager { return r.inner }

// markDirtyLocked asks the loop to reconcile name.
func (r *Replica) markDirtyLocked(name string) {
	r.dirty[name] = struct{}{}
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// installLocked installs or updates name's controller in the inner
// Manager, wrapped so that it runs under the slot's claim and fence.
func (r *Replica) installLocked(name string, s *slot, p controller.ControllerParams) {
	var old func()
	if s.ctx == nil || p.Context != s.userCtx {
		if s.cancel != nil {
			prevCancel, prevUnhook := s.cancel, s.unhook
			old = func() { prevUnhook(); prevCancel(context.Canceled) }
		}
		base := p.Context
		if base == nil {
			base = context.Background()
		}
		s.userCtx = p.Context
		var ctx context.Context
		ctx, s.cancel = context.WithCancelCause(withClaim(base, s.claim))
		cancel := s.cancel
		s.ctx = ctx
		// The fence calls cancel itself as it passes; unhook stops it
		// before.
		s.unhook = r.fence.hook(cancel)
	}
	f := r.fence
	do, stop := p.DoFunc, p.StopFunc
	p.Context = s.ctx
	if do != nil {
		p.DoFunc = func(ctx context.Context) error {
			// A run the core starts with a context that is already
			// cancelled must not reach the service; nor one that starts
			// after the fence passed but before the fence's AfterFunc
			// goroutine got to cancel the context.
			if err := ctx.Err(); err != nil {
				return err
			}
			if !f.open() {
				return ErrFencePassed
			}
			return do(ctx)
		}
	}
	if stop != nil {
		p.StopFunc = func(ctx context.Context) error {
			// Once the fence has passed, no StopFunc starts, as after a
			// crash: the DoFunc may have used the Margin between the
			// fence and the earliest expiry of the lease, and the next
			// holder may start after that. The clock is read, so a fence
			// whose timer is late counts as passed.
			if !f.open() {
				return nil
			}
			ctx, cancel := context.WithCancelCause(ctx)
			defer cancel(context.Canceled)
			defer f.hook(cancel)()
			return stop(ctx)
		}
	}
	r.inner.UpdateController(name, p)
	if old != nil {
		old()
	}
}
