// Package etcd is the store of github.com/bgctl/controller/ha on etcd: a
// group of replicas keeps its sessions as etcd leases, and its member
// records, claims and published sets of names as keys under
// Options.Prefix. [Store] makes one from the service's client:
//
//	r, err := ha.Join(ctx, etcd.Store(cli), ha.Options{Prefix: "/my-service"})
//
// The package documentation of ha tells the model, the rules that keep a
// name from running on two replicas at once, and how to choose TTL and
// Margin. A DoFunc whose writes must never come from a former holder
// guards them with [Held] in an etcd transaction. [ClientLogger] writes
// the etcd client's lines to a log/slog handler.
//
// # Server versions
//
// Rule 3 trusts an answered keepalive: the server keeps the lease for TTL
// from when it received it. Two etcd server bugs break that, and the
// fence with it:
//
//   - a leader stuck on a slow disk or CPU went on revoking expired
//     leases after a new leader had been elected, so leases kept alive
//     through the new leader ended (etcd issue 15247; pull request 16822,
//     in 3.6.0, backported to 3.5.13 and 3.4.31, made the old leader
//     check that it still leads before it revokes). The fix is not
//     whole: a leader frozen longer than TTL (SIGSTOP, a paused VM, a
//     stalled host) skips the check when it wakes if it still counts
//     itself active, and revokes the leases renewed meanwhile through the
//     new leader; 3.6 and 3.7, 3.7.3 included, do so. Rule 5 covers it:
//     the holders stop at once, and their names wait for them;
//   - a keepalive that arrived while its lease was being revoked was
//     answered as a renewal (fixed by pull request 20590, backported to
//     3.6.5, 3.5.23 and 3.4.38).
//
// This store therefore supports etcd 3.5.23 or later on the 3.5 line,
// 3.6.5 or later on the 3.6 line, and every release from 3.7.0 on. Its
// tests run against 3.7.3 and 3.5.23. The 3.4 line carries both fixes
// from 3.4.38, but it ended with 3.4.45 and is not tested, so it is not
// supported. ha.Join asks each endpoint of its client for its version (the
// maintenance Status call, waiting at most RequestTimeout) and logs one
// warning naming the oldest server below these; an endpoint that does not
// answer is logged at Debug and does not fail Join.
//
// # The watch, and the client's keepalive settings
//
// A replica's view of the members and claims comes from one watch of the
// prefix, and the view decides when names move (the claims alone keep
// them from running twice). A watch can stop delivering without failing:
// on a connection that drops packets without closing, or stuck on the
// server, while lease keepalives still succeed on another connection. So
// while the watch is quiet, the replica asks etcd for its progress every
// (TTL − Margin)/4; etcd answers once the watch has caught up, and a
// watch that is catching up sends events instead. A watch that has said
// nothing, neither event nor progress notification, for TTL − Margin is
// replaced: the replica lists the prefix again and watches it anew, on a
// stream of its own. A stuck watch then delays a takeover by about as
// long as a crash does, and no more.
//
// Give the etcd client gRPC keepalives as well, so that a connection that
// stops answering is closed, and the watch and requests on it move to
// another endpoint, instead of waiting until the kernel gives up
// retransmitting to it (about 15 minutes on Linux by default):
//
//	clientv3.Config{
//		Endpoints:            endpoints,
//		DialKeepAliveTime:    10 * time.Second,
//		DialKeepAliveTimeout: 5 * time.Second,
//	}
//
// 10s is gRPC's floor (a shorter time is raised to it), and leaves room
// for etcd's default minimum of 5s between a client's pings
// (--grpc-keepalive-min-time; a client that pings more often is
// disconnected). A 5s timeout lets a loaded server answer late without
// losing the connection. A dead connection is then closed within 15s of
// its last answer. That is longer than the default fence window, TTL −
// Margin: with one endpoint, a replica whose connection dies stops its
// names when its fence passes, as in any partition; with several, the
// keepalives sent while one waits on the dead connection go to the
// others, and extend the fence.
//
// Give the client every member's endpoint. A member cut off from its
// peers still answers its clients: every request of a replica that needs
// the leader (keepalives, claims, releases, listings, the member key, the
// watch) carries etcd's require-leader flag, so such a member refuses it
// at once, once it knows it has no leader, and the request goes to
// another endpoint; until it knows (up to two election timeouts), the
// hedged keepalives keep the fence open. A quorum lost for longer than
// TTL − Margin passes every replica's fence.
//
// # Traps this store avoids
//
// concurrency.Session of the etcd client is not used as a fence: its Done
// channel counts from the last answer received and is checked once a
// second, so it can close after another replica has started the names.
// Leases are granted and kept alive with a timeout on every request
// (Grant and KeepAliveOnce otherwise wait, and retry, as long as their
// context lets them), and revoked with a context of their own.
package etcd
