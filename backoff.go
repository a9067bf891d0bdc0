// backoff.go: the backoff policies, how the retry wait grows with the
// failures in a row, as values.

package controller

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Backoff is how a controller's retry wait grows with n, its failures in a
// row: the backoff(n) of rule 4 of the package documentation, where each
// policy's formula and a sample sequence are stated. It is chosen per
// controller, in [ControllerParams].Backoff; every policy is capped by
// MaxRetryInterval and then jittered, and none overflows (a wait saturates
// at the largest [time.Duration]). The zero value is [LinearBackoff],
// Cilium's.
//
// A Backoff reads and writes as text ("linear", "exponential",
// "constant"), so it can come from a flag or a configuration file; the
// status JSON shows it only when it is not linear.
type Backoff uint8

const (
	// LinearBackoff waits n × the base: 1s, 2s, 3s, … with the defaults.
	// The zero value, and Cilium's.
	LinearBackoff Backoff = iota
	// ExponentialBackoff doubles the wait after each failure: 1s, 2s,
	// 4s, 8s, … with the defaults.
	ExponentialBackoff
	// ConstantBackoff waits the base after every failure: 1s, 1s, 1s, …
	// with the defaults.
	ConstantBackoff
)

var backoffNames = [...]string{LinearBackoff: "linear", ExponentialBackoff: "exponential", ConstantBackoff: "constant"}

// valid reports whether b is one of the policies.
func (b Backoff) valid() bool { return int(b) < len(backoffNames) }

// String returns the policy's name; "Backoff(7)" for a value that is
// none.
func (b Backoff) String() string {
	if b.valid() {
		return backoffNames[b]
	}
	return "Backoff(" + strconv.Itoa(int(b)) + ")"
}

// MarshalText implements [encoding.TextMarshaler]: the String form, which
// UnmarshalText reads back, a value that is no policy included (invalid
// parameters show in the status as they were given).
func (b Backoff) MarshalText() ([]byte, error) { return []byte(b.String()), nil }

// UnmarshalText implements [encoding.TextUnmarshaler]: it accepts a
// policy's name, or the "Backoff(N)" form String gives a value that is
// none.
func (b *Backoff) UnmarshalText(text []byte) error {
	s := string(text)
	for i, name := range backoffNames {
		if s == name {
			*b = Backoff(i)
			return nil
		}
	}
	if n, ok := strings.CutPrefix(s, "Backoff("); ok {
		if n, ok := strings.CutSuffix(n, ")"); ok {
			if v, err := strconv.ParseUint(n, 10, 8); err == nil {
				*b = Backoff(v)
				return nil
			}
		}
	}
	return fmt.Errorf("controller.Backoff: want linear, exponential or constant, got %q", s)
}

// wait returns backoff(n) of rule 4 for the retry unit base > 0 and n ≥ 1,
// saturating. A value that is no policy (Validate rejects it) counts as
// linear.
func (b Backoff) wait(base time.Duration, n int) time.Duration {
	switch b {
	case ExponentialBackoff:
		return saturatingShift(base, n-1)
	case ConstantBackoff:
		return base
	}
	return saturatingMul(base, n)
}

// saturatingShift returns d × 2^k for d > 0 and k ≥ 0, or the largest
// Duration when that overflows.
func saturatingShift(d time.Duration, k int) time.Duration {
	if k >= 63 || d > maxDuration>>k {
		return maxDuration
	}
	return d << k
}
