// Tests of ControllerParams and Validate.

package controller

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Validate names each invalid field and its value, wraps
// ErrInvalidParams, and accepts the zero value of every field but DoFunc.
func TestValidateNamesTheFieldAndValue(t *testing.T) {
	cases := []struct {
		name string
		p    ControllerParams
		want string
	}{
		{"nil DoFunc", ControllerParams{}, "DoFunc must not be nil"},
		{"RunInterval", ControllerParams{DoFunc: NoopFunc, RunInterval: -time.Second}, "RunInterval must not be negative, got -1s"},
		{"ErrorRetryBaseDuration", ControllerParams{DoFunc: NoopFunc, ErrorRetryBaseDuration: -2 * time.Millisecond}, "ErrorRetryBaseDuration must not be negative, got -2ms"},
		{"MaxRetryInterval", ControllerParams{DoFunc: NoopFunc, MaxRetryInterval: -3 * time.Second}, "MaxRetryInterval must not be negative, got -3s"},
		{"Jitter", ControllerParams{DoFunc: NoopFunc, Jitter: -time.Nanosecond}, "Jitter must not be negative, got -1ns"},
		{"MaxRetries", ControllerParams{DoFunc: NoopFunc, MaxRetries: -4}, "MaxRetries must not be negative, got -4"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.p.Validate()
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrInvalidParams)
			assert.EqualError(t, err, "invalid controller parameters: "+tc.want)
		})
	}
	t.Run("every problem is named", func(t *testing.T) {
		err := ControllerParams{RunInterval: -1, Jitter: -1}.Validate()
		assert.ErrorContains(t, err, "DoFunc")
		assert.ErrorContains(t, err, "RunInterval")
		assert.ErrorContains(t, err, "Jitter")
	})
	t.Run("the zero value of every other field is valid", func(t *testing.T) {
		assert.NoError(t, ControllerParams{DoFunc: NoopFunc}.Validate())
		assert.NoError(t, ControllerParams{DoFunc: NoopFunc, RunInterval: math.MaxInt64, MaxRetries: math.MaxInt}.Validate())
	})
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
