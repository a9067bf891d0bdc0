// Tests of the schedule: the wait after a run (rule 4 of the package doc),
// as a pure function, fuzzed against a reference, and end to end.

package controller

import (
	"encoding/json"
	"math"
	"math/big"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The wait after a run, as a table: outcome × params × step → wait.
func TestNextWait(t *testing.T) {
	const maxD = time.Duration(math.MaxInt64)
	type want struct {
		wait  time.Duration
		timed bool
	}
	never := want{0, false}
	cases := []struct {
		name   string
		o      outcome
		p      ControllerParams
		step   int
		jitter time.Duration
		want   want
	}{
		{"success without interval waits for a signal", outcomeSuccess, ControllerParams{}, 0, 0, never},
		{"success with interval", outcomeSuccess, ControllerParams{RunInterval: 5 * time.Second}, 0, 0, want{5 * time.Second, true}},
		{"success with interval and jitter", outcomeSuccess, ControllerParams{RunInterval: 5 * time.Second, Jitter: time.Second}, 0, 300 * time.Millisecond, want{5300 * time.Millisecond, true}},
		{"exit reason ignores the interval", outcomeExit, ControllerParams{RunInterval: 5 * time.Second}, 0, 0, never},
		{"first failure, default base 1s", outcomeFailure, ControllerParams{}, 1, 0, want{time.Second, true}},
		{"fourth failure, default base", outcomeFailure, ControllerParams{}, 4, 0, want{4 * time.Second, true}},
		{"failure with base 200ms, step 3", outcomeFailure, ControllerParams{ErrorRetryBaseDuration: 200 * time.Millisecond}, 3, 0, want{600 * time.Millisecond, true}},
		{"failure capped", outcomeFailure, ControllerParams{MaxRetryInterval: 3 * time.Second}, 7, 0, want{3 * time.Second, true}},
		{"jitter comes after the cap", outcomeFailure, ControllerParams{MaxRetryInterval: 3 * time.Second, Jitter: time.Second}, 7, 999 * time.Millisecond, want{3999 * time.Millisecond, true}},
		{"failure ignores the interval while retrying", outcomeFailure, ControllerParams{RunInterval: time.Hour}, 2, 0, want{2 * time.Second, true}},
		{"NoErrorRetry without interval waits for a signal", outcomeFailure, ControllerParams{NoErrorRetry: true}, 1, 0, never},
		{"NoErrorRetry falls back to the interval", outcomeFailure, ControllerParams{NoErrorRetry: true, RunInterval: 10 * time.Second}, 1, 0, want{10 * time.Second, true}},
		{"below MaxRetries retries", outcomeFailure, ControllerParams{MaxRetries: 3}, 2, 0, want{2 * time.Second, true}},
		{"at MaxRetries gives up", outcomeFailure, ControllerParams{MaxRetries: 3}, 3, 0, never},
		{"past MaxRetries falls back to the interval", outcomeFailure, ControllerParams{MaxRetries: 3, RunInterval: time.Minute}, 4, 0, want{time.Minute, true}},
		{"huge base saturates", outcomeFailure, ControllerParams{ErrorRetryBaseDuration: maxD / 2}, 3, 0, want{maxD, true}},
		{"huge step saturates", outcomeFailure, ControllerParams{}, math.MaxInt, 0, want{maxD, true}},
		{"saturated wait plus jitter stays saturated", outcomeFailure, ControllerParams{ErrorRetryBaseDuration: maxD, Jitter: time.Hour}, 2, time.Minute, want{maxD, true}},
		{"huge interval plus jitter saturates", outcomeSuccess, ControllerParams{RunInterval: maxD - 1, Jitter: time.Hour}, 0, time.Minute, want{maxD, true}},
		{"huge cap keeps the product", outcomeFailure, ControllerParams{ErrorRetryBaseDuration: time.Hour, MaxRetryInterval: maxD}, 3, 0, want{3 * time.Hour, true}},
		{"negative durations count as zero", outcomeFailure, ControllerParams{ErrorRetryBaseDuration: -1, MaxRetryInterval: -1}, 2, -5, want{2 * time.Second, true}},
		{"exponential, first failure", outcomeFailure, ControllerParams{Backoff: ExponentialBackoff}, 1, 0, want{time.Second, true}},
		{"exponential, fourth failure: base × 2^3", outcomeFailure, ControllerParams{Backoff: ExponentialBackoff, ErrorRetryBaseDuration: 100 * time.Millisecond}, 4, 0, want{800 * time.Millisecond, true}},
		{"exponential capped", outcomeFailure, ControllerParams{Backoff: ExponentialBackoff, MaxRetryInterval: 10 * time.Second}, 5, 0, want{10 * time.Second, true}},
		{"exponential, capped, then jittered", outcomeFailure, ControllerParams{Backoff: ExponentialBackoff, MaxRetryInterval: 10 * time.Second, Jitter: time.Second}, 9, 300 * time.Millisecond, want{10300 * time.Millisecond, true}},
		{"exponential saturates at step 64", outcomeFailure, ControllerParams{Backoff: ExponentialBackoff, ErrorRetryBaseDuration: 1}, 64, 0, want{maxD, true}},
		{"exponential just below saturating", outcomeFailure, ControllerParams{Backoff: ExponentialBackoff, ErrorRetryBaseDuration: 1}, 63, 0, want{1 << 62, true}},
		{"exponential with a huge step saturates", outcomeFailure, ControllerParams{Backoff: ExponentialBackoff}, math.MaxInt, 0, want{maxD, true}},
		{"exponential gives up at MaxRetries", outcomeFailure, ControllerParams{Backoff: ExponentialBackoff, MaxRetries: 3}, 3, 0, never},
		{"constant, any failure", outcomeFailure, ControllerParams{Backoff: ConstantBackoff, ErrorRetryBaseDuration: 3 * time.Second}, 50, 0, want{3 * time.Second, true}},
		{"constant capped", outcomeFailure, ControllerParams{Backoff: ConstantBackoff, ErrorRetryBaseDuration: 3 * time.Second, MaxRetryInterval: 2 * time.Second}, 1, 0, want{2 * time.Second, true}},
		{"a policy after success changes nothing", outcomeSuccess, ControllerParams{Backoff: ExponentialBackoff, RunInterval: 5 * time.Second}, 0, 0, want{5 * time.Second, true}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			wait, timed := nextWait(tc.o, &tc.p, tc.step, tc.jitter)
			assert.Equal(t, tc.want, want{wait, timed})
		})
	}
}

// scheduleInput is FuzzSchedule's input, decoded by decodeFuzz.
type scheduleInput struct {
	Params  ControllerParams
	Outcome uint8 // modulo 3: an outcome
	Step    int
	Jitter  int64 // the sample, reduced into [0, Params.Jitter)
}

// FuzzSchedule checks nextWait, the pure decision of what a controller
// waits for after a run, against rule 4 of the package doc, computed
// independently with big integers, for any outcome, step and parameters
// (negative ones included: nextWait counts them as 0, though Validate
// rejects them).
func FuzzSchedule(f *testing.F) {
	const maxD = math.MaxInt64
	const s = time.Second
	for _, seed := range []scheduleInput{
		{Outcome: uint8(outcomeSuccess)},
		{Outcome: uint8(outcomeSuccess), Params: ControllerParams{RunInterval: 5 * s, Jitter: s}, Jitter: int64(s / 3)},
		{Outcome: uint8(outcomeExit), Params: ControllerParams{RunInterval: 5 * s}},
		{Outcome: uint8(outcomeFailure), Step: 1},
		{Outcome: uint8(outcomeFailure), Step: 7, Params: ControllerParams{MaxRetryInterval: 3 * s, Jitter: s}, Jitter: int64(s - 1)},
		{Outcome: uint8(outcomeFailure), Step: 3, Params: ControllerParams{MaxRetries: 3}},
		{Outcome: uint8(outcomeFailure), Step: 4, Params: ControllerParams{RunInterval: 60 * s, MaxRetries: 3}},
		{Outcome: uint8(outcomeFailure), Step: 1, Params: ControllerParams{RunInterval: 10 * s, NoErrorRetry: true}},
		{Outcome: uint8(outcomeFailure), Step: math.MaxInt},
		{Outcome: uint8(outcomeFailure), Step: 3, Params: ControllerParams{ErrorRetryBaseDuration: maxD / 2, Jitter: time.Hour}, Jitter: int64(time.Minute)},
		{Outcome: uint8(outcomeFailure), Step: 2, Params: ControllerParams{ErrorRetryBaseDuration: -1, MaxRetryInterval: -1, MaxRetries: -5, Jitter: -7}, Jitter: -5},
		{Outcome: uint8(outcomeSuccess), Params: ControllerParams{RunInterval: maxD - 1, Jitter: maxD}, Jitter: maxD - 1},
		{Outcome: uint8(outcomeFailure), Step: -3, Params: ControllerParams{ErrorRetryBaseDuration: time.Millisecond, MaxRetryInterval: maxD, MaxRetries: math.MinInt}},
		// The cap plus the jitter saturates.
		{Outcome: uint8(outcomeFailure), Step: 5, Params: ControllerParams{MaxRetryInterval: maxD, Jitter: maxD}, Jitter: -1},
		// The last retry before MaxRetries.
		{Outcome: uint8(outcomeFailure), Step: 2, Params: ControllerParams{RunInterval: 1, ErrorRetryBaseDuration: time.Hour, MaxRetries: 3}},
		// A negative step counts as one.
		{Outcome: uint8(outcomeFailure), Step: math.MinInt, Params: ControllerParams{ErrorRetryBaseDuration: 7, MaxRetryInterval: 5, MaxRetries: -1, Jitter: 3}, Jitter: 2},
		// The largest step saturates.
		{Outcome: uint8(outcomeFailure), Step: math.MaxInt, Params: ControllerParams{ErrorRetryBaseDuration: 1000}},
		// Every policy, around where the exponential one saturates.
		{Outcome: uint8(outcomeFailure), Step: 4, Params: ControllerParams{Backoff: ExponentialBackoff}},
		{Outcome: uint8(outcomeFailure), Step: 34, Params: ControllerParams{Backoff: ExponentialBackoff}},
		{Outcome: uint8(outcomeFailure), Step: 35, Params: ControllerParams{Backoff: ExponentialBackoff}},
		{Outcome: uint8(outcomeFailure), Step: 63, Params: ControllerParams{Backoff: ExponentialBackoff, ErrorRetryBaseDuration: 1}},
		{Outcome: uint8(outcomeFailure), Step: 64, Params: ControllerParams{Backoff: ExponentialBackoff, ErrorRetryBaseDuration: 1}},
		{Outcome: uint8(outcomeFailure), Step: math.MaxInt, Params: ControllerParams{Backoff: ExponentialBackoff, MaxRetryInterval: time.Minute, Jitter: s}, Jitter: 7},
		{Outcome: uint8(outcomeFailure), Step: 2, Params: ControllerParams{Backoff: ExponentialBackoff, ErrorRetryBaseDuration: maxD/2 + 1}},
		{Outcome: uint8(outcomeFailure), Step: 9, Params: ControllerParams{Backoff: ConstantBackoff, ErrorRetryBaseDuration: 3 * s, MaxRetryInterval: 2 * s}},
		{Outcome: uint8(outcomeFailure), Step: math.MaxInt, Params: ControllerParams{Backoff: ConstantBackoff}},
		{Outcome: uint8(outcomeFailure), Step: 5, Params: ControllerParams{Backoff: 200}},
	} {
		f.Add(encodeFuzz(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		in := decodeFuzz(data, new(scheduleInput))
		p := in.Params
		oc := outcome(in.Outcome % 3)
		// The run loop draws the jitter from [0, Jitter); so does this.
		j := time.Duration(0)
		if p.Jitter > 0 {
			j = time.Duration(uint64(in.Jitter) % uint64(p.Jitter))
		}

		wait, timed := nextWait(oc, &p, in.Step, j)
		wantWait, wantTimed := referenceWait(oc, p, in.Step, j)
		if wait != wantWait || timed != wantTimed {
			t.Fatalf("nextWait(%s, %+v, step %d, jitter %v) = %v, %v; rule 4 gives %v, %v",
				oc, p, in.Step, j, wait, timed, wantWait, wantTimed)
		}
		if wait < 0 || (!timed && wait != 0) {
			t.Fatalf("nextWait = %v, %v: negative, or a wait without a timer", wait, timed)
		}
		retrying := oc == outcomeFailure && !p.NoErrorRetry && (p.MaxRetries <= 0 || in.Step < p.MaxRetries)
		if retrying && p.MaxRetryInterval > 0 {
			limit := saturatingAdd(p.MaxRetryInterval, max(p.Jitter-1, 0))
			if wait > limit {
				t.Fatalf("retry wait %v above the cap %v plus the jitter bound %v", wait, p.MaxRetryInterval, p.Jitter)
			}
		}
		// Non-decreasing in the step, as long as the controller retries:
		// once the step reaches MaxRetries the wait is RunInterval or
		// none, which may well be shorter (rule 4).
		if in.Step < math.MaxInt && retrying && (p.MaxRetries <= 0 || in.Step+1 < p.MaxRetries) {
			next, _ := nextWait(oc, &p, in.Step+1, j)
			if next < wait {
				t.Fatalf("the retry wait went down from %v at step %d to %v at step %d", wait, in.Step, next, in.Step+1)
			}
		}
	})
}

// referenceWait is rule 4 of the package doc in arbitrary precision, saturated at the
// largest Duration only at the end.
func referenceWait(o outcome, p ControllerParams, step int, jitter time.Duration) (time.Duration, bool) {
	nonNeg := func(d time.Duration) *big.Int { return big.NewInt(max(int64(d), 0)) }
	saturate := func(x *big.Int) time.Duration {
		if x.Cmp(big.NewInt(math.MaxInt64)) > 0 {
			return time.Duration(math.MaxInt64)
		}
		return time.Duration(x.Int64())
	}
	interval := func() (time.Duration, bool) {
		if p.RunInterval <= 0 {
			return 0, false
		}
		return saturate(new(big.Int).Add(nonNeg(p.RunInterval), nonNeg(jitter))), true
	}
	switch o {
	case outcomeSuccess:
		return interval()
	case outcomeExit:
		return 0, false
	}
	if p.NoErrorRetry || (p.MaxRetries > 0 && step >= p.MaxRetries) {
		return interval()
	}
	unit := big.NewInt(int64(time.Second))
	if p.ErrorRetryBaseDuration > 0 {
		unit = big.NewInt(int64(p.ErrorRetryBaseDuration))
	}
	n := int64(max(step, 1))
	var w *big.Int
	switch p.Backoff {
	case ExponentialBackoff: // unit × 2^(n−1)
		// Past 2^64, any unit of at least 1ns is past the largest
		// Duration; the shift stays small enough to compute.
		w = new(big.Int).Lsh(unit, uint(min(n-1, 64)))
	case ConstantBackoff: // unit
		w = new(big.Int).Set(unit)
	default: // n × unit: linear, and a value that is no policy
		w = new(big.Int).Mul(big.NewInt(n), unit)
	}
	if p.MaxRetryInterval > 0 && w.Cmp(nonNeg(p.MaxRetryInterval)) > 0 {
		w = nonNeg(p.MaxRetryInterval)
	}
	return saturate(w.Add(w, nonNeg(jitter))), true
}

// Rule 4: jitter adds [0, Jitter) to timed waits, never to the first run or
// to a run caused by an update or trigger.
func TestJitterOnlyOnTimedWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		r := newRecorder()
		e.m.UpdateController("c", ControllerParams{DoFunc: r.do, RunInterval: 10 * time.Second, Jitter: 5 * time.Second})
		synctest.Wait()
		assert.Equal(t, secs(0), r.times(), "no jitter before the first run")
		time.Sleep(100 * time.Second)
		e.m.TriggerController("c")
		synctest.Wait()
		e.m.RemoveAllAndWait()
		runs := r.times()
		require.GreaterOrEqual(t, len(runs), 8)
		last := runs[len(runs)-1]
		assert.Equal(t, 100*time.Second, last, "a trigger runs at once")
		distinct := map[time.Duration]bool{}
		for i := 1; i < len(runs)-1; i++ {
			gap := runs[i] - runs[i-1]
			assert.GreaterOrEqual(t, gap, 10*time.Second)
			assert.Less(t, gap, 15*time.Second)
			distinct[gap] = true
		}
		assert.Greater(t, len(distinct), 1, "the waits vary")
	})
}

// Rule 4: jitter is added after the MaxRetryInterval cap, so a capped wait
// is at least the cap and less than the cap plus Jitter.
func TestJitterAfterTheCap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		r := newRecorder(errBoom)
		e.m.UpdateController("c", ControllerParams{DoFunc: r.do, MaxRetryInterval: 2 * time.Second, Jitter: time.Second})
		time.Sleep(time.Minute)
		e.m.RemoveAllAndWait()
		runs := r.times()
		for i := 3; i < len(runs); i++ {
			gap := runs[i] - runs[i-1]
			assert.GreaterOrEqual(t, gap, 2*time.Second)
			assert.Less(t, gap, 3*time.Second, "a capped wait exceeds the cap by less than Jitter")
		}
	})
}

// Durations near math.MaxInt64: the waits saturate instead of
// overflowing into the past (which would make a busy loop), the timers
// handle them, a trigger still runs the controller at once, and the
// status shows and serialises them.
func TestFaultDurationsNearMaxInt64(t *testing.T) {
	const huge = time.Duration(math.MaxInt64)
	cases := []struct {
		name string
		p    ControllerParams
		err  error
	}{
		{"retry base", ControllerParams{ErrorRetryBaseDuration: huge - 1, Jitter: huge / 2}, errBoom},
		{"retry base with interval", ControllerParams{ErrorRetryBaseDuration: huge, RunInterval: huge}, errBoom},
		{"retry base below the cap", ControllerParams{ErrorRetryBaseDuration: huge / 2, MaxRetryInterval: huge - 1}, errBoom},
		{"interval", ControllerParams{RunInterval: huge, Jitter: huge}, nil},
		{"interval after giving up", ControllerParams{RunInterval: huge - 1, MaxRetries: 1, ErrorRetryBaseDuration: time.Nanosecond}, errBoom},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newEnv(t)
				r := newRecorder(tc.err)
				p := tc.p
				p.DoFunc = r.do
				c := e.m.UpdateController("c", p)
				time.Sleep(100 * 365 * 24 * time.Hour)
				assert.Equal(t, 1, r.count(), "one run in a hundred years")

				assert.True(t, e.m.TriggerController("c"))
				synctest.Wait()
				assert.Equal(t, 2, r.count(), "a trigger runs it at once")
				time.Sleep(100 * 365 * 24 * time.Hour)
				assert.Equal(t, 2, r.count())

				b, err := json.Marshal(c.GetStatusModel())
				require.NoError(t, err)
				var back ControllerStatus
				require.NoError(t, json.Unmarshal(b, &back))
				assert.Equal(t, Duration(p.RunInterval), back.Configuration.Interval)
				assert.Equal(t, Duration(p.retryBase()), back.Configuration.ErrorRetryBase)
				require.NoError(t, e.m.RemoveControllerAndWait("c"))
			})
		})
	}
}

// The run times of one controller, end to end (rules 1, 4 and 5 of the
// package doc): what a user sees of the retry formula, the interval,
// NoErrorRetry and MaxRetries, and of an update or a trigger while it
// waits. Each row installs a controller whose DoFunc returns results (the
// last one repeating; none: success), checks that the first run started at
// once, lets wait pass, optionally pokes it and lets then pass, and
// compares the run times, before and after its removal.
func TestSchedule(t *testing.T) {
	cases := []struct {
		name    string
		p       ControllerParams // DoFunc is the recorder's
		results []error
		took    time.Duration // how long each DoFunc call takes
		wait    time.Duration
		poke    string          // "update" (the same params), "trigger", or none
		atPoke  []time.Duration // the run times when it is poked; nil: not checked
		then    time.Duration
		want    []time.Duration
		info    []string // the Info logs; nil: not checked
	}{{
		name:    "a failing controller backs off linearly from 1s: 0s, 1s, 3s, 6s, 10s",
		results: []error{errBoom}, wait: 10*time.Second + time.Millisecond,
		want: secs(0, 1, 3, 6, 10),
	}, {
		name:    "the retry wait is capped by MaxRetryInterval",
		p:       ControllerParams{ErrorRetryBaseDuration: 500 * time.Millisecond, MaxRetryInterval: time.Second},
		results: []error{errBoom}, wait: 4*time.Second + time.Millisecond,
		want: secs(0, 0.5, 1.5, 2.5, 3.5),
	}, {
		name: "the first run is immediate, then one every RunInterval",
		p:    ControllerParams{RunInterval: 5 * time.Second},
		wait: 15*time.Second + time.Millisecond,
		want: secs(0, 5, 10, 15),
	}, {
		name: "the wait starts when DoFunc returns",
		p:    ControllerParams{RunInterval: 5 * time.Second},
		took: 2 * time.Second, wait: 14*time.Second + time.Millisecond,
		want: secs(0, 7, 14),
	}, {
		// A Cilium bug: NoErrorRetry with RunInterval 0 busy-looped.
		name:    "NoErrorRetry without RunInterval waits for an update or trigger after a failure",
		p:       ControllerParams{NoErrorRetry: true},
		results: []error{errBoom}, wait: 24 * time.Hour,
		poke: "trigger", atPoke: secs(0),
		want: secs(0, 86400),
	}, {
		name:    "NoErrorRetry with RunInterval waits the interval after a failure",
		p:       ControllerParams{NoErrorRetry: true, RunInterval: 5 * time.Second},
		results: []error{errBoom}, wait: 10*time.Second + time.Millisecond,
		want: secs(0, 5, 10),
	}, {
		name:    "MaxRetries failures since the last success stop the retries",
		p:       ControllerParams{MaxRetries: 3},
		results: []error{errBoom}, wait: time.Hour,
		want: secs(0, 1, 3),
		info: []string{"giving up retrying after 3 failures; next run on an update, a trigger or the RunInterval"},
	}, {
		name:    "after MaxRetries failures the RunInterval still applies",
		p:       ControllerParams{MaxRetries: 3, RunInterval: 10 * time.Second},
		results: []error{errBoom}, wait: 23*time.Second + time.Millisecond,
		want: secs(0, 1, 3, 13, 23),
	}, {
		name:    "an update starts a new count of MaxRetries",
		p:       ControllerParams{MaxRetries: 2},
		results: []error{errBoom}, wait: time.Minute,
		poke: "update", atPoke: secs(0, 1), then: time.Minute,
		want: secs(0, 1, 60, 61),
	}, {
		// Runs at 0, 1, 3; the next is due at 6.
		name:    "an update while waiting runs at once and resets the retry step",
		results: []error{errBoom}, wait: 4 * time.Second,
		poke: "update", atPoke: secs(0, 1, 3), then: 4*time.Second + time.Millisecond,
		want: secs(0, 1, 3, 4, 5, 7),
	}, {
		name:    "ExponentialBackoff doubles the wait: 0s, 1s, 3s, 7s, 15s",
		p:       ControllerParams{Backoff: ExponentialBackoff},
		results: []error{errBoom}, wait: 15*time.Second + time.Millisecond,
		want: secs(0, 1, 3, 7, 15),
	}, {
		name:    "ExponentialBackoff capped by MaxRetryInterval: waits of 1s, 2s, 4s, 5s, 5s",
		p:       ControllerParams{Backoff: ExponentialBackoff, MaxRetryInterval: 5 * time.Second},
		results: []error{errBoom}, wait: 17*time.Second + time.Millisecond,
		want: secs(0, 1, 3, 7, 12, 17),
	}, {
		name:    "an update restarts ExponentialBackoff at the base",
		p:       ControllerParams{Backoff: ExponentialBackoff},
		results: []error{errBoom}, wait: 8 * time.Second,
		poke: "update", atPoke: secs(0, 1, 3, 7), then: 3*time.Second + time.Millisecond,
		want: secs(0, 1, 3, 7, 8, 9, 11),
	}, {
		name:    "ConstantBackoff retries every base: 0s, 2s, 4s, 6s",
		p:       ControllerParams{Backoff: ConstantBackoff, ErrorRetryBaseDuration: 2 * time.Second},
		results: []error{errBoom}, wait: 6*time.Second + time.Millisecond,
		want: secs(0, 2, 4, 6),
	}, {
		name:    "a trigger while waiting runs at once and keeps the retry step",
		results: []error{errBoom}, wait: 4 * time.Second,
		poke: "trigger", atPoke: secs(0, 1, 3), then: 4*time.Second + time.Millisecond,
		want: secs(0, 1, 3, 4, 8),
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newEnv(t)
				r := newRecorder(tc.results...)
				r.took = tc.took
				p := tc.p
				p.DoFunc = r.do
				e.m.UpdateController("c", p)
				synctest.Wait()
				assert.Equal(t, secs(0), r.times(), "the first run starts at once")
				time.Sleep(tc.wait)
				if tc.atPoke != nil {
					assert.Equal(t, tc.atPoke, r.times(), "before the poke")
				}
				switch tc.poke {
				case "update":
					e.m.UpdateController("c", p)
				case "trigger":
					e.m.TriggerController("c")
				case "":
				default:
					t.Fatalf("unknown poke %q", tc.poke)
				}
				time.Sleep(tc.then)
				synctest.Wait()
				assert.Equal(t, tc.want, r.times())
				if tc.info != nil {
					assert.Equal(t, tc.info, e.logs(logrus.InfoLevel))
				}
				e.m.RemoveAllAndWait()
				assert.Equal(t, tc.want, r.times(), "no run after the removal")
			})
		})
	}
}
