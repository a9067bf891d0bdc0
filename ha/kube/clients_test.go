// The renewals' own client against the real kube-apiserver: claims held
// back by their rate limiter do not hold back a renewal.

package kube

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// testMargin is the tests' Margin: a session renews every
// (testD − testMargin)/4.
const testMargin = testD / 4

// The renewals go through a client and rate limiter of their own: with
// the claims' client held to one request a second and dozens of changes
// queued on it, every renewal is still answered within a renewal period,
// (D − Margin)/4.
func TestRenewalsDoNotQueueBehindClaims(t *testing.T) {
	c := needCluster(t)
	const buckets = 32
	g := newTestGroup(t, c, buckets, nil)
	cfg := replicaConfig(c, nil)
	cfg.QPS, cfg.Burst = 1, 1
	slow := groupOn(t, c, g, cfg)
	s, _ := mustBegin(t, slow, "r1")
	o := newObserver(slow)

	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	var finished atomic.Int64
	defer func() { cancel(); wg.Wait() }()
	for i := range buckets {
		wg.Go(func() {
			if _, err := s.change(ctx, o, i, claimChange{claim: namesIn(g, i, 1)}); err == nil {
				finished.Add(1)
			}
		})
	}
	period := (testD - testMargin) / 4
	var slowest time.Duration
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); {
		sent := time.Now()
		if _, err := s.renew(t.Context()); err != nil {
			t.Fatalf("renewal: %v", err)
		}
		took := time.Since(sent)
		slowest = max(slowest, took)
		if took > period {
			t.Errorf("a renewal took %v while claims queued, more than a renewal period %v", took, period)
		}
		sleepUntil(sent.Add(period))
	}
	if n := finished.Load(); n > buckets/4 {
		t.Fatalf("%d of %d changes finished in 3 s at 1 request a second: the claims' limiter was not saturated", n, buckets)
	}
	t.Logf("slowest renewal %v, %d of %d changes through", slowest, finished.Load(), buckets)
}
