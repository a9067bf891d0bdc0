// Review of ha.Rounding (0 on this store) and of the Backend docs'
// promises, against the test cluster.

package kube

import (
	"crypto/rand"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/bgctl/controller/ha"
	"github.com/bgctl/controller/ha/hatest"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A replica alone in an idle group stays healthy: the Backend docs say
// an idle feed owes progress more often than Window (TTL − Margin), and
// on Kubernetes the only writes of an idle group are the members' own
// renewals, every (TTL − Margin)/4, which the feed passes on as progress.
func TestRoundingReviewIdleFeedOwesProgress(t *testing.T) {
	t.Parallel()
	g := newKubeReplicas(t, 2)
	r := g.join("r0")
	g.waitPlaced("placed", 20*time.Second, "r0")
	end := time.Now().Add(4 * (replicaTTL - replicaTTL/4))
	for time.Now().Before(end) {
		if err := r.Health(); errors.Is(err, ha.ErrWatchStalled) {
			t.Fatalf("an idle group's replica: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// PeerLeft of a silent session is never short (Rounding 0), but a
// renewal the reader's observer has not seen yet (its feed stalled, or
// merely not there yet) is not counted: the reading puts the end at the
// stamp of the version before it, short of the holder's validity by up
// to the time between the two writes, here D/2, and before the holder's
// fence (TTL − Margin, Margin TTL/4, from the renewal's send). So no
// name may be freed on a reading on this store
// (TestRoundingReviewShortReadingStartsNoNameEarly), and ha's hold
// after a reading is not what keeps such a holder safe (kubeBackend.Rounding).
func TestRoundingReviewPeerLeftIsShortOfAnUnseenRenewal(t *testing.T) {
	t.Parallel()
	_, a, sa, b := pairOf(t, "d")
	ctx := t.Context()
	if _, _, err := b.PeerLeft(ctx, sa.ID); err != nil { // stamps a's Lease (a listing)
		t.Fatal(err)
	}
	time.Sleep(testD / 2)
	called := time.Now()
	valid, err := a.Renew(ctx, sa.ID)
	if err != nil {
		t.Fatal(err)
	}
	fence := called.Add(valid - testD/4)
	left, _, err := b.PeerLeft(ctx, sa.ID)
	answered := time.Now()
	if err != nil {
		t.Fatal(err)
	}
	end := answered.Add(left)
	if !end.Before(fence) {
		t.Fatalf("PeerLeft after a renewal its observer has not seen: %v left, the end %v past the holder's fence; want it short, before", left, end.Sub(fence))
	}
	t.Logf("PeerLeft after a renewal its observer has not seen: %v left, the end %v short of the holder's validity, %v before its fence",
		left, called.Add(valid).Sub(end).Round(time.Millisecond), fence.Sub(end).Round(time.Millisecond))
}

// The short reading above holds nothing on this store: the names of a
// session go from the view, and a Claim takes them, only once the
// claimer's observer counts the session ended, never from a reading. A
// holder renews after the reader's observer stamped it (the reader does
// not see the renewal: its reading is short of the holder's fence), then
// its member Lease is deleted by hand as if it froze at once: the reader
// takes its name only past the holder's validity.
func TestRoundingReviewShortReadingStartsNoNameEarly(t *testing.T) {
	t.Parallel()
	g, a, sa, b := pairOf(t, "d")
	ctx := t.Context()
	if got, _, err := a.Claim(ctx, sa.ID, []string{"x"}); err != nil || len(got) != 1 || !got[0].Mine {
		t.Fatalf("claim x: %+v, %v", got, err)
	}
	sb := mustBeginAs(t, b, "d")
	if _, _, err := b.PeerLeft(ctx, sa.ID); err != nil {
		t.Fatal(err)
	}
	time.Sleep(testD / 2)
	called := time.Now()
	valid, err := a.Renew(ctx, sa.ID)
	if err != nil {
		t.Fatal(err)
	}
	validUntil := called.Add(valid)
	left, _, err := b.PeerLeft(ctx, sa.ID)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the reader's reading puts the end %v before the holder's validity", validUntil.Sub(time.Now().Add(left)).Round(time.Millisecond))
	if err := g.leases.Delete(ctx, g.memberName("r0"), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f, _ := watchFrom(t, b)
	drained := make(chan struct{})
	go func() { // ends with the test's context, before the feed stops
		defer close(drained)
		for {
			select {
			case <-f.Batches():
			case <-ctx.Done():
				return
			}
		}
	}()
	t.Cleanup(func() { <-drained })
	for deadline := time.Now().Add(4 * testD); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if _, err := b.Renew(ctx, sb.ID); err != nil {
			t.Fatalf("renew the reader: %v", err)
		}
		got, _, err := b.Claim(ctx, sb.ID, []string{"x"})
		if err != nil {
			continue
		}
		if len(got) == 1 && got[0].Mine {
			if at := time.Now(); at.Before(validUntil) {
				t.Fatalf("the reader took x %v before the holder's validity ran out", validUntil.Sub(at))
			} else {
				t.Logf("the reader took x %v after the holder's validity ran out", at.Sub(validUntil).Round(time.Millisecond))
			}
			return
		}
	}
	t.Fatal("the reader never took x")
}

// slowWatch delays each read of a watch's body by delay: a feed whose
// events come that much late, as under load.
type slowWatch struct {
	rt    http.RoundTripper
	delay time.Duration
}

func (s slowWatch) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := s.rt.RoundTrip(req)
	if err == nil && req.URL.Query().Get("watch") == "true" {
		resp.Body = slowBody{resp.Body, s.delay}
	}
	return resp, err
}

type slowBody struct {
	io.ReadCloser
	delay time.Duration
}

func (b slowBody) Read(p []byte) (int, error) {
	time.Sleep(b.delay)
	return b.ReadCloser.Read(p)
}

// hatest's ReadingsAreShortByNoMoreThanTheRounding on a group whose
// reader's feed comes 100ms late: its first PeerLeft, right after the
// renewal, must not come before the feed shows the renewal, or it puts
// the end at the reader's listing's stamp, before the renewal's send + D
// (PeerLeft is short of a renewal its observer has not seen:
// TestRoundingReviewPeerLeftIsShortOfAnUnseenRenewal). Without the wait
// the case fails so on this store whenever its feed is slower than a
// GET.
func TestRoundingReviewConformanceReadingWaitsForTheFeed(t *testing.T) {
	t.Parallel()
	c := needCluster(t)
	applyManifest(t, c)
	group := "c" + strings.ToLower(rand.Text()[:10])
	deleteGroupAtEnd(t, c, group)
	backend := func(id string) ha.Backend {
		cfg := replicaConfig(c, nil)
		cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
			c.track(&http.Client{Transport: rt})
			if id == "r1" {
				return slowWatch{rt, 100 * time.Millisecond}
			}
			return rt
		}
		w := hatest.TTL - hatest.TTL/4
		b, err := Store(cfg, replicaNamespace, StoreOptions{Buckets: 1}).Backend(ha.BackendConfig{Group: group, ID: id, TTL: hatest.TTL, RequestTimeout: 5 * time.Second,
			RenewEvery: w / 4, Window: w, Logger: slog.New(slog.DiscardHandler), Stopping: t.Context()})
		if err != nil {
			t.Fatalf("the backend of %s: %v", id, err)
		}
		return b
	}
	for _, tc := range hatest.Cases() {
		if tc.Name == "ReadingsAreShortByNoMoreThanTheRounding" {
			tc.Test(t, hatest.Group{Backend: backend, Slack: time.Second, Early: 300 * time.Millisecond, NoHistory: true})
			return
		}
	}
	t.Fatal("no such case")
}
