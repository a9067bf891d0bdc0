package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bgctl/controller/ha"
)

// The backend's errors wrap ha's sentinels where ha acts on them: a
// session lost (its Lease deleted or written by another since its last
// write), ended, or not live here is ha.ErrSessionEnded, the session's
// own reason kept; a lost session's own error stays its own (the
// backend tells the two apart: session.end, begin's end of prev).
func TestBackendErrorsWrapHasSentinels(t *testing.T) {
	b := newKubeBackend(&group{name: "g", buckets: 1, duration: testD}, "r0", slog.New(slog.DiscardHandler), nil, time.Second)
	lost := &session{name: "g-m-r0", state: sessionLost}
	b.sessions[1] = lost
	if err := b.ended(1); !errors.Is(err, ha.ErrSessionEnded) || !errors.Is(err, errSessionLost) {
		t.Errorf("the error of a lost session: %v, want it to wrap ha.ErrSessionEnded and errSessionLost", err)
	}
	if err := lost.stateErr(); !errors.Is(err, errSessionLost) || errors.Is(err, ha.ErrSessionEnded) {
		t.Errorf("a lost session's own error: %v, want errSessionLost alone", err)
	}
	if err := b.ended(2); !errors.Is(err, ha.ErrSessionEnded) {
		t.Errorf("the error of a session never begun here: %v, want it to wrap ha.ErrSessionEnded", err)
	}
	for _, state := range []sessionState{sessionEnding, sessionEnded} {
		if err := (&session{name: "g-m-r0", state: state}).stateErr(); !errors.Is(err, ha.ErrSessionEnded) || errors.Is(err, errSessionLost) {
			t.Errorf("the error of a session in state %d: %v, want it to wrap ha.ErrSessionEnded alone", state, err)
		}
	}
}

// A store without a configuration or a namespace is refused with an error
// that names what is missing.
func TestStoreRefusesMissingConfiguration(t *testing.T) {
	if _, err := Store(nil, "ns", StoreOptions{}).Backend(ha.BackendConfig{Group: "g", ID: "a", TTL: 4e9}); !errors.Is(err, ha.ErrInvalidOptions) {
		t.Errorf("Store(nil, …).Backend: %v, want ErrInvalidOptions", err)
	}
	if _, err := ha.New(Store(nil, "ns", StoreOptions{}), ha.Options{Prefix: "g", ID: "a"}); !errors.Is(err, ha.ErrInvalidOptions) {
		t.Errorf("ha.New on a Store without a configuration: %v, want ErrInvalidOptions", err)
	}
}

// hangingGets answers every GET and LIST only once its request's context
// ends while hang is set: what a client sees when one stream's answer is
// lost and the connection lives on. Other requests pass.
type hangingGets struct {
	rt   http.RoundTripper // immutable
	hang *atomic.Bool
}

func (h hangingGets) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method == http.MethodGet && h.hang.Load() {
		<-req.Context().Done()
		return nil, req.Context().Err()
	}
	return h.rt.RoundTrip(req)
}

// ha bounds the calls it makes with Backend.Request by the request
// timeout: a replica rewrites its member record (EnsureMember) and reads
// a peer's session (PeerLeft) so, and retries once a call fails. A read
// whose answer never comes must fail within the request timeout, not hold
// the replica's rewrite of its record until its epoch ends.
func TestBackendRequestBoundsReadsTheServerNeverAnswers(t *testing.T) {
	c := needCluster(t)
	g := newTestGroup(t, c, 4, nil)
	var hang atomic.Bool
	cfg := replicaConfig(c, nil)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return hangingGets{rt: rt, hang: &hang} }
	const timeout = time.Second
	b := newKubeBackend(groupOn(t, c, g, cfg), "r0", slog.New(slog.DiscardHandler), nil, timeout)
	s := mustBeginAs(t, b, "d")
	hang.Store(true)
	for _, call := range []struct {
		what string
		do   func(ctx context.Context) error
	}{
		{"EnsureMember", func(ctx context.Context) error {
			_, _, err := b.EnsureMember(ctx, s.ID, "d")
			return err
		}},
		{"PeerLeft", func(ctx context.Context) error {
			_, _, err := b.PeerLeft(ctx, s.ID+1)
			return err
		}},
	} {
		ctx, cancel := b.Request(t.Context())
		done := make(chan error, 1)
		go func() { done <- call.do(ctx) }() // joined below; cancel ends its request at the latest
		select {
		case err := <-done:
			if err == nil {
				t.Errorf("%s answered without its read; want an error", call.what)
			}
		case <-time.After(20 * timeout):
			t.Errorf("%s through Request still waits %v after its read went out; want it to fail within the request timeout, %v", call.what, 20*timeout, timeout)
			cancel()
			<-done
		}
		cancel()
	}
}

// slowPuts sends each PUT delay late, as a client's rate limiter paces
// them, and every other request at once.
type slowPuts struct {
	rt    http.RoundTripper // immutable
	delay *atomic.Int64     // nanoseconds
}

func (p slowPuts) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method == http.MethodPut {
		time.Sleep(time.Duration(p.delay.Load()))
	}
	return p.rt.RoundTrip(req)
}

// A Claim through Request is bounded per bucket write, not whole: a Claim
// whose writes take longer together than one request's timeout, each
// within it, places every name.
func TestBackendClaimThroughRequestOutlivesOneTimeout(t *testing.T) {
	c := needCluster(t)
	var delay atomic.Int64
	cfg := replicaConfig(c, nil)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return slowPuts{rt: rt, delay: &delay} }
	const timeout = 500 * time.Millisecond
	b := newKubeBackend(groupOn(t, c, newTestGroup(t, c, 2*claimWorkers, nil), cfg), "r0", slog.New(slog.DiscardHandler), nil, timeout)
	s := mustBeginAs(t, b, "d")
	// Two names in each bucket: the first Claim creates the buckets, the
	// second updates them, each update's answer held back.
	var first, second []string
	for i := 0; len(second) < 2*claimWorkers; i++ {
		n := fmt.Sprintf("n%d", i)
		if !slices.ContainsFunc(first, func(f string) bool { return bucketOf(f, 2*claimWorkers) == bucketOf(n, 2*claimWorkers) }) {
			first = append(first, n)
		} else if !slices.ContainsFunc(second, func(f string) bool { return bucketOf(f, 2*claimWorkers) == bucketOf(n, 2*claimWorkers) }) {
			second = append(second, n)
		}
	}
	if _, _, err := b.Claim(t.Context(), s.ID, first); err != nil {
		t.Fatal(err)
	}
	delay.Store(int64(timeout * 3 / 5)) // each write within the timeout; claimWorkers at a time, twice, past it
	ctx, cancel := b.Request(t.Context())
	defer cancel()
	start := time.Now()
	got, _, err := b.Claim(ctx, s.ID, second)
	if err != nil {
		t.Fatalf("Claim of %d names in as many buckets, after %v: %v; want each write bounded, not the call", len(second), time.Since(start), err)
	}
	for _, c := range got {
		if !c.Mine {
			t.Errorf("%s not claimed: %+v", c.Name, c)
		}
	}
	if d := time.Since(start); d <= timeout {
		t.Errorf("the Claim took %v, within one request timeout (%v): the test shows nothing", d, timeout)
	}
}

// ClaimFrom's Token is scoped by the name, not by Key (ha.Claim): two
// names of one bucket share its Lease as their Key, and the holding of
// the one claimed later carries the higher token while the other's still
// lasts, so a store that kept the highest token per Key would refuse the
// first holder's writes. A name's own tokens grow from holding to
// holding.
func TestBackendTokensAreScopedByName(t *testing.T) {
	c := needCluster(t)
	g := newTestGroup(t, c, 1, nil)
	a, sa := begunIn(t, g, "r0", "d")
	b, sb := begunIn(t, g, "r1", "d")
	claim := func(b *kubeBackend, id ha.SessionID, name string) ha.Claim {
		t.Helper()
		got, _, err := b.Claim(t.Context(), id, []string{name})
		if err != nil || len(got) != 1 || !got[0].Mine {
			t.Fatalf("Claim(%s) = %+v, %v; want it held", name, got, err)
		}
		return ha.Claim{Name: got[0].Name, Key: got[0].Key, Revision: got[0].Revision, Token: got[0].Token}
	}
	x := claim(a, sa.ID, "x")
	y := claim(b, sb.ID, "y")
	if x.Key != y.Key || y.Token <= x.Token {
		t.Errorf("x %+v and y %+v, one bucket's: want one Key, y's token above x's", x, y)
	}
	if err := a.Release(t.Context(), x); err != nil {
		t.Fatal(err)
	}
	if x2 := claim(b, sb.ID, "x"); x2.Token <= x.Token {
		t.Errorf("x held anew with token %d after %d; want it to grow", x2.Token, x.Token)
	}
}
