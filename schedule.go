// schedule.go: when a controller runs next: the retry formula and its
// saturating arithmetic.

package controller

import (
	"math/bits"
	"time"
)

// nextWait computes rule 4 of the package documentation (doc.go), where
// the retry formula, its defaults and a sample sequence are stated; they
// are not restated here.

// defaultErrorRetryBase is the retry unit when ErrorRetryBaseDuration is 0.
const defaultErrorRetryBase = time.Second

// retryBase returns the effective ErrorRetryBaseDuration.
func (p *ControllerParams) retryBase() time.Duration {
	if p.ErrorRetryBaseDuration <= 0 {
		return defaultErrorRetryBase
	}
	return p.ErrorRetryBaseDuration
}

// nextWait decides what the run loop does after a run that ended with o.
// step is the retry step after this run: the number of failures since the
// last success or update, this one included. jitter is a random sample in
// [0, p.Jitter), added to every timed wait.
//
// It returns the wait and true for a timed wait, or 0 and false when the
// controller waits for an update, trigger or removal instead. It is pure:
// no clock, no randomness, no state. Negative durations (which Validate
// rejects) count as 0, and the arithmetic saturates at the largest Duration.
func nextWait(o outcome, p *ControllerParams, step int, jitter time.Duration) (time.Duration, bool) {
	switch o {
	case outcomeExit:
		return 0, false
	case outcomeFailure:
		if !p.NoErrorRetry && (p.MaxRetries <= 0 || step < p.MaxRetries) {
			return saturatingAdd(retryWait(p, step), jitter), true
		}
	}
	if p.RunInterval > 0 {
		return saturatingAdd(p.RunInterval, jitter), true
	}
	return 0, false
}

// retryWait is the retry wait of rule 4 before the jitter, saturating
// instead of overflowing.
func retryWait(p *ControllerParams, step int) time.Duration {
	if step < 1 {
		step = 1
	}
	w := p.Backoff.wait(p.retryBase(), step)
	if p.MaxRetryInterval > 0 && w > p.MaxRetryInterval {
		w = p.MaxRetryInterval
	}
	return w
}

const maxDuration = time.Duration(1<<63 - 1)

func saturatingMul(d time.Duration, n int) time.Duration {
	if d <= 0 || n <= 0 {
		return 0
	}
	// The high word of the 128-bit product tells an overflow without a
	// division, which would cost more than the rest of the run's
	// bookkeeping.
	hi, lo := bits.Mul64(uint64(d), uint64(n))
	if hi != 0 || lo > uint64(maxDuration) {
		return maxDuration
	}
	return time.Duration(lo)
}

func saturatingAdd(a, b time.Duration) time.Duration {
	if a < 0 {
		a = 0
	}
	if b < 0 {
		b = 0
	}
	if a > maxDuration-b {
		return maxDuration
	}
	return a + b
}
