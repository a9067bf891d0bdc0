// Tests of Health: the reasons from a table, then a replica against etcd
// through a quiet spell, a partition, a same-ID replica and its Close.

package ha

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Each state gives its reasons, each wrapping its sentinels, with a text
// that names the replica and quotes the causes without a second "ha: ".
func TestHealthReasons(t *testing.T) {
	dup := errors.New("ha: another live replica has this ID: member key /svc/members/r0 held by lease 7f")
	dup = errors.Join(ErrDuplicateID, dup) // as the loop's cause wraps it
	joinErr := errors.New("ha: granting a lease of 10s: context deadline exceeded")
	healthy := healthView{leased: true, listed: true, inView: true, silent: time.Second, window: 7500 * time.Millisecond}
	for _, tc := range []struct {
		name string
		v    healthView
		is   []error // nil: healthy
		text string
	}{
		{"a working member", healthy, nil, ""},
		{"before the first listing, without its key yet", healthView{leased: true, silent: time.Second, window: 7500 * time.Millisecond}, nil, ""},
		{"closed", healthView{closed: true, passed: true}, []error{ErrClosed}, `ha: replica "r0": closed (Leave or Close was called)`},
		{"fence passed by its timer, joining again", healthView{passed: true, joinErr: joinErr},
			[]error{ErrNoLease, ErrFencePassed}, `ha: replica "r0": no lease: its fence passed; joining again, the last attempt failed: granting a lease of 10s: context deadline exceeded`},
		{"the ID taken", healthView{passed: true, cause: dup, joinErr: dup},
			[]error{ErrNoLease, ErrFencePassed, ErrDuplicateID}, `ha: replica "r0": no lease: its fence passed (another live replica has this ID`},
		{"fence passed, controllers stopping", healthView{leased: true, passed: true, cause: errLeaseLost},
			[]error{ErrFencePassed, errLeaseLost}, `ha: replica "r0": fence passed: stopping its controllers (lease lost: the store no longer knows it)`},
		{"member key missing", func() healthView { v := healthy; v.inView = false; return v }(),
			[]error{ErrMemberKeyMissing}, `ha: replica "r0": member key missing: the other members do not count it; writing it again`},
		{"watch silent", func() healthView { v := healthy; v.silent = 8 * time.Second; return v }(),
			[]error{ErrWatchStalled}, `ha: replica "r0": watch not progressing: no event or progress notification for 8s (TTL − Margin is 7.5s)`},
		{"both", func() healthView { v := healthy; v.inView, v.silent = false, 8*time.Second; return v }(),
			[]error{ErrMemberKeyMissing, ErrWatchStalled}, "writing it again\nha: replica \"r0\": watch not progressing"},
	} {
		err := tc.v.err("r0")
		if tc.is == nil {
			if err != nil {
				t.Errorf("%s: %v, want nil", tc.name, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("%s: nil, want an error", tc.name)
			continue
		}
		for _, want := range tc.is {
			if !errors.Is(err, want) {
				t.Errorf("%s: %q does not wrap %v", tc.name, err, want)
			}
		}
		if !strings.Contains(err.Error(), tc.text) || strings.Contains(err.Error(), ": ha: ") || strings.Contains(err.Error(), "(ha: ") {
			t.Errorf("%s: %q, want it to contain %q and no quoted \"ha: \"", tc.name, err, tc.text)
		}
	}
}

// A replica is healthy once joined and stays so through a quiet spell
// longer than TTL − Margin (its watch, asked for progress, keeps it
// current); a partition makes it report no lease, and the heal healthy
// again; a same-ID replica's key makes it report the duplicate; Close,
// closed. HealthHandler serves each as 200 or 503.
func TestHealthAgainstEtcd(t *testing.T) {
	opts := testOptions()
	c := newCluster(t, 3, opts)
	n := c.join("solo")
	want := c.expected([]string{"solo"})
	c.waitPlacement(want, 10*time.Second)
	h := HealthHandler(n.r)
	if err := n.r.Health(); err != nil {
		t.Fatalf("Health after joining: %v", err)
	}
	time.Sleep(opts.window() + 500*time.Millisecond) // nothing changes meanwhile
	if err := n.r.Health(); err != nil {
		t.Fatalf("Health after a quiet %v: %v", opts.window()+500*time.Millisecond, err)
	}
	if resp, body := get(t, h, http.MethodGet, "/readyz", ""); resp.StatusCode != http.StatusOK || body != "ok\n" {
		t.Errorf("HealthHandler of a healthy replica: %d %q", resp.StatusCode, body)
	}

	n.proxy.cut()
	waitFor(t, "Health to report no lease", func() bool { return errors.Is(n.r.Health(), ErrNoLease) })
	err := n.r.Health()
	if !errors.Is(err, ErrFencePassed) || !strings.Contains(err.Error(), `replica "solo": no lease: its fence passed`) {
		t.Errorf("Health while cut off: %v", err)
	}
	if resp, body := get(t, h, http.MethodGet, "/readyz", ""); resp.StatusCode != http.StatusServiceUnavailable || body != err.Error()+"\n" {
		t.Errorf("HealthHandler while cut off: %d %q", resp.StatusCode, body)
	}
	n.proxy.heal()
	waitFor(t, "Health to be nil after the heal", func() bool { return n.r.Health() == nil })
	c.waitPlacement(want, 10*time.Second)

	admin := newClient(t, testEtcd)
	defer admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	other, err := admin.Grant(ctx, 30)
	if err != nil {
		t.Fatal(err)
	}
	key := c.prefix + "/members/solo"
	if _, err := admin.Put(ctx, key, "solo", clientv3.WithLease(other.ID)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "Health to report the duplicate ID", func() bool { return errors.Is(n.r.Health(), ErrDuplicateID) })
	if err := n.r.Health(); !errors.Is(err, ErrNoLease) {
		t.Errorf("Health with the ID taken: %v, want ErrNoLease as well", err)
	}
	if _, err := admin.Revoke(ctx, other.ID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "Health to be nil once the other lease is gone", func() bool { return n.r.Health() == nil })
	c.waitPlacement(want, 10*time.Second)

	c.leave(n)
	if err := n.r.Health(); !errors.Is(err, ErrClosed) {
		t.Errorf("Health after Leave: %v, want ErrClosed", err)
	}
	c.rec.assertNoOverlap(t)
}
