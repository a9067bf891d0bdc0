// The allocation guards: a run allocates nothing, a controller's whole
// life a handful.

package controller

import (
	"context"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// meteredDo is a DoFunc that reads the process's malloc counter after
// warmup runs and closes done after total runs.
type meteredDo struct {
	calls         atomic.Int64
	warmup, total int64
	before, after uint64
	result        error
	done          chan struct{}
}

func (d *meteredDo) do(context.Context) error {
	switch d.calls.Add(1) {
	case d.warmup:
		d.before = mallocs()
	case d.total:
		d.after = mallocs()
		close(d.done)
	}
	return d.result
}

// The run loop allocates nothing in steady state, success or failure, with
// metrics and logging (at Info, to logrus or to log/slog) on. A controller
// runs 20,000 times and the process-wide malloc counter may move by a
// handful (the runtime's own bookkeeping): one allocation per run fails the
// test.
func TestRunLoopDoesNotAllocate(t *testing.T) {
	for _, tc := range []struct {
		name   string
		result error
		params ControllerParams
		slog   bool // log to log/slog instead of logrus
	}{
		{"success", nil, ControllerParams{RunInterval: time.Nanosecond, Group: NewGroup("g")}, false},
		{"failure", errBoom, ControllerParams{ErrorRetryBaseDuration: time.Nanosecond, MaxRetryInterval: time.Nanosecond, Group: NewGroup("g")}, false},
		{"jitter and a HealthReporter", nil, ControllerParams{RunInterval: time.Nanosecond, Jitter: time.Nanosecond, Health: nopHealth{}}, false},
		{"success on slog", nil, ControllerParams{RunInterval: time.Nanosecond, Group: NewGroup("g")}, true},
		{"failure on slog", errBoom, ControllerParams{ErrorRetryBaseDuration: time.Nanosecond, MaxRetryInterval: time.Nanosecond, Group: NewGroup("g")}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Warm-up runs make the timer, the run context and the log
			// entry of the first failure.
			d := &meteredDo{warmup: 100, total: 20_100, result: tc.result, done: make(chan struct{})}
			m := benchManager(t)
			if tc.slog {
				WithSlog(slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelInfo})))(m)
			}
			p := tc.params
			p.DoFunc = d.do
			m.UpdateController("c", p)
			<-d.done
			m.RemoveAllAndWait()
			runs := d.total - d.warmup
			assert.Less(t, float64(d.after-d.before)/float64(runs), 0.01,
				"%d allocations over %d runs", d.after-d.before, runs)
		})
	}
}

// A controller's whole life (install, one successful run, removal) costs
// at most 8 allocations, counted over 1,000 controllers: the Controller,
// its signal channel, the closure of the go statement, the goroutine and
// the record it waits with (the runtime's two), and the 3 of its pprof
// labels (labels.go). What the Manager spreads over them (its map
// growing, the stop cohort a wait makes) and the runtime's background work
// add a few hundredths per controller, so the bound is on the count
// rounded to whole allocations: a ninth per controller reads 9.0x.
func TestControllerLifeAllocations(t *testing.T) {
	const n = 1000
	ns := names(n)
	m := benchManager(t)
	before := mallocs()
	installAll(m, ns)
	m.RemoveAllAndWait()
	perController := float64(mallocs()-before) / n
	t.Logf("%.2f allocations per controller life", perController)
	assert.Less(t, perController, 8.5, "more than 8 allocations per controller life")
}
