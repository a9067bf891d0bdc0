// status.go: the status model (Cilium's JSON) and FormatStatus.

package controller

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
)

// Duration is a [time.Duration] that marshals, in JSON and as text, as a Go
// duration string such as "1.5s", the way Cilium's REST model writes
// durations. Unmarshalling also accepts a JSON number of nanoseconds.
type Duration time.Duration

// String returns the duration in Go syntax, e.g. "1m30s".
func (d Duration) String() string { return time.Duration(d).String() }

// MarshalText implements [encoding.TextMarshaler].
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// UnmarshalText implements [encoding.TextUnmarshaler]; it accepts what
// [time.ParseDuration] accepts.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("controller.Duration: %w", err)
	}
	*d = Duration(v)
	return nil
}

// UnmarshalJSON accepts a duration string ("1s") or a number of
// nanoseconds.
func (d *Duration) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		return d.UnmarshalText([]byte(s))
	}
	var n int64
	if err := json.Unmarshal(b, &n); err != nil {
		return fmt.Errorf("controller.Duration: want a duration string or nanoseconds, got %s", b)
	}
	*d = Duration(n)
	return nil
}

// ControllerStatuses is a list of controller statuses, as returned by
// [Manager.GetStatusModel] and [GetGlobalStatus].
type ControllerStatuses []*ControllerStatus

// ControllerStatus is the status of one controller. Its JSON form is that of
// Cilium's REST model (models.ControllerStatus), so tools that read Cilium's
// controller status read it too; the fields this package adds are left out
// when zero.
//
//	{
//	  "name": "sync-to-k8s",
//	  "uuid": "6f1c0e2a-5b0e-4d8e-9a63-1c2d3e4f5a6b",
//	  "configuration": {"error-retry": true, "error-retry-base": "1s", "interval": "10s"},
//	  "status": {
//	    "success-count": 12, "failure-count": 1, "consecutive-failure-count": 0,
//	    "last-failure-msg": "", "last-failure-timestamp": "2026-11-21T10:00:01Z",
//	    "last-success-timestamp": "2026-11-21T10:02:00Z"
//	  }
//	}
type ControllerStatus struct {
	Name          string                         `json:"name"`
	UUID          string                         `json:"uuid"`
	Configuration *ControllerStatusConfiguration `json:"configuration,omitempty"`
	Status        *ControllerStatusStatus        `json:"status,omitempty"`
}

// ControllerStatusConfiguration is the configuration part of a
// [ControllerStatus]: the controller's newest parameters.
type ControllerStatusConfiguration struct {
	// ErrorRetry is !NoErrorRetry.
	ErrorRetry bool `json:"error-retry"`
	// Backoff is the retry backoff policy; left out when linear (the
	// default, and Cilium's), so that the default JSON stays Cilium's.
	// Beside ErrorRetry, it takes no room of its own in a status.
	Backoff Backoff `json:"backoff,omitzero"`
	// ErrorRetryBase is the effective ErrorRetryBaseDuration (1s when the
	// parameter is 0).
	ErrorRetryBase Duration `json:"error-retry-base"`
	// Interval is RunInterval.
	Interval Duration `json:"interval"`

	// Group is Group.Name; left out when empty.
	Group string `json:"group,omitempty"`
	// MaxRetryInterval is the retry cap; left out when 0 (no cap).
	MaxRetryInterval Duration `json:"max-retry-interval,omitzero"`
	// MaxRetries is the retry limit; left out when 0 (no limit).
	MaxRetries int64 `json:"max-retries,omitzero"`
	// Jitter is the jitter bound; left out when 0.
	Jitter Duration `json:"jitter,omitzero"`
	// RunTimeout bounds each run; left out when 0 (no bound).
	RunTimeout Duration `json:"run-timeout,omitzero"`
}

// ControllerStatusStatus is the statistics part of a [ControllerStatus].
type ControllerStatusStatus struct {
	SuccessCount            int64 `json:"success-count"`
	FailureCount            int64 `json:"failure-count"`
	ConsecutiveFailureCount int64 `json:"consecutive-failure-count"`
	// LastFailureMsg is the last error: with a ConsecutiveFailureCount
	// above 0, the last failure's message, recorded at
	// LastFailureTimestamp; with 0, the ExitReason the last run ended with,
	// at LastSuccessTimestamp (an exit counts as a success). Empty after a
	// plain success.
	LastFailureMsg       string    `json:"last-failure-msg"`
	LastFailureTimestamp time.Time `json:"last-failure-timestamp,omitzero"`
	LastSuccessTimestamp time.Time `json:"last-success-timestamp,omitzero"`
	// LastRunDuration is how long the last DoFunc run took; left out when
	// 0.
	LastRunDuration Duration `json:"last-run-duration,omitzero"`
	// RunningSince is when the DoFunc running now started; nil, and left
	// out, when none runs. A run that has lasted long is stuck: see
	// [Manager.Health].
	RunningSince *time.Time `json:"running-since,omitempty"`
	// Stuck says that the DoFunc running when the status was taken had
	// run longer than its limit: its RunTimeout, or, without one, the
	// Manager's [WithStuckAfter] threshold. Left out when false. A stuck
	// controller is not healthy (see the package documentation).
	Stuck bool `json:"stuck,omitempty"`
	// RemovedTimestamp is when the controller was removed; set only in
	// the statuses of controllers still stopping
	// ([Manager.GetStoppingStatus]), nil otherwise.
	//
	// Both are pointers, as Kubernetes' DeletionTimestamp is: most
	// statuses have neither, and a nil costs 8 bytes where a zero
	// time.Time costs 24, in every status of every poll.
	RemovedTimestamp *time.Time `json:"removed-timestamp,omitempty"`
}

// failing reports whether the status is of a failing controller: one whose
// consecutive failure count is above zero.
func (s *ControllerStatus) failing() bool {
	return s.Status != nil && s.Status.ConsecutiveFailureCount > 0
}

// message returns the last error as a row shows it: one line, "no error"
// when there is none, and marked "[exit reason] " when it is the ExitReason
// of the last run rather than the last failure's message (see
// LastFailureMsg), so that it is not read beside the last failure's time
// as that failure's.
func (st *ControllerStatusStatus) message() string {
	if st.LastFailureMsg == "" {
		return "no error"
	}
	return oneLine(st.markedMessage())
}

// markedMessage returns LastFailureMsg, after "[exit reason] " when it is
// the ExitReason of the last run.
func (st *ControllerStatusStatus) markedMessage() string {
	if st.LastFailureMsg != "" && st.ConsecutiveFailureCount == 0 {
		return "[exit reason] " + st.LastFailureMsg
	}
	return st.LastFailureMsg
}

// healthy reports whether the status is of a healthy controller: neither
// failing nor stuck (health.go).
func (s *ControllerStatus) healthy() bool {
	return !s.failing() && (s.Status == nil || !s.Status.Stuck)
}

func compareStatus(a, b *ControllerStatus) int {
	return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.UUID, b.UUID))
}

// FormatStatus writes a human-readable summary of statuses to w: a line
// "Controller Status: <healthy>/<total> healthy", then a table of every
// controller when all is true, or of those that are not healthy (failing
// or stuck, as the package documentation defines them) only:
//
//	Controller Status: 1/3 healthy
//	Name          Last success   Last error   Count   Message
//	sync-to-k8s   never          3s ago       4       connection refused
//	watch         never          never        0       [stuck, running 1h0m0s] no error
//
// Times read "never" or "<duration rounded to seconds> ago"; Count is the
// number of consecutive failures; Message is the last error, or "no error",
// or "[exit reason] <reason>" when the last run ended with an ExitReason
// (at the last success's time, not the last error's); after "[running
// 1m5s] " while a DoFunc runs, saying for how long, or "[stuck, running
// 1h0m0s] " once it has run longer than its limit.
// Rows are sorted by name, one per controller: a message or name that
// spans lines (an [errors.Join] of several errors does) has its lines
// joined with "; ", and its tabs made spaces. No table is written when it
// would be empty. It returns the first error writing to w.
func FormatStatus(w io.Writer, statuses ControllerStatuses, all bool) error {
	rows := make(ControllerStatuses, 0, len(statuses))
	total, healthy := 0, 0
	for _, s := range statuses {
		if s == nil {
			continue
		}
		total++
		if s.healthy() {
			healthy++
		}
		if all || !s.healthy() {
			rows = append(rows, s)
		}
	}
	if _, err := fmt.Fprintf(w, "Controller Status: %d/%d healthy\n", healthy, total); err != nil {
		return err
	}
	if len(rows) == 0 {
		return nil
	}
	slices.SortFunc(rows, compareStatus)
	now := time.Now()
	tw := newTable(w)
	fmt.Fprintln(tw, "Name\tLast success\tLast error\tCount\tMessage")
	for _, s := range rows {
		st := s.Status
		if st == nil {
			st = &ControllerStatusStatus{}
		}
		msg := st.message()
		switch {
		case st.RunningSince != nil && st.Stuck:
			msg = "[stuck, running " + since(now, *st.RunningSince) + "] " + msg
		case st.RunningSince != nil:
			msg = "[running " + since(now, *st.RunningSince) + "] " + msg
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\n", oneLine(s.Name),
			ago(now, st.LastSuccessTimestamp), ago(now, st.LastFailureTimestamp),
			st.ConsecutiveFailureCount, msg)
	}
	return tw.Flush()
}

// newTable returns the tabwriter of the status tables.
func newTable(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 8, 3, ' ', 0) }

// oneLine returns s fit for one cell of the table: its lines joined with
// "; " (blank ones dropped) and every other control character a space, so
// that neither a line break nor a tab can split a row.
func oneLine(s string) string {
	if !strings.ContainsFunc(s, unicode.IsControl) {
		return s
	}
	lines := strings.FieldsFunc(s, func(r rune) bool { return r == '\n' || r == '\r' })
	s = strings.Join(lines, "; ")
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s)
}

// ago formats t relative to now: "never" for the zero time, else the
// elapsed time rounded to seconds ("3s ago", "1m5s ago").
func ago(now, t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return since(now, t) + " ago"
}

// since formats the time from t to now, rounded to seconds.
func since(now, t time.Time) string {
	return max(now.Sub(t).Round(time.Second), 0).String()
}
