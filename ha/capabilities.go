// The optional capabilities of a Backend, each an interface a store may
// implement besides Backend, and the default a Replica uses when it does
// not: a request's bound, claim limits, a server check, history, and
// readings' rounding (TakeOver, a hand-over in one write per record, has
// a file of its own).

package ha

import (
	"context"
	"errors"
	"time"
)

// Requester is an optional capability of a Backend: the context of one
// request of the replica's, which its store's authority must answer (a
// write, a read no cache answers), or one of the replica's listings,
// bounded by BackendConfig.RequestTimeout and by parent: a call made
// with it whose answer never comes fails, for the replica to try again.
// Without it the replica bounds each such call by RequestTimeout alone
// (context.WithTimeout). A store implements it to add to that: etcd's
// requires a leader, so that a member cut off from its peers fails at
// once and the client tries another; Kubernetes' lets a Claim of many
// buckets bound each write rather than the whole call.
type Requester interface {
	Request(parent context.Context) (context.Context, context.CancelFunc)
}

// ClaimLimiter is an optional capability of a Backend: how many names
// one Claim takes at most, and how many bytes of them. A replica keeps
// each batch within both; a store that refuses one all the same answers
// ErrTooManyOps or ErrTooLarge, and the replica halves its batches.
// Without it a batch is at most 128 names (defaultClaimNames) of at most
// 1 MiB (defaultClaimBytes), a name costing its length plus 32 bytes
// (defaultClaimOverhead): etcd's default transaction limits.
type ClaimLimiter interface {
	// ClaimCost is what one name adds to Claim's request, in bytes,
	// roughly.
	ClaimCost(name string) int
	// ClaimLimits returns how many names, and how many bytes of them
	// (ClaimCost), one Claim takes at most. A store must take a Claim
	// within both (hatest holds it to them).
	ClaimLimits() (names, bytes int)
}

// The claim limits of a Backend that does not say (ClaimLimiter): etcd's
// default transaction limits, which most stores exceed.
const (
	defaultClaimNames    = 128
	defaultClaimBytes    = 1 << 20
	defaultClaimOverhead = 32
)

// ServerChecker is an optional capability of a Backend: CheckServers
// asks the servers the backend reaches which release they run and logs
// at Warn, once, the oldest that is too old for the fence to hold. It
// returns within BackendConfig.RequestTimeout and does not fail: a
// server it cannot ask is logged at Debug. A Replica calls it once, as
// it joins.
type ServerChecker interface {
	CheckServers(ctx context.Context)
}

// HistoryReader is an optional capability of a Backend: HeldAt returns
// the names held at position at, one the store answered earlier
// (Session.JoinedAt), and an error when the store cannot say any more
// (etcd: the revision compacted; a store that prunes its change log: a
// position before the oldest kept). Bounded as List is. A replica that
// joins reads it to claim at once the names others handed to it while it
// settled; without it, or when HeldAt answers an error (ha/kube's always
// does: the Kubernetes API server keeps no history), it claims them
// after Options.Settle.
type HistoryReader interface {
	HeldAt(ctx context.Context, at int64) (names map[string]bool, err error)
}

// Rounding is an optional capability of a Backend: how much short of the
// time a session really has left its TimeLeft and PeerLeft may answer.
// A replica counts a silent member's session as ended up to that much
// after the readings put its end, and so holds its names that much
// longer before they start elsewhere: a crashed replica's names move
// that much later. A Backend that does not implement it is taken to
// answer up to a second short (defaultRounding, 1s): etcd truncates the time
// left to whole seconds. A store whose answers of a silent session are
// never short answers 0: on Kubernetes an observer counts a silent
// member's D from its own receipt of the member's last write, after the
// write's commit, itself after the send time the member's fence counts
// from. A store whose readings come from a feed may answer short of a
// renewal it has not seen yet, by more than any rounding (Kubernetes'
// do, while the feed lags); it must then never delete a session's
// records, nor let a Claim take its names, on a reading, only once its
// own proof or clock counts the session ended (ha/kube's observer), so
// that ha's hold is not what keeps a holder that renewed unseen safe.
type Rounding interface {
	// Rounding returns the most by which the backend's TimeLeft and
	// PeerLeft answer short, 0 or more. It sends nothing.
	Rounding() time.Duration
}

// defaultRounding is the Rounding of a Backend that does not say: etcd's
// whole seconds.
const defaultRounding = time.Second

// request returns the context of one request (Requester), from the
// backend if it bounds them itself.
func (r *Replica) request(parent context.Context) (context.Context, context.CancelFunc) {
	if rq, ok := r.be.(Requester); ok {
		return rq.Request(parent)
	}
	return context.WithTimeout(parent, r.opts.RequestTimeout)
}

// ClaimCostOf is what name adds to a Claim on be, as a Replica counts
// it: be's own cost (ClaimLimiter), or the name's length plus 32 bytes
// (defaultClaimOverhead).
func ClaimCostOf(be Backend, name string) int {
	if cl, ok := be.(ClaimLimiter); ok {
		return cl.ClaimCost(name)
	}
	return len(name) + defaultClaimOverhead
}

// ClaimLimitsOf returns the claim limits a Replica keeps be's batches
// within: be's own (ClaimLimiter), or the defaults, 128 names and 1 MiB.
func ClaimLimitsOf(be Backend) (names, bytes int) {
	if cl, ok := be.(ClaimLimiter); ok {
		return cl.ClaimLimits()
	}
	return defaultClaimNames, defaultClaimBytes
}

// rounding returns how short the backend's readings may be (Rounding).
func rounding(be Backend) time.Duration {
	if ro, ok := be.(Rounding); ok {
		return max(ro.Rounding(), 0)
	}
	return defaultRounding
}

// heldAt reads the names held at position at (HistoryReader); an error
// when the backend keeps no history.
func (r *Replica) heldAt(ctx context.Context, at int64) (map[string]bool, error) {
	if h, ok := r.be.(HistoryReader); ok {
		return h.HeldAt(ctx, at)
	}
	return nil, errNoHistory
}

// errNoHistory is heldAt's error on a backend without a HistoryReader.
var errNoHistory = errors.New("ha: the store keeps no history")
