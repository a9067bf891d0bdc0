// The benchmarks behind the figures of docs/performance.md.

package controller

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

// The benchmarks run as a user's agent would: metrics on (a Metrics
// registered in a registry) and logrus at Info, writing nowhere.
//
//	go test -run XXX -bench . -benchmem
//
// BenchmarkIdle measures memory and wants a fresh process, because the
// runtime reuses the stacks of dead goroutines:
//
//	go test -run XXX -bench 'Idle/N=100k' -benchtime 1x

// BenchmarkIdle reports the heap and stack bytes an idle controller holds:
// one that has run once, successfully, with RunInterval 0.
func BenchmarkIdle(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		b.Run(fmt.Sprintf("N=%dk", n/1000), func(b *testing.B) {
			ns := names(n)
			m := benchManager(b)
			for range b.N {
				before := heapAndStack()
				installAll(m, ns)
				after := heapAndStack()
				b.ReportMetric(float64(after-before)/float64(n), "bytes/controller")
				b.StopTimer()
				m.RemoveAllAndWait()
				b.StartTimer()
			}
		})
	}
}

// BenchmarkRunSuccess is the cost of one steady-state successful run of a
// controller that re-runs every nanosecond.
func BenchmarkRunSuccess(b *testing.B) {
	benchRuns(b, func(cd *countdown) ControllerParams {
		return ControllerParams{DoFunc: cd.do, RunInterval: time.Nanosecond, Group: NewGroup("bench")}
	})
}

// BenchmarkRunFailure is the cost of one steady-state failed run of a
// controller retried every nanosecond.
func BenchmarkRunFailure(b *testing.B) {
	benchRuns(b, func(cd *countdown) ControllerParams {
		return ControllerParams{DoFunc: cd.fail, ErrorRetryBaseDuration: time.Nanosecond,
			MaxRetryInterval: time.Nanosecond, Group: NewGroup("bench")}
	})
}

// BenchmarkRunSuccessWithRunTimeout is BenchmarkRunSuccess with a
// RunTimeout: each run then makes a context with a deadline and its timer.
func BenchmarkRunSuccessWithRunTimeout(b *testing.B) {
	benchRuns(b, func(cd *countdown) ControllerParams {
		return ControllerParams{DoFunc: cd.do, RunInterval: time.Nanosecond, Group: NewGroup("bench"), RunTimeout: time.Hour}
	})
}

// BenchmarkRunSuccessWithMiddleware is BenchmarkRunSuccess with a run
// middleware that only calls DoFunc: what WithRunMiddleware costs a run.
func BenchmarkRunSuccessWithMiddleware(b *testing.B) {
	passThrough := func(_ RunInfo, do ControllerFunc) ControllerFunc {
		return func(ctx context.Context) error { return do(ctx) }
	}
	benchRuns(b, func(cd *countdown) ControllerParams {
		return ControllerParams{DoFunc: cd.do, RunInterval: time.Nanosecond, Group: NewGroup("bench")}
	}, WithRunMiddleware(passThrough))
}

// BenchmarkRunFailureBackoff is BenchmarkRunFailure under each backoff
// policy: what a policy other than linear costs a failed run.
func BenchmarkRunFailureBackoff(b *testing.B) {
	for _, policy := range []Backoff{LinearBackoff, ExponentialBackoff, ConstantBackoff} {
		b.Run(policy.String(), func(b *testing.B) {
			benchRuns(b, func(cd *countdown) ControllerParams {
				return ControllerParams{DoFunc: cd.fail, ErrorRetryBaseDuration: time.Nanosecond,
					MaxRetryInterval: time.Nanosecond, Group: NewGroup("bench"), Backoff: policy}
			})
		})
	}
}

func benchRuns(b *testing.B, params func(*countdown) ControllerParams, opts ...Option) {
	m := benchManager(b)
	for _, o := range opts {
		o(m)
	}
	b.ReportAllocs()
	cd := newCountdown(b.N)
	b.ResetTimer()
	m.UpdateController("bench", params(cd))
	<-cd.done
	b.StopTimer()
	m.RemoveAllAndWait()
}

// BenchmarkFloor is the run loop written bare: a goroutine, a reused timer
// and a call. It is the limit BenchmarkRunSuccess is compared against.
func BenchmarkFloor(b *testing.B) {
	b.ReportAllocs()
	cd := newCountdown(b.N)
	var do ControllerFunc = cd.do // called through a func value, as a DoFunc is
	ctx := context.Background()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	b.ResetTimer()
	wg.Go(func() {
		t := time.NewTimer(0)
		defer t.Stop()
		for {
			select {
			case <-t.C:
			case <-stop:
				return
			}
			_ = do(ctx)
			t.Reset(time.Nanosecond)
		}
	})
	<-cd.done
	b.StopTimer()
	close(stop)
	wg.Wait()
}

// BenchmarkCreate is the cost of installing a controller and its first run,
// per controller, over batches of 10k.
func BenchmarkCreate(b *testing.B) {
	const n = 10_000
	ns := names(n)
	m := benchManager(b)
	var allocs uint64
	b.ResetTimer()
	for range b.N {
		a := mallocs()
		installAll(m, ns)
		allocs += mallocs() - a
		b.StopTimer()
		m.RemoveAllAndWait()
		b.StartTimer()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/controller")
	b.ReportMetric(float64(allocs)/float64(b.N*n), "allocs/controller")
}

// BenchmarkRemoveAllAndWait is the cost of removing a controller, per
// controller, over batches of 10k.
func BenchmarkRemoveAllAndWait(b *testing.B) {
	const n = 10_000
	ns := names(n)
	m := benchManager(b)
	var allocs uint64
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		installAll(m, ns)
		b.StartTimer()
		a := mallocs()
		m.RemoveAllAndWait()
		allocs += mallocs() - a
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/controller")
	b.ReportMetric(float64(allocs)/float64(b.N*n), "allocs/controller")
}

// BenchmarkTrigger is the latency from TriggerController to DoFunc's entry,
// over 10k sequential triggers per iteration.
func BenchmarkTrigger(b *testing.B) { benchTrigger(b) }

// BenchmarkTriggerWithDebounce is BenchmarkTrigger with a debounce window
// of a nanosecond, which every trigger outlasts: what deciding whether to
// hold a run costs a trigger.
func BenchmarkTriggerWithDebounce(b *testing.B) {
	benchTrigger(b, WithTriggerDebounce(time.Nanosecond))
}

func benchTrigger(b *testing.B, opts ...Option) {
	const n = 10_000
	m := benchManager(b)
	for _, o := range opts {
		o(m)
	}
	var sent time.Time
	lat := make([]time.Duration, 0, n)
	entered := make(chan struct{})
	first := true
	m.UpdateController("t", ControllerParams{DoFunc: func(context.Context) error {
		if first {
			first = false
		} else {
			lat = append(lat, time.Since(sent))
		}
		entered <- struct{}{}
		return nil
	}})
	<-entered
	var all []time.Duration
	b.ResetTimer()
	for range b.N {
		lat = lat[:0]
		for range n {
			sent = time.Now()
			m.TriggerController("t")
			<-entered
		}
		all = append(all, lat...)
	}
	b.StopTimer()
	m.RemoveAllAndWait()
	slices.Sort(all)
	b.ReportMetric(float64(all[len(all)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(all[len(all)*99/100].Nanoseconds()), "p99-ns")
}

// BenchmarkStatus is the cost of GetStatusModel per controller.
func BenchmarkStatus(b *testing.B) {
	const n = 10_000
	m := benchManager(b)
	installAll(m, names(n))
	b.Run("N=10k", func(b *testing.B) {
		var allocs uint64
		for range b.N {
			a := mallocs()
			if len(m.GetStatusModel()) != n {
				b.Fatal("short status")
			}
			allocs += mallocs() - a
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/controller")
		b.ReportMetric(float64(allocs)/float64(b.N*n), "allocs/controller")
	})
	m.RemoveAllAndWait()
}
