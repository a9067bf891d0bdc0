// Tests of ControllerParams and Validate.

package controller

import (
	"context"
	"errors"
	"fmt"
	"math"
	"reflect"
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
		{"RunTimeout", ControllerParams{DoFunc: NoopFunc, RunTimeout: -5 * time.Second}, "RunTimeout must not be negative, got -5s"},
		{"Group", ControllerParams{DoFunc: NoopFunc, Group: NewGroup("ok\x9a")}, `Group.Name must be valid UTF-8 (it is the metrics label group_name), got "ok\x9a"`},
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

// A group name that is not UTF-8 cannot be a Prometheus label value:
// installing it neither panics (as the metrics library does on such a
// label) nor runs; the controller shows Validate's error, naming the field.
func TestGroupNameNotUTF8IsInvalid(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		rec := newRecorder()
		c := e.m.UpdateController("c", ControllerParams{DoFunc: rec.do, Group: NewGroup("\xff")})
		synctest.Wait()
		require.Zero(t, rec.count())
		require.ErrorContains(t, c.GetLastError(), `Group.Name must be valid UTF-8 (it is the metrics label group_name), got "\xff"`)
		require.ErrorIs(t, e.m.Health(), ErrInvalidParams)

		e.m.UpdateController("c", ControllerParams{DoFunc: rec.do, Group: NewGroup("ok")})
		synctest.Wait()
		require.Equal(t, 1, rec.count(), "an update with a valid name runs")
		e.m.RemoveAllAndWait()
		_, err := e.reg.Gather() // a pedantic registry: every label is checked
		require.NoError(t, err)
	})
}

// paramsInput is FuzzParams' input, decoded by decodeFuzz. Params'
// DoFunc, StopFunc, Context and Health are the target's to set.
type paramsInput struct {
	Params   ControllerParams
	NoDoFunc bool   // leave DoFunc nil
	DeadCtx  bool   // Context is cancelled before the install
	Outcomes uint64 // run i ends as bits 2i and 2i+1 say: success, failure, exit, or a panic
}

// FuzzParams builds parameters from arbitrary values of every field.
// Validate must not panic and must name every offending field with its
// value; a controller built from them, in a bubble with a fake clock, must
// run at once when they are valid, and otherwise park with Validate's
// error and never run; and it must never run more often than its shortest
// possible wait allows (no busy loop).
func FuzzParams(f *testing.F) {
	const s, us = time.Second, time.Microsecond
	const maxD = math.MaxInt64
	const alternate = 0x5555_5555_5555_5555 // success, failure, success, …
	for _, seed := range []paramsInput{
		{},
		{Params: ControllerParams{RunInterval: s}},
		{Params: ControllerParams{ErrorRetryBaseDuration: us}, Outcomes: 0x5555},
		{Params: ControllerParams{ErrorRetryBaseDuration: 1, MaxRetryInterval: 1, Jitter: 1, CancelDoFuncOnUpdate: true}, Outcomes: math.MaxUint64},
		{Params: ControllerParams{NoErrorRetry: true}, Outcomes: 0x55},
		{Params: ControllerParams{ErrorRetryBaseDuration: s, MaxRetries: 3}, Outcomes: 0x5555},
		{Params: ControllerParams{RunInterval: maxD, ErrorRetryBaseDuration: maxD, Jitter: maxD}, Outcomes: 0xe4},
		{Params: ControllerParams{RunInterval: s, ErrorRetryBaseDuration: s}, DeadCtx: true, Outcomes: 0x55},
		{NoDoFunc: true},
		{Params: ControllerParams{RunInterval: -s, ErrorRetryBaseDuration: -1, MaxRetryInterval: -2, MaxRetries: -3, Jitter: -4, RunTimeout: -5}},
		{Params: ControllerParams{RunInterval: math.MinInt64, MaxRetries: math.MinInt}, NoDoFunc: true},
		{Params: ControllerParams{RunInterval: s, RunTimeout: s, Group: NewGroup("g")}, Outcomes: 0x1b},
		// A dead Context parks the controller after its first run.
		{Params: ControllerParams{RunInterval: 1, ErrorRetryBaseDuration: 1}, DeadCtx: true, Outcomes: 1},
		// Every field negative, and no DoFunc.
		{Params: ControllerParams{RunInterval: math.MinInt64, ErrorRetryBaseDuration: -1, MaxRetryInterval: -1, NoErrorRetry: true,
			MaxRetries: math.MinInt, Jitter: -1, CancelDoFuncOnUpdate: true, RunTimeout: -1}, NoDoFunc: true, DeadCtx: true},
		// Huge durations do not overflow.
		{Params: ControllerParams{RunInterval: maxD - 1, ErrorRetryBaseDuration: maxD, MaxRetryInterval: maxD, Jitter: maxD, RunTimeout: maxD}, Outcomes: math.MaxUint64},
		// MaxRetries, then the interval.
		{Params: ControllerParams{RunInterval: 1000, ErrorRetryBaseDuration: 1, MaxRetries: 2}, Outcomes: alternate},
		// A nanosecond retry, always failing.
		{Params: ControllerParams{ErrorRetryBaseDuration: 1, Jitter: 1, CancelDoFuncOnUpdate: true}, Outcomes: alternate},
		// No retry and no interval: the controller waits for an update.
		{Params: ControllerParams{ErrorRetryBaseDuration: 1, MaxRetryInterval: 1, NoErrorRetry: true}, Outcomes: 1},
	} {
		f.Add(encodeFuzz(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		in := decodeFuzz(data, new(paramsInput))
		// Atomics: a run at the very instant a Sleep of the test ends
		// runs alongside it.
		var runs, stops atomic.Int64
		// Run i ends as Outcomes' bits 2i and 2i+1 say: success, failure,
		// exit, or a panic.
		do := func(ctx context.Context) error {
			r := runs.Add(1) - 1
			switch (in.Outcomes >> (2 * (r % 32))) & 3 {
			case 1:
				return errBoom
			case 2:
				return NewExitReason("done")
			case 3:
				panic("fuzzed panic")
			}
			return nil
		}
		p := in.Params
		p.StopFunc = func(context.Context) error { stops.Add(1); return nil }
		if !in.NoDoFunc {
			p.DoFunc = do
		}

		// Validate names every negative duration or count, whatever its
		// field: a field added to ControllerParams is checked too.
		err := p.Validate()
		valid := !in.NoDoFunc
		pv := reflect.ValueOf(p)
		for i := range pv.NumField() {
			field := pv.Field(i)
			if k := field.Kind(); k != reflect.Int && k != reflect.Int64 {
				continue
			}
			name, negative := pv.Type().Field(i).Name, field.Int() < 0
			valid = valid && !negative
			if named := err != nil && strings.Contains(err.Error(), fmt.Sprintf("%s must not be negative, got %v", name, field.Interface())); named != negative {
				t.Fatalf("Validate() = %v: names %s (%v): %v, want %v", err, name, field.Interface(), named, negative)
			}
		}
		badBackoff := p.Backoff > ConstantBackoff
		valid = valid && !badBackoff
		if named := err != nil && strings.Contains(err.Error(), fmt.Sprintf("Backoff must be LinearBackoff, ExponentialBackoff or ConstantBackoff, got Backoff(%d)", p.Backoff)); named != badBackoff {
			t.Fatalf("Validate() = %v for the backoff %v", err, p.Backoff)
		}
		badGroup := !utf8.ValidString(p.Group.Name)
		valid = valid && !badGroup
		if named := err != nil && strings.Contains(err.Error(), "Group.Name must be valid UTF-8"); named != badGroup {
			t.Fatalf("Validate() = %v for the group %q", err, p.Group.Name)
		}
		if named := err != nil && strings.Contains(err.Error(), "DoFunc must not be nil"); named != in.NoDoFunc {
			t.Fatalf("Validate() = %v without a DoFunc: %v", err, in.NoDoFunc)
		}
		if (err == nil) != valid || (err != nil && !errors.Is(err, ErrInvalidParams)) {
			t.Fatalf("Validate() = %v for parameters that are valid: %v", err, valid)
		}

		window, bound := runBound(p)
		synctest.Test(t, func(t *testing.T) {
			if in.DeadCtx {
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
				require.ErrorContains(t, e.m.Health(), oneLine(err.Error()))
				require.ErrorIs(t, e.m.Health(), ErrInvalidParams)
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
