// The functions package ha sets, one per piece of a Replica's state.

package probe

import (
	"time"

	"github.com/bgctl/controller"
)

var (
	// Session returns the replica's session, 0 between epochs.
	Session func(r any) int64
	// FenceDeadline returns when the replica's current fence passes,
	// zero without a session.
	FenceDeadline func(r any) time.Time
	// Reading returns the earliest moment the replica's lease poller
	// holds session s could have run out, and whether it has read it.
	Reading func(r any, s int64) (time.Time, bool)
	// View describes the replica's members' sessions and its readings of
	// them, for a failing test's log.
	View func(r any) string
	// ClaimBatch returns how many names one Claim of the replica holds
	// now.
	ClaimBatch func(r any) int
	// Stopped reports that Leave or Close was called and the loop took
	// every stop request.
	Stopped func(r any) bool
	// Joined reports that Join was called and has not failed.
	Joined func(r any) bool
	// Options returns the replica's options with their defaults, an
	// ha.Options.
	Options func(r any) any
	// Window returns TTL − Margin of the ha.Options o: how long an
	// answered renewal keeps the fence open.
	Window func(o any) time.Duration
	// RenewEvery returns the period of the renewals under the
	// ha.Options o.
	RenewEvery func(o any) time.Duration
	// Inner returns the Manager the replica runs its names in.
	Inner func(r any) *controller.Manager
	// Holding returns the holder of name's claim in the replica's view
	// ("" when none), and whether the replica has a slot for name.
	Holding func(r any, name string) (holder string, slot bool)
	// Registered reports that name is registered on the replica.
	Registered func(r any, name string) bool
	// ReplaceLate removes name and registers it again with p in one
	// step under the replica's lock, as when its loop is too slow to
	// see the removal between the two calls; wait returns once the
	// removed registration's controller terminated.
	ReplaceLate func(r any, name string, p controller.ControllerParams) (wait func(), err error)
	// Confirmed returns how many members the replica knows and whether
	// it knows every member's set of names.
	Confirmed func(r any) (members int, all bool)
)
