// Options for Join, their defaults, and the checks that reject bad ones.

package ha

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/bgctl/controller"
	"github.com/sirupsen/logrus"
)

// Mode chooses how a [Replica] decides which live member runs a name.
type Mode uint8

const (
	// Spread runs each name on the live member that rendezvous hashing
	// picks for it: every member scores every name, the highest score
	// wins. A member that joins or leaves moves only the names it wins or
	// won, about 1/n of them with n members.
	Spread Mode = iota
	// Leader runs every name on one member, the oldest live one (the one
	// whose member key has the lowest create revision). Joins do not move
	// anything; when the leader leaves, the next oldest takes everything.
	Leader
)

// String returns "spread" or "leader".
func (m Mode) String() string {
	switch m {
	case Spread:
		return "spread"
	case Leader:
		return "leader"
	}
	return fmt.Sprintf("Mode(%d)", uint8(m))
}

// Options configures a [Replica]. Every replica of a service must use the
// same Prefix and Mode; TTL and Margin may differ between replicas. The
// zero value of each field but Prefix is a valid choice, described on the
// field.
type Options struct {
	// Prefix names the group: the replicas of one service share it, and
	// the store keeps the group's records (member records, holdings,
	// published sets of names) under it, apart from every other group's:
	// on etcd it is the key prefix (members under Prefix+"/members/",
	// claims under Prefix+"/claims/", sets under Prefix+"/name-sets/"),
	// on Kubernetes and PostgreSQL a label or a column value. Required. A
	// trailing "/" is dropped. It must not have "members", "claims" or
	// "name-sets" as an element ("/svc/claims" is refused), so that on a
	// store of keys one group's keys never read as another's.
	Prefix string

	// ID names this replica among the members. It must be unique among the
	// live replicas, and must not contain "/", spaces or unprintable
	// characters (it is part of the store's record names, such as an
	// etcd key, and a column of the status table). Zero: the host name
	// and eight random hex digits, a new ID at every start. A stable ID (a StatefulSet's pod name, a host name)
	// is the better choice where there is one: a replica that restarts
	// under it after a crash waits in Join for its old session to end
	// (at most about TTL, on every store: Replica.Join), and the names
	// it held come back to it (the others may run them for a moment
	// first: they may see the old session end before the restarted
	// replica begins); with the default, the old member and
	// its names linger until that session ends, and the names may move
	// twice.
	ID string

	// Mode is how names are spread over the members. Zero: [Spread].
	Mode Mode

	// TTL is how long the replica's session lasts on the store past its
	// last renewal, in whole seconds (the unit of etcd's leases and of
	// Kubernetes' Leases), at least 1s. A replica that crashes keeps its
	// names for up to TTL, plus what the store takes to carry the
	// session's end out (etcd's half-second expiry sweep; the observer's
	// watch on Kubernetes; the next write or feed poll on PostgreSQL),
	// before other replicas take them over. Zero: 10s.
	TTL time.Duration

	// Margin is how long a DoFunc or StopFunc may take to return once its
	// context is cancelled: the replica stops on its own when its store
	// does not answer, its fence passing at (send time of the last
	// answered renewal) + TTL − Margin − 100ms, the 100ms paying for the package's
	// own delay in cancelling. Margin must also cover the drift between
	// the replica's clock and the server's over one TTL. It must be at
	// least 200ms and at most TTL − 200ms. Zero: TTL/4.
	Margin time.Duration

	// RequestTimeout bounds each request the replica makes of its store
	// but the renewals (sent every (TTL−Margin)/4, each waiting at most
	// until the fence would pass). Zero: (TTL−Margin)/2.
	RequestTimeout time.Duration

	// Settle is how long a replica that has just joined ([Replica.Join],
	// not a join again after its fence passed) waits before it claims a
	// name nobody held meanwhile. Replicas started together then see each
	// other before they claim, and none first takes a name that a replica
	// starting a moment later owns, to move it at once. A name another
	// member releases to it meanwhile (a join into a running group) is
	// claimed at once. Spread mode only: in Leader mode a join moves
	// nothing. Zero: 1s; negative: none.
	Settle time.Duration

	// Logger is the logrus logger of the replica's inner
	// [controller.Manager], as [controller.WithLogger] would set it. The
	// replica logs where that Manager logs ([controller.Manager.Logger]),
	// so its lines and its controllers' share one sink, each with the
	// field replica=<ID>. Nil: the Manager's default, logrus'
	// standard logger, unless ManagerOptions choose a logger.
	Logger logrus.FieldLogger

	// Metrics records the replica's metrics; register it beside the
	// core's, made with the same [controller.MetricsOpts] (see [Metrics]).
	// Nil: [DefaultMetrics].
	Metrics *Metrics

	// ManagerOptions configure the replica's inner [controller.Manager]
	// (for instance [controller.WithMetrics]). They are applied after
	// Logger: a [controller.WithSlog] or [controller.WithLogger] here
	// replaces it, for the replica's lines as for the controllers'.
	ManagerOptions []controller.Option
}

// ErrInvalidOptions is wrapped by the error [New] returns for bad Options,
// a nil store, or options its store refuses (a nil client or pool), and so
// by [Join]'s, which calls New; the error names every bad field. Check
// for it with errors.Is.
var ErrInvalidOptions = errors.New("ha: invalid options")

// minMargin is the least Margin a replica accepts: the package's own
// cancel delay (cancelLead) comes out of the window before it, and a
// DoFunc needs at least as much again to see its cancel and return.
const minMargin = 2 * cancelLead

// defaultTTL is the lease TTL when Options.TTL is 0.
const defaultTTL = 10 * time.Second

// defaultSettle is Options.Settle when it is 0: longer than replicas
// started together by one deployment usually take to write their member
// keys, short beside a TTL.
const defaultSettle = time.Second

// reservedSegments are the elements a Prefix may not hold: a store of
// keys (etcd's) keeps a group's member records, claims and published
// sets of names under <Prefix>/members/, <Prefix>/claims/ and
// <Prefix>/name-sets/, and for a key of group P1 to read as a key of
// group P2, where P1 is a proper prefix of P2, P2 would have to be P1
// followed by one of them.
var reservedSegments = []string{"members", "claims", "name-sets"}

// normalize returns o with its defaults filled in, or an error naming every
// bad field and wrapping ErrInvalidOptions.
func (o Options) normalize() (Options, error) {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidOptions}, args...)...))
	}
	o.Prefix = strings.TrimSuffix(o.Prefix, "/")
	if o.Prefix == "" {
		bad("Prefix must not be empty")
	}
	for seg := range strings.SplitSeq(o.Prefix, "/") {
		if slices.Contains(reservedSegments, seg) {
			// Another group's Prefix could then end where this one's
			// member or claim keys begin: "/p" and "/p/claims" would
			// read each other's keys (TestGroupsNeverSeeEachOthersKeys).
			bad("Prefix must not have a %q, %q or %q element (another group's keys could read as this one's), got %q", reservedSegments[0], reservedSegments[1], reservedSegments[2], o.Prefix)
		}
	}
	if o.ID == "" {
		o.ID = defaultID()
	}
	if o.Metrics == nil {
		o.Metrics = DefaultMetrics
	}
	if i := strings.IndexFunc(o.ID, func(c rune) bool { return c == '/' || unicode.IsSpace(c) || !unicode.IsPrint(c) }); i >= 0 {
		// A "/" would read as a deeper key; spaces and unprintable
		// characters break the status table and the logs.
		bad("ID must not contain %q (no \"/\", spaces or unprintable characters), got %q", string([]rune(o.ID[i:])[:1]), o.ID)
	}
	if o.Mode != Spread && o.Mode != Leader {
		bad("Mode must be Spread or Leader, got %v", o.Mode)
	}
	if o.TTL == 0 {
		o.TTL = defaultTTL
	}
	ttlOK := false
	switch {
	case o.TTL < time.Second:
		bad("TTL must be at least 1s, got %v", o.TTL)
	case o.TTL%time.Second != 0:
		bad("TTL must be whole seconds (etcd leases and Kubernetes Leases count in seconds), got %v", o.TTL)
	default:
		ttlOK = true
	}
	if o.Margin == 0 && ttlOK {
		o.Margin = o.TTL / 4
	}
	switch {
	case o.Margin < 0:
		bad("Margin must be > 0, got %v", o.Margin)
	case o.Margin > 0 && o.Margin < minMargin:
		bad("Margin must be at least %v (the package's own cancel delay takes %v before the Margin starts), got %v", minMargin, cancelLead, o.Margin)
	case ttlOK && o.Margin > o.TTL-minMargin:
		bad("Margin must leave at least %v of TTL for renewing, got Margin %v with TTL %v", minMargin, o.Margin, o.TTL)
	}
	if o.Settle == 0 {
		o.Settle = defaultSettle
	}
	if o.RequestTimeout < 0 {
		bad("RequestTimeout must not be negative, got %v", o.RequestTimeout)
	}
	if o.RequestTimeout == 0 && len(errs) == 0 {
		o.RequestTimeout = o.window() / 2
	}
	return o, errors.Join(errs...)
}

// window is how long an answered keepalive keeps the fence open.
func (o *Options) window() time.Duration { return o.TTL - o.Margin }

// fenceWindow is how long an answered keepalive keeps the fence open,
// counted from its send time: TTL − Margin − cancelLead.
func (o *Options) fenceWindow() time.Duration { return o.window() - cancelLead }

// keepAliveEvery is the period of the keepalives.
func (o *Options) keepAliveEvery() time.Duration { return o.window() / 4 }

func defaultID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "replica"
	}
	return strings.ReplaceAll(host, "/", "_") + "-" + randomHex(4)
}
