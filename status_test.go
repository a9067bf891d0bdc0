// Tests of the status model: its JSON, FormatStatus and Health.

package controller

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"testing/synctest"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/sirupsen/logrus/hooks/test"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The status model serialises to Cilium's JSON (durations as strings,
// timestamps in UTC) and round-trips losslessly.
func TestStatusJSON(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		r := newRecorder(errBoom, nil)
		r.took = 1500 * time.Millisecond
		c := e.m.UpdateController("sync", ControllerParams{DoFunc: r.do, RunInterval: time.Minute, Group: NewGroup("g")})
		time.Sleep(3 * time.Second) // fails at 0-1.5s, succeeds at 2.5-4s
		b, err := json.Marshal(e.m.GetStatusModel())
		require.NoError(t, err)
		want := `[{"name":"sync","uuid":"` + c.UUID() + `",` +
			`"configuration":{"error-retry":true,"error-retry-base":"1s","interval":"1m0s","group":"g"},` +
			`"status":{"success-count":0,"failure-count":1,"consecutive-failure-count":1,` +
			`"last-failure-msg":"boom","last-failure-timestamp":"2000-01-01T00:00:01.5Z","last-run-duration":"1.5s",` +
			`"running-since":"2000-01-01T00:00:02.5Z"}}]` // the second run, 2.5-4s
		assert.JSONEq(t, want, string(b))

		time.Sleep(2 * time.Second)
		st := c.GetStatusModel()
		b, err = json.Marshal(st)
		require.NoError(t, err)
		var back ControllerStatus
		require.NoError(t, json.Unmarshal(b, &back))
		assert.Equal(t, st, &back, "JSON round-trips losslessly")
		assert.Contains(t, string(b), `"last-success-timestamp":"2000-01-01T00:00:04Z"`)
		e.m.RemoveAllAndWait()
	})
}

// The JSON has Cilium's field names, and the fields Cilium lacks
// (max-retry-interval, max-retries, jitter, run-timeout, running-since) only
// when set; a Duration
// also reads nanoseconds, and bad input is an error that says what it wants.
func TestStatusJSONFieldsOfCiliumAndExtras(t *testing.T) {
	st := &ControllerStatus{Name: "n", UUID: "u",
		Configuration: &ControllerStatusConfiguration{ErrorRetry: false, ErrorRetryBase: Duration(time.Second), Interval: 0,
			MaxRetryInterval: Duration(time.Minute), MaxRetries: 5, Jitter: Duration(time.Second), RunTimeout: Duration(time.Hour),
			Backoff: ConstantBackoff},
		Status: &ControllerStatusStatus{RunningSince: new(time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC))}}
	b, err := json.Marshal(st)
	require.NoError(t, err)
	assert.JSONEq(t, `{"name":"n","uuid":"u","configuration":{"error-retry":false,"error-retry-base":"1s","interval":"0s",
		"max-retry-interval":"1m0s","max-retries":5,"jitter":"1s","run-timeout":"1h0m0s","backoff":"constant"},
		"status":{"success-count":0,"failure-count":0,"consecutive-failure-count":0,"last-failure-msg":"",
		"running-since":"2026-11-21T10:00:00Z"}}`, string(b))

	var d Duration
	require.NoError(t, json.Unmarshal([]byte(`1500000000`), &d), "nanoseconds are accepted")
	assert.Equal(t, Duration(1500*time.Millisecond), d)
	assert.ErrorContains(t, json.Unmarshal([]byte(`"soon"`), &d), "controller.Duration")
	assert.ErrorContains(t, json.Unmarshal([]byte(`true`), &d), "want a duration string or nanoseconds")
	var sts ControllerStatuses
	assert.Error(t, json.Unmarshal([]byte(`[{"name":`), &sts))
}

// statusInput is FuzzStatusJSON's input, decoded by decodeFuzz.
type statusInput struct {
	Status ControllerStatus
	Raw    []byte // fed to the decoders as it is
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
	at := func(sec, nsec int64) time.Time { return time.Unix(sec, nsec).UTC() }
	full := func() statusInput {
		running, removed := at(1795263999, 1), at(1795264001, 0)
		return statusInput{Status: ControllerStatus{Name: "sync-to-k8s", UUID: "6f1c0e2a-5b0e-4d8e-9a63-1c2d3e4f5a6b",
			Configuration: &ControllerStatusConfiguration{ErrorRetry: true, ErrorRetryBase: Duration(time.Second), Interval: Duration(10 * time.Second),
				Group: "g", MaxRetryInterval: Duration(time.Minute), MaxRetries: 5, RunTimeout: Duration(time.Second), Backoff: ExponentialBackoff},
			Status: &ControllerStatusStatus{SuccessCount: 12, FailureCount: 1, LastFailureMsg: "connection refused",
				LastFailureTimestamp: at(1795263939, 500), LastSuccessTimestamp: at(1795264000, 0), LastRunDuration: Duration(1500 * time.Millisecond),
				RunningSince: &running, RemovedTimestamp: &removed}},
			Raw: []byte(`{"name":"x","status":{"success-count":1}}`)}
	}
	// small is the status most named seeds vary.
	small := func(change func(*statusInput)) statusInput {
		in := statusInput{Status: ControllerStatus{Name: "n", UUID: "u",
			Configuration: &ControllerStatusConfiguration{ErrorRetry: true, ErrorRetryBase: Duration(time.Second), Group: "g"},
			Status:        &ControllerStatusStatus{SuccessCount: 1, FailureCount: 2, ConsecutiveFailureCount: 3, LastFailureMsg: "m"}}}
		change(&in)
		return in
	}
	raw := func(b string) func(*statusInput) { return func(in *statusInput) { in.Raw = []byte(b) } }
	for _, seed := range []statusInput{
		full(),
		{Raw: []byte(`[{"name":`)},
		{Status: ControllerStatus{Name: "ünïcödé ✓", UUID: "u",
			Configuration: &ControllerStatusConfiguration{ErrorRetry: true, ErrorRetryBase: math.MinInt64, Interval: math.MaxInt64, MaxRetryInterval: -1, MaxRetries: math.MinInt64, Jitter: 1},
			Status: &ControllerStatusStatus{SuccessCount: math.MaxInt64, FailureCount: math.MinInt64, ConsecutiveFailureCount: -1, LastFailureMsg: "exit: done",
				LastFailureTimestamp: at(-62135596800, 0), LastSuccessTimestamp: at(253402300799, 999999999), LastRunDuration: math.MinInt64}},
			Raw: []byte(`{"configuration":{"error-retry-base":12345,"interval":"1h"},"status":{"last-failure-timestamp":"2026-11-21T10:00:01+02:00"}}`)},
		{Status: ControllerStatus{Name: "n", UUID: "u", Status: &ControllerStatusStatus{LastFailureTimestamp: at(math.MaxInt64, 0), LastSuccessTimestamp: at(math.MinInt64, 0)}},
			Raw: []byte(`{"configuration":{"interval":true}}`)},
		small(raw(`{"configuration":{"interval":1e400}}`)), // a duration number that overflows
		small(func(in *statusInput) { // extreme durations
			*in.Status.Configuration = ControllerStatusConfiguration{ErrorRetry: true, ErrorRetryBase: math.MinInt64, Interval: math.MaxInt64,
				MaxRetryInterval: -1, MaxRetries: math.MinInt64, Jitter: 1, RunTimeout: math.MinInt64}
		}),
		small(func(in *statusInput) { // names that are not UTF-8
			in.Status.Name, in.Status.UUID, in.Status.Status.LastFailureMsg = "\xff\xfe", "\xc3", "\xed\xa0\x80"
		}),
		small(func(in *statusInput) { in.Status.Status.LastFailureTimestamp = at(253402300799, 999999999) }), // the last second of 9999
		small(func(in *statusInput) { in.Status.Status.LastSuccessTimestamp = at(253402300800, 0) }),         // 10000 cannot be written
		small(func(in *statusInput) { in.Status.Status.LastFailureTimestamp = at(-62167219201, 0) }),         // nor -1
		small(raw(`{"configuration":{"error-retry-base":"1x"}}`)),                                            // a malformed duration
		small(raw(`{"status":{"last-success-timestamp":"not a time"}}`)),                                     // a malformed timestamp
		small(raw("\xff\xfe{")), // not UTF-8
		small(raw(`{"status":{"last-failure-timestamp":"2026-11-21T10:00:01+02:00"}}`)), // a timestamp with an offset
		small(raw(`[{"uuid":1,"status":[]}]`)),                                          // wrong types
	} {
		f.Add(encodeFuzz(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		in := decodeFuzz(data, new(statusInput))
		st := &in.Status
		var times []time.Time
		eachField(reflect.ValueOf(st).Elem(), func(v reflect.Value) {
			switch v.Type() {
			case reflect.TypeFor[string]():
				v.SetString(strings.ToValidUTF8(v.String(), "\uFFFD"))
			case timeType:
				times = append(times, v.Interface().(time.Time))
			}
		})

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
		raw := in.Raw
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

// FormatStatus writes Cilium's table: a healthy count, then every
// controller or only the failing ones, sorted by name; nil parts read as
// zero, and a write error is returned.
func TestFormatStatus(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		e.m.UpdateController("zeta-ok", ControllerParams{DoFunc: NoopFunc})
		e.m.UpdateController("alpha-failing", ControllerParams{DoFunc: func(context.Context) error {
			return errors.New("connection refused")
		}})
		e.m.UpdateController("mid-done", ControllerParams{DoFunc: func(context.Context) error {
			return NewExitReason("annotation applied")
		}})
		time.Sleep(65 * time.Second)

		var all bytes.Buffer
		require.NoError(t, FormatStatus(&all, e.m.GetStatusModel(), true))
		assert.Equal(t, strings.Join([]string{
			"Controller Status: 2/3 healthy",
			"Name            Last success   Last error   Count   Message",
			"alpha-failing   never          10s ago      11      connection refused",
			"mid-done        1m5s ago       never        0       [exit reason] annotation applied",
			"zeta-ok         1m5s ago       never        0       no error",
			""}, "\n"), all.String())

		var failing bytes.Buffer
		require.NoError(t, FormatStatus(&failing, e.m.GetStatusModel(), false))
		assert.Equal(t, strings.Join([]string{
			"Controller Status: 2/3 healthy",
			"Name            Last success   Last error   Count   Message",
			"alpha-failing   never          10s ago      11      connection refused",
			""}, "\n"), failing.String())
		e.m.RemoveAllAndWait()

		var none bytes.Buffer
		require.NoError(t, FormatStatus(&none, ControllerStatuses{{Name: "bare"}, nil}, false))
		assert.Equal(t, "Controller Status: 1/1 healthy\n", none.String())
		require.NoError(t, FormatStatus(&none, ControllerStatuses{{Name: "bare"}}, true), "nil parts read as zero")
		assert.Contains(t, none.String(), "bare   never          never        0       no error")
		assert.Error(t, FormatStatus(failingWriter{}, nil, true))
	})
}

// FormatStatus keeps one row per controller when a message spans lines
// (the joined validation error does) or holds a tab: the lines are joined
// with "; ".
func TestFormatStatusMultiLineMessage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		e.m.UpdateController("bad", ControllerParams{RunInterval: -1, Jitter: -1})
		e.m.UpdateController("tabbed", ControllerParams{DoFunc: func(context.Context) error {
			return errors.New("col\tumn\r\n\nnext")
		}})
		time.Sleep(time.Second / 2)
		var buf bytes.Buffer
		require.NoError(t, FormatStatus(&buf, e.m.GetStatusModel(), true))
		assert.Equal(t, strings.Join([]string{
			"Controller Status: 0/2 healthy",
			"Name     Last success   Last error   Count   Message",
			"bad      never          1s ago       1       invalid controller parameters: DoFunc must not be nil; " +
				"invalid controller parameters: RunInterval must not be negative, got -1ns; " +
				"invalid controller parameters: Jitter must not be negative, got -1ns",
			"tabbed   never          1s ago       1       col umn; next",
			""}, "\n"), buf.String())
		e.m.RemoveAllAndWait()
	})
}

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

// Health names each failing controller, sorted, and wraps its last error;
// it agrees with controllers_failing and FormatStatus.
func TestHealthAgreesWithMetricsAndFormatStatus(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		refused := errors.New("connection refused")
		e.m.UpdateController("b", ControllerParams{DoFunc: func(context.Context) error { return refused }})
		e.m.UpdateController("a", ControllerParams{DoFunc: func(context.Context) error { return errBoom }})
		e.m.UpdateController("ok", ControllerParams{DoFunc: NoopFunc})
		time.Sleep(3*time.Second + time.Millisecond)
		err := e.m.Health()
		assert.EqualError(t, err, "controller \"a\": 3 consecutive failures: boom\ncontroller \"b\": 3 consecutive failures: connection refused")
		assert.ErrorIs(t, err, refused)
		assert.Equal(t, 2.0, testutil.ToFloat64(e.metrics.failing))
		var buf bytes.Buffer
		require.NoError(t, FormatStatus(&buf, e.m.GetStatusModel(), false))
		assert.True(t, strings.HasPrefix(buf.String(), "Controller Status: 1/3 healthy\n"))

		require.NoError(t, e.m.RemoveControllerAndWait("a"))
		assert.Equal(t, 1.0, testutil.ToFloat64(e.metrics.failing), "a removed controller leaves the gauge")
		assert.EqualError(t, e.m.Health(), "controller \"b\": 3 consecutive failures: connection refused")
		e.m.RemoveAllAndWait()
		assert.NoError(t, e.m.Health())
	})
}

// Health reports a DoFunc that has run longer than its RunTimeout (it
// ignores its context), or, without one, than the Manager's WithStuckAfter
// threshold; without either a hung DoFunc is not Health's business.
func TestHealthReportsAStuckRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		logger, _ := test.NewNullLogger()
		m := NewManager(WithLogger(logger), WithMetrics(nil), WithStuckAfter(10*time.Minute))
		plain := NewManager(WithLogger(logger), WithMetrics(nil))
		never := make(chan struct{})
		hang := func(context.Context) error { <-never; return nil }
		m.UpdateController("timed", ControllerParams{DoFunc: hang, RunTimeout: 30 * time.Second})
		m.UpdateController("untimed", ControllerParams{DoFunc: hang})
		plain.UpdateController("untimed", ControllerParams{DoFunc: hang})

		time.Sleep(30 * time.Second)
		assert.NoError(t, m.Health(), "at its RunTimeout a run is not yet stuck")
		time.Sleep(time.Second)
		err := m.Health()
		assert.ErrorIs(t, err, ErrRunStuck)
		assert.EqualError(t, err, `controller "timed": run stuck: DoFunc has run for 31s, over its RunTimeout of 30s`)

		time.Sleep(10 * time.Minute)
		assert.EqualError(t, m.Health(), "controller \"timed\": run stuck: DoFunc has run for 10m31s, over its RunTimeout of 30s\n"+
			"controller \"untimed\": run stuck: DoFunc has run for 10m31s, over the Manager's stuck threshold of 10m0s")
		assert.NoError(t, plain.Health(), "the threshold is off by default")

		close(never)
		synctest.Wait()
		assert.ErrorIs(t, m.Health(), ErrRunTimeout, "the timed run, once over, is a failure")
		assert.NotErrorIs(t, m.Health(), ErrRunStuck)
		m.RemoveAllAndWait()
		plain.RemoveAllAndWait()
	})
}

// A row whose message is the ExitReason of the last run says so: after a
// failure (1s ago) and then an exit (2s ago), "Last error" is the
// failure's time and the message is the exit's, which the row must not
// pass off as the last error's. Text and HTML show it alike.
func TestStatusRowTellsExitReasonFromLastError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		r := newRecorder(errBoom, NewExitReason("annotation applied"))
		e.m.UpdateController("annotate", ControllerParams{DoFunc: r.do})
		time.Sleep(3 * time.Second)
		var buf bytes.Buffer
		require.NoError(t, FormatStatus(&buf, e.m.GetStatusModel(), true))
		assert.Equal(t, "Controller Status: 1/1 healthy\n"+
			"Name       Last success   Last error   Count   Message\n"+
			"annotate   2s ago         3s ago       0       [exit reason] annotation applied\n", buf.String())
		tables, _ := parsePage(t, body(t, serve(StatusHandler(e.m), http.MethodGet, "/", "text/html")))
		assert.Equal(t, []string{"[exit reason] annotation applied"}, tables["controllers"].column(6))
		e.m.RemoveAllAndWait()
	})
}
