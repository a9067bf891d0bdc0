package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/big"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// FuzzSchedule checks nextWait, the pure decision of what a controller
// waits for after a run, against SPEC rule 4 computed independently with
// big integers, for any outcome, step and parameters (negative ones
// included: nextWait counts them as 0, though Validate rejects them).
func FuzzSchedule(f *testing.F) {
	const maxD = math.MaxInt64
	s := int64(time.Second)
	//     outcome step  interval base  cap   noRetry maxRetries jitterMax jitter
	f.Add(uint8(0), 0, int64(0), int64(0), int64(0), false, 0, int64(0), int64(0))
	f.Add(uint8(0), 0, 5*s, int64(0), int64(0), false, 0, s, s/3)
	f.Add(uint8(1), 0, 5*s, int64(0), int64(0), false, 0, int64(0), int64(0))
	f.Add(uint8(2), 1, int64(0), int64(0), int64(0), false, 0, int64(0), int64(0))
	f.Add(uint8(2), 7, int64(0), int64(0), 3*s, false, 0, s, s-1)
	f.Add(uint8(2), 3, int64(0), int64(0), int64(0), false, 3, int64(0), int64(0))
	f.Add(uint8(2), 4, 60*s, int64(0), int64(0), false, 3, int64(0), int64(0))
	f.Add(uint8(2), 1, 10*s, int64(0), int64(0), true, 0, int64(0), int64(0))
	f.Add(uint8(2), math.MaxInt, int64(0), int64(0), int64(0), false, 0, int64(0), int64(0))
	f.Add(uint8(2), 3, int64(0), int64(maxD/2), int64(0), false, 0, int64(time.Hour), int64(time.Minute))
	f.Add(uint8(2), 2, int64(0), int64(-1), int64(-1), false, -5, int64(-7), int64(-5))
	f.Add(uint8(0), 0, int64(maxD-1), int64(0), int64(0), false, 0, int64(maxD), int64(maxD-1))
	f.Add(uint8(2), -3, int64(0), int64(time.Millisecond), int64(maxD), false, math.MinInt, int64(0), int64(0))
	f.Fuzz(func(t *testing.T, o uint8, step int, interval, base, cap int64, noRetry bool, maxRetries int, jitterMax, jitter int64) {
		p := ControllerParams{
			RunInterval:            time.Duration(interval),
			ErrorRetryBaseDuration: time.Duration(base),
			MaxRetryInterval:       time.Duration(cap),
			NoErrorRetry:           noRetry,
			MaxRetries:             maxRetries,
			Jitter:                 time.Duration(jitterMax),
		}
		oc := outcome(o % 3)
		// The run loop draws the jitter from [0, Jitter); so does this.
		j := time.Duration(0)
		if jitterMax > 0 {
			j = time.Duration(uint64(jitter) % uint64(jitterMax))
		}

		wait, timed := nextWait(oc, &p, step, j)
		wantWait, wantTimed := referenceWait(oc, p, step, j)
		if wait != wantWait || timed != wantTimed {
			t.Fatalf("nextWait(%s, %+v, step %d, jitter %v) = %v, %v; SPEC rule 4 gives %v, %v",
				outcomeNames[oc], p, step, j, wait, timed, wantWait, wantTimed)
		}
		if wait < 0 || (!timed && wait != 0) {
			t.Fatalf("nextWait = %v, %v: negative, or a wait without a timer", wait, timed)
		}
		retrying := oc == outcomeFailure && !noRetry && (maxRetries <= 0 || step < maxRetries)
		if retrying && cap > 0 {
			limit := saturatingAdd(time.Duration(cap), max(p.Jitter-1, 0))
			if wait > limit {
				t.Fatalf("retry wait %v above the cap %v plus the jitter bound %v", wait, time.Duration(cap), p.Jitter)
			}
		}
		// Non-decreasing in the step, as long as the controller retries:
		// once the step reaches MaxRetries the wait is RunInterval or
		// none, which may well be shorter (SPEC rule 4).
		if step < math.MaxInt && retrying && (maxRetries <= 0 || step+1 < maxRetries) {
			next, _ := nextWait(oc, &p, step+1, j)
			if next < wait {
				t.Fatalf("the retry wait went down from %v at step %d to %v at step %d", wait, step, next, step+1)
			}
		}
	})
}

// referenceWait is SPEC rule 4 in arbitrary precision, saturated at the
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
	w := new(big.Int).Mul(big.NewInt(int64(max(step, 1))), unit)
	if p.MaxRetryInterval > 0 && w.Cmp(nonNeg(p.MaxRetryInterval)) > 0 {
		w = nonNeg(p.MaxRetryInterval)
	}
	return saturate(w.Add(w, nonNeg(jitter))), true
}

// FuzzParams builds parameters from arbitrary durations, flags and counts.
// Validate must not panic and must name every offending field with its
// value; a controller built from them, in a bubble with a fake clock, must
// run at once when they are valid, and otherwise park with Validate's
// error and never run; and it must never run more often than its shortest
// possible wait allows (no busy loop).
func FuzzParams(f *testing.F) {
	s := int64(time.Second)
	us := int64(time.Microsecond)
	//     doFunc interval base   cap  noRetry maxRetries jitter cancelOnUpdate deadCtx outcomes
	f.Add(true, int64(0), int64(0), int64(0), false, 0, int64(0), false, false, uint64(0))
	f.Add(true, s, int64(0), int64(0), false, 0, int64(0), false, false, uint64(0))
	f.Add(true, int64(0), us, int64(0), false, 0, int64(0), false, false, uint64(0x5555))
	f.Add(true, int64(0), int64(1), int64(1), false, 0, int64(1), true, false, uint64(math.MaxUint64))
	f.Add(true, int64(0), int64(0), int64(0), true, 0, int64(0), false, false, uint64(0x55))
	f.Add(true, int64(0), s, int64(0), false, 3, int64(0), false, false, uint64(0x5555))
	f.Add(true, int64(math.MaxInt64), int64(math.MaxInt64), int64(0), false, 0, int64(math.MaxInt64), false, false, uint64(0xe4))
	f.Add(true, s, s, int64(0), false, 0, int64(0), false, true, uint64(0x55))
	f.Add(false, int64(0), int64(0), int64(0), false, 0, int64(0), false, false, uint64(0))
	f.Add(true, -s, int64(-1), int64(-2), false, -3, int64(-4), false, false, uint64(0))
	f.Add(false, int64(math.MinInt64), int64(0), int64(0), false, math.MinInt, int64(0), false, false, uint64(0))
	f.Fuzz(func(t *testing.T, hasDo bool, interval, base, cap int64, noRetry bool, maxRetries int, jitter int64, cancelOnUpdate, deadCtx bool, outcomes uint64) {
		// Atomics: a run at the very instant a Sleep of the test ends
		// runs alongside it.
		var runs, stops atomic.Int64
		// Run i ends as outcomes' bits 2i and 2i+1 say: success, failure,
		// exit, or a panic.
		do := func(ctx context.Context) error {
			r := runs.Add(1) - 1
			switch (outcomes >> (2 * (r % 32))) & 3 {
			case 1:
				return errBoom
			case 2:
				return NewExitReason("done")
			case 3:
				panic("fuzzed panic")
			}
			return nil
		}
		p := ControllerParams{
			RunInterval:            time.Duration(interval),
			ErrorRetryBaseDuration: time.Duration(base),
			MaxRetryInterval:       time.Duration(cap),
			NoErrorRetry:           noRetry,
			MaxRetries:             maxRetries,
			Jitter:                 time.Duration(jitter),
			CancelDoFuncOnUpdate:   cancelOnUpdate,
			StopFunc:               func(context.Context) error { stops.Add(1); return nil },
		}
		if hasDo {
			p.DoFunc = do
		}

		err := p.Validate()
		fields := []struct {
			name     string
			value    any
			negative bool
		}{
			{"RunInterval", p.RunInterval, interval < 0},
			{"ErrorRetryBaseDuration", p.ErrorRetryBaseDuration, base < 0},
			{"MaxRetryInterval", p.MaxRetryInterval, cap < 0},
			{"Jitter", p.Jitter, jitter < 0},
			{"MaxRetries", p.MaxRetries, maxRetries < 0},
		}
		valid := hasDo
		for _, fl := range fields {
			valid = valid && !fl.negative
			if named := err != nil && strings.Contains(err.Error(), fmt.Sprintf("%s must not be negative, got %v", fl.name, fl.value)); named != fl.negative {
				t.Fatalf("Validate() = %v: names %s (%v): %v, want %v", err, fl.name, fl.value, named, fl.negative)
			}
		}
		if named := err != nil && strings.Contains(err.Error(), "DoFunc must not be nil"); named != !hasDo {
			t.Fatalf("Validate() = %v with a DoFunc: %v", err, hasDo)
		}
		if (err == nil) != valid || (err != nil && !errors.Is(err, ErrInvalidParams)) {
			t.Fatalf("Validate() = %v for parameters that are valid: %v", err, valid)
		}

		window, bound := runBound(p)
		synctest.Test(t, func(t *testing.T) {
			if deadCtx {
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				p.Context = ctx
			}
			e := newEnv(t)
			h := &healthLog{}
			p.Health = h
			c := e.m.UpdateController("fuzzed", p)
			synctest.Wait()
			if valid {
				require.Equal(t, int64(1), runs.Load(), "a valid controller runs at once")
			} else {
				require.Zero(t, runs.Load())
				require.Equal(t, 1, c.GetFailureCount())
				require.EqualError(t, c.GetLastError(), err.Error(), "it parks with Validate's error")
				require.Equal(t, []string{"degraded fuzzed: " + err.Error()}, h.all())
				require.ErrorContains(t, e.m.Health(), err.Error())
				require.Equal(t, 1.0, testutil.ToFloat64(e.metrics.failing))
			}
			time.Sleep(window)
			require.LessOrEqual(t, runs.Load(), bound, "runs in %v of fake time, with a shortest wait of %v", window, window/time.Duration(max(bound, 1)))
			e.m.RemoveAllAndWait()
			if valid {
				require.Equal(t, int64(1), stops.Load(), "StopFunc once after DoFunc ran")
			} else {
				require.Zero(t, runs.Load(), "DoFunc of invalid parameters never runs")
				require.Zero(t, stops.Load(), "no StopFunc without a DoFunc")
			}
		})
	})
}

// runBound returns a stretch of fake time and the most runs a controller
// with parameters p may make in it: the first run, and one per shortest
// wait the schedule can produce. The stretch is an hour, or less when the
// shortest wait is so short that an hour would take long to simulate.
func runBound(p ControllerParams) (window time.Duration, runs int64) {
	shortest := time.Duration(math.MaxInt64)
	if p.RunInterval > 0 {
		shortest = p.RunInterval
	}
	if !p.NoErrorRetry {
		retry := p.retryBase()
		if p.MaxRetryInterval > 0 {
			retry = min(retry, p.MaxRetryInterval)
		}
		shortest = min(shortest, retry)
	}
	const most = 500
	window = time.Hour
	if shortest < window/most {
		window = shortest * most
	}
	return window, 1 + int64(window/shortest)
}

// FuzzStatusJSON: any status survives a JSON round trip unchanged, and any
// input to the decoders gives a value or an error, never a panic.
//
// Two limits of JSON itself are not the library's to fix, and the inputs are
// shaped around them: strings are made valid UTF-8 (encoding/json replaces
// invalid bytes), and a timestamp outside the years 0 to 9999, which RFC
// 3339 cannot write, makes Marshal fail with an error instead, which is
// accepted (the library never records such a time: it takes time.Now()).
func FuzzStatusJSON(f *testing.F) {
	f.Add("sync-to-k8s", "6f1c0e2a-5b0e-4d8e-9a63-1c2d3e4f5a6b", "g", "connection refused",
		true, true, true, int64(time.Second), int64(10*time.Second), int64(time.Minute), int64(5), int64(0),
		int64(12), int64(1), int64(0), int64(1795263939), int64(500), int64(1795264000), int64(0), int64(1500*time.Millisecond), false,
		[]byte(`{"name":"x","status":{"success-count":1}}`))
	f.Add("", "", "", "", false, false, false, int64(0), int64(0), int64(0), int64(0), int64(0),
		int64(0), int64(0), int64(0), int64(0), int64(0), int64(0), int64(0), int64(0), true,
		[]byte(`[{"name":`))
	f.Add("ünïcödé ✓", "u", "", "exit: done", true, true, false, int64(math.MinInt64), int64(math.MaxInt64), int64(-1), int64(math.MinInt64), int64(1),
		int64(math.MaxInt64), int64(math.MinInt64), int64(-1), int64(-62135596800), int64(0), int64(253402300799), int64(999999999), int64(math.MinInt64), false,
		[]byte(`{"configuration":{"error-retry-base":12345,"interval":"1h"},"status":{"last-failure-timestamp":"2026-11-21T10:00:01+02:00"}}`))
	f.Add("n", "u", "", "", true, true, false, int64(0), int64(0), int64(0), int64(0), int64(0),
		int64(0), int64(0), int64(0), int64(math.MaxInt64), int64(0), int64(math.MinInt64), int64(0), int64(0), false,
		[]byte(`{"configuration":{"interval":true}}`))
	f.Fuzz(func(t *testing.T, name, uuid, group, msg string, hasCfg, hasStatus, errorRetry bool,
		base, interval, maxRetryInterval, maxRetries, jitter int64,
		successes, failures, consecutive, failSec, failNsec, okSec, okNsec, lastRun int64, zeroTimes bool, raw []byte) {
		valid := func(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }
		st := &ControllerStatus{Name: valid(name), UUID: valid(uuid)}
		if hasCfg {
			st.Configuration = &ControllerStatusConfiguration{
				ErrorRetry: errorRetry, ErrorRetryBase: Duration(base), Interval: Duration(interval),
				Group: valid(group), MaxRetryInterval: Duration(maxRetryInterval), MaxRetries: maxRetries, Jitter: Duration(jitter),
			}
		}
		var times []time.Time
		if hasStatus {
			s := &ControllerStatusStatus{
				SuccessCount: successes, FailureCount: failures, ConsecutiveFailureCount: consecutive,
				LastFailureMsg: valid(msg), LastRunDuration: Duration(lastRun),
			}
			if !zeroTimes {
				// As the library records them: UTC, no monotonic reading.
				s.LastFailureTimestamp = time.Unix(failSec, failNsec).UTC()
				s.LastSuccessTimestamp = time.Unix(okSec, okNsec).UTC()
				times = append(times, s.LastFailureTimestamp, s.LastSuccessTimestamp)
			}
			st.Status = s
		}

		b, err := json.Marshal(st)
		if err != nil {
			outside := false
			for _, tm := range times {
				outside = outside || tm.Year() < 0 || tm.Year() > 9999
			}
			if !outside || !strings.Contains(err.Error(), "year outside of range") {
				t.Fatalf("Marshal(%+v): %v", st, err)
			}
		} else {
			var back ControllerStatus
			if err := json.Unmarshal(b, &back); err != nil {
				t.Fatalf("Unmarshal(%s): %v", b, err)
			}
			if !assert.Equal(t, st, &back, "JSON: %s", b) {
				t.FailNow()
			}
			if !utf8.Valid(b) {
				t.Fatalf("Marshal wrote invalid UTF-8: %q", b)
			}
		}

		// Whatever the bytes, decoding gives a value or an error; a value
		// re-encodes, and decoding that gives the same encoding again.
		decodeStable(t, raw, func() any { return new(ControllerStatus) })
		decodeStable(t, raw, func() any { return new(ControllerStatuses) })
		decodeStable(t, raw, func() any { return new(Duration) })
		var d Duration
		if d.UnmarshalText(raw) == nil {
			back, err := d.MarshalText()
			require.NoError(t, err)
			var d2 Duration
			require.NoError(t, d2.UnmarshalText(back), "Duration %q re-read from %q", back, raw)
			require.Equal(t, d, d2)
		}
	})
}

func decodeStable(t *testing.T, raw []byte, newValue func() any) {
	v := newValue()
	if json.Unmarshal(raw, v) != nil {
		return
	}
	b1, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("%T decoded from %q does not encode: %v", v, raw, err)
	}
	v2 := newValue()
	if err := json.Unmarshal(b1, v2); err != nil {
		t.Fatalf("%T: %s, which it encoded, does not decode: %v", v, b1, err)
	}
	b2, err := json.Marshal(v2)
	require.NoError(t, err)
	if string(b1) != string(b2) {
		t.Fatalf("%T from %q encodes as %s, then as %s", v, raw, b1, b2)
	}
}
