// What the package's external tests (ha_test) reach of its internals.

package ha

import "time"

// Normalize returns o with its defaults filled in, as New does.
func Normalize(o Options) (Options, error) { return o.normalize() }

// KeepAliveEvery is how often a replica with options o renews its
// session, and reads the others' when one is late.
func KeepAliveEvery(o Options) time.Duration { return o.keepAliveEvery() }

// RejoinWait is the pause after a failed attempt to join again.
func RejoinWait(wait time.Duration, err error, ttl time.Duration) time.Duration {
	return rejoinWait(wait, err, ttl)
}

// RestartPoll is how often a replica restarted under its ID reads its
// earlier run's session while it waits in Join.
const RestartPoll = restartPoll
