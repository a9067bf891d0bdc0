// Package ha spreads the controllers of a service over its replicas, so
// that each named controller runs on exactly one live replica, moves when
// replicas come and go, and never runs on two replicas at once. The
// replicas keep their group in a [Store]: etcd (the module
// github.com/bgctl/controller/ha/etcd) or the Lease objects of a
// Kubernetes namespace (github.com/bgctl/controller/ha/kube). This
// package holds what every store shares, and requires neither store's
// client. The model below is told on etcd; the Kubernetes store's
// documentation says where it differs.
//
// # When to use it
//
// A service that embeds [github.com/bgctl/controller] and runs two or
// three replicas for availability would otherwise run every controller on
// every replica. With this package each replica registers all its
// controllers, exactly as it would with a [controller.Manager], and joins
// a group under an etcd key prefix ([New], then [Replica.Join]); each name
// then runs on one replica. Code written against [Controllers] registers
// on a [Replica] or, through [Local], on a Manager alone; a test runs
// several replicas of it in one process, with crashes and partitions, on
// the in-memory store of github.com/bgctl/controller/ha/sim. In
// [Spread] mode the names are spread over the live replicas by rendezvous
// hashing, so a replica that joins or leaves moves only its share; in
// [Leader] mode the oldest replica runs everything and the others wait.
//
// # The model
//
// A replica holds one etcd lease at a time. Under it live its member key,
// <Prefix>/members/<ID>, and one claim key, <Prefix>/claims/<name>, for
// every name it runs. Every replica watches the prefix, and so knows the
// live members and the claims. For each registered name a replica works
// out the owner from the members that register it (the [Mode]; see
// "Which members a name may run on" below); then:
//
//   - if it is the owner and no claim exists, it creates the claim in a
//     transaction that succeeds only if the key is absent, and only when
//     that succeeds does it install the controller (one transaction
//     creates up to 128 claims, each only if absent: when one exists, the
//     replica reads them and claims the others again);
//   - if it runs the name and is no longer the owner (a member joined, the
//     name was removed), it removes the controller, waits until it has
//     terminated, StopFunc included, and only then deletes the claim;
//   - if the claim exists under another lease, it waits for the key to go:
//     deleted by the holder after its controller terminated, or by etcd
//     when the holder's lease expired.
//
// # Which members a name may run on, and rolling upgrades
//
// A name runs only on a member that registers it. Each member key's value
// carries a digest of the member's registered names ("<ID> names=<32 hex
// digits>"), written again, guarded by the lease, when registrations
// change. Members whose digest equals this replica's register exactly
// its names: when all do, the common case, nothing more is written and
// the owner is chosen over all the members as above. While a live
// member's digest differs, as during a rolling upgrade where old and new
// versions register different names, each replica publishes its whole
// set of names, compressed, in chunks under <Prefix>/name-sets/<ID>/<digest>/
// under its lease, and deletes them once every digest agrees again. The
// owner of a name is then chosen, by the same rendezvous hash, or as the
// oldest in [Leader] mode, among the live members that register it; a
// member whose differing set has not come yet (or that runs a version
// without a digest) counts as registering every name, as before, until it
// has. A replica reads such a member's set directly, at once and then
// every half keepalive period, rather than wait for its watch, which a
// join of a large group fills with the releases of the names that move.
// So during an upgrade a name the new version added runs on a new
// replica, a name it dropped on an old one, and a name nobody live
// registers runs nowhere. A name registered here whose owner is not known
// to register it is marked while it lasts: [NameStatus.OwnerUnconfirmed],
// the placement page ([StatusHandler]) and the names_owner_unconfirmed
// gauge ([Metrics]). The claims keep every name from running twice
// whatever the views say.
//
// A replica that has just joined claims a name nobody holds only after
// Options.Settle, so that replicas started together see each other first
// and none takes a share it would move at once; names another member
// releases to it meanwhile it claims at once.
//
// [Replica.Leave] stops every controller, waits for them, marks its member
// key leaving, then revokes the lease, which deletes the member key and
// every claim at once: the other replicas take the names over within a
// few etcd round trips. A replica
// that crashes keeps its claims until its lease expires on the server:
// up to TTL after its last keepalive arrived, plus the server's expiry
// sweep (half a second).
//
// # Why no name runs on two replicas at once
//
// The claims, not the views, decide. Views of the membership differ for a
// moment between replicas; at worst a name then runs nowhere for that
// moment. The rules that keep it from running twice:
//
//  1. A replica installs a controller only after it created the name's
//     claim under its own lease, and only while its fence is open (rule 3).
//     The claim is created only if absent, so at most one lease holds it.
//  2. A replica deletes a claim only after the controller it guards has
//     terminated, StopFunc included, and guarded by the claim's create
//     revision, so it never deletes a newer holding.
//  3. The fence. Each replica keeps a local deadline, extended only by
//     answered keepalives, to (the time the answered request was sent) +
//     TTL − Margin − 100ms. The server counts the lease from when it
//     received that request, which is later than its send time, so the
//     lease cannot expire on the server before the fence passed plus
//     Margin plus 100ms. The 100ms pay for the package's own delay
//     between the deadline and a DoFunc's context being done (a timer
//     firing late on a busy machine, the cancellations), so that the
//     whole Margin is the DoFunc's: its p99.9 measured 95ms under -race
//     with both cores of a 2-core machine busy and the collector running
//     (TestCancelDelayMeasurement, -canceldelay=40).
//     When the fence passes, the replica cancels the context of every
//     DoFunc and StopFunc (cause [ErrFencePassed]) and runs nothing until
//     it holds a new lease. No StopFunc starts once the fence has passed,
//     as after a crash: the DoFunc it would follow may use the whole
//     Margin.
//  4. A DoFunc or StopFunc returns within Margin once its context is
//     cancelled (the contract below). With rule 3, it has returned before
//     the lease, and so the claim, can expire, and before another replica
//     can create the claim anew. Only one of them can be running when the
//     fence passes: a StopFunc starts after the last DoFunc returned, and
//     not at all after the fence.
//  5. A lease the server ends early. Rule 3 trusts the server to keep a
//     lease for TTL after an answered keepalive; a revoke by another
//     client, or a stale etcd leader that wakes up (see Server versions in github.com/bgctl/controller/ha/etcd),
//     ends it sooner, and its claims with it. The holder's watch then
//     shows two or more keys of its lease deleted in one revision (a
//     release deletes one claim), and its fence passes at once; a
//     keepalive refused for an unknown lease passes it too. The others
//     do not claim the names of a lease that ended early until its holder
//     has joined again under a new lease (it does so only after every
//     controller of the old one terminated) or TTL has passed since they
//     saw the end (by then the holder's last renewal, made before the end,
//     has run out, so its fence has passed and its code returned, whatever
//     it saw). Only a lease that simply ran out moves its names sooner:
//     each replica reads every other member's remaining TTL every (TTL −
//     Margin)/4, and every quarter of that once a member has not renewed
//     for half its TTL; the readings since its last renewal bound when its
//     lease runs out to about a quarter period, and the names of a lease
//     read recently as not renewed (a crash, a partition) are claimed once
//     that bound has passed, mostly as soon as etcd deletes the keys. A
//     released claim, a Leave (which marks its member key leaving first)
//     and the old lease of a replica whose fence passed (revoked only once
//     its member key moved to the new lease) move them at once too. A
//     replica that lists the prefix afresh (a new watch, or a new epoch)
//     compares the listing with its last view and judges what went
//     meanwhile the same way; a member whose lease went unseen holds back
//     every free name the same way, since the names it claimed meanwhile
//     are not known.
//
// Rule 5 cannot see one case: a holder whose keepalives came more than
// half a TTL late, so that the others read it as not renewing, and whose
// lease etcd ended early right after a late one arrived. Keys under the
// prefix are the package's: deleting a claim or member key by hand is not
// supported.
//
// Margin must also cover how far the replica's clock may run slower than
// the server's over one TTL; the replica measures with its monotonic
// clock. etcd counts TTLs in whole seconds and raises a TTL below 1.5 ×
// its election timeout; the fence always counts with the TTL asked for,
// the shorter, and Join logs a warning when the server changed it.
//
// Rules 1 to 5 hold for crashes and partitions. They cannot hold for a
// process that is frozen (SIGSTOP, a long pause) in the middle of a DoFunc
// and wakes after its claim moved: no local deadline stops code that is
// not running. For writes that must never come from a former holder, a
// DoFunc reads its claim with [ClaimFrom] and makes the write in an etcd
// transaction guarded by the claim (Held in
// github.com/bgctl/controller/ha/etcd); etcd refuses it once the claim
// has been deleted or created anew. On another store, the claim's Token
// only grows from one holder of the name to the next.
//
// # What a DoFunc must do
//
// Everything the controller package asks (see its documentation), and:
//
//   - Return within Margin once its context is done, and pass the context
//     to everything it blocks on. A DoFunc that goes on past that may
//     overlap with the next holder's.
//   - Fence the writes that must not overlap: take the [Claim] from the
//     context with [ClaimFrom] and guard the write with it (etcd's Held) in an
//     etcd transaction, or carry the revision to a store that can compare
//     it.
//   - Expect to be stopped and started again on another replica at any
//     time, as a controller that is removed and installed again.
//   - Never call [Replica.Leave] or [Replica.Close], nor
//     [Replica.RemoveControllerAndWait] on its own name: they wait for
//     the DoFunc itself.
//
// StopFuncs run when a name leaves a replica while its fence is open;
// their context is cancelled too when the fence passes, and they must
// return within Margin then. Once the fence has passed, StopFuncs are not
// called at all, as after a crash: clean-up that must happen whatever
// becomes of a replica belongs to the next holder's first DoFunc.
//
// # Stopping, and what it waits for
//
// [Replica.Leave] keeps renewing the lease while the controllers stop,
// and returns when its context ends, the lease then left to expire.
// [Replica.Close] stops renewing at once and waits for the controllers
// only until the lease may expire (the fence, then Margin): at most TTL
// after it was called, whatever user code does. After a fence pass the
// replica waits for every controller to terminate before it joins again;
// [Replica.RemoveControllerAndWait] returns once the name's controller
// has terminated, so a DoFunc may wait on another name.
//
// # What a program can wait on
//
// [Replica.Running] tells whether a name runs here, for the price of a
// map lookup. [Replica.Events] delivers what happens on the replica, in
// order: the lease gained, the fence passed, the lease lost, and each name
// acquired or released here with the reason. To wait for a state,
// subscribe, then read the state, then wait for the event that changes it.
//
// # Choosing TTL and Margin
//
// The defaults are TTL 10s and Margin TTL/4; Margin must be at least
// 200ms, and leave at least 200ms of TTL (the fence passes 100ms before
// TTL − Margin, rule 3). A keepalive is sent every (TTL − Margin)/4, each
// waiting for its answer as long as the fence has left, so a slow etcd
// still extends the fence; while one is unanswered, another is sent every
// quarter period, up to four in flight, which the client puts on its
// other endpoints (on etcd: "The watch, and the client's keepalive
// settings" in github.com/bgctl/controller/ha/etcd). A crashed replica's
// names move after about TTL + 0.5s; a partitioned replica stops after at most TTL − Margin
// without an answer, and its names move after its lease expired. A short
// TTL moves names sooner but stops replicas on shorter etcd hiccups.
//
// # Watching a replica
//
// A replica logs where its inner [controller.Manager] logs, logrus or
// log/slog as Options.Logger and ManagerOptions choose, with the field
// replica=<ID> on its lines and its controllers'. The etcd client logs
// apart, with zap; ClientLogger of github.com/bgctl/controller/ha/etcd
// sends its lines to a slog handler. [Replica.Health] says
// whether it is a working member (a lease, an open fence, its member key
// in its view, a watch that progresses), for a readiness probe
// ([HealthHandler]). [Metrics] counts fence passes and claims acquired
// and released, by reason, and measures keepalive round trips and how
// long the watch has been silent, under the core's namespace options.
// [StatusHandler] serves who runs what, from any replica, as the core's
// [controller.StatusHandler] serves one process's controllers.
//
// # Goroutines
//
// [New] starts none. [Replica.Join] starts the replica's loop goroutine,
// which owns all others: the keepalive goroutine of the current lease (and
// the requests in flight it starts and joins at each renewal), the
// goroutine that reads the other members' remaining TTLs (rule 5), one
// that revokes the previous epoch's lease, one at a time that writes the
// member key's digest of names and one that publishes or withdraws the
// set of names, two claim workers (however many
// names there are), one worker per name being
// released (it waits for the controller, then deletes the claim), and the
// feed's (on etcd, the short ones that open the watch and request its
// progress), all joined when that lease's epoch ends. [Replica.Leave] and
// [Replica.Close] join the loop. [Replica.GroupStatus] asks the store from
// a goroutine per member and joins them before it returns. Each [Replica.Events] subscription has a
// goroutine that hands its events over, owned by the subscriber: it ends
// when the subscriber's context ends or after the replica's last event,
// closing the channel. The controllers' goroutines belong to the replica's
// inner [controller.Manager], which removes and waits for them whenever a
// name leaves the replica.
package ha
