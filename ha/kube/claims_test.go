// The claims of a bucket: their one rule, their encoding, the bucket of a
// name.

package kube

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Every version of a group must put a name in the same bucket: these are
// FNV-1a's published values (the empty string's is the offset basis),
// and a name's bucket among 256.
func TestBucketOfIsStable(t *testing.T) {
	// The published test vectors of FNV-1a 64.
	for name, sum := range map[string]uint64{
		"":       0xcbf29ce484222325,
		"a":      0xaf63dc4c8601ec8c,
		"foobar": 0x85944171f73967e8,
	} {
		if got := bucketOf(name, 1<<62); uint64(got) != sum%(1<<62) {
			t.Errorf("bucketOf(%q, 2⁶²) = %#x, want FNV-1a %#x mod 2⁶²", name, got, sum)
		}
		if got := bucketOf(name, 256); uint64(got) != sum%256 {
			t.Errorf("bucketOf(%q, 256) = %d, want %d", name, got, sum%256)
		}
	}
}

// The rule's table, row by row (see apply).
func TestClaimsApply(t *testing.T) {
	ended := func(s string) bool { return strings.HasPrefix(s, "dead") }
	base := func() bucketClaims {
		return bucketClaims{
			"mine":  {session: "me", token: 3},
			"live":  {session: "other", token: 4},
			"ended": {session: "dead/1", token: 5},
		}
	}
	for _, tc := range []struct {
		what    string
		ch      claimChange
		got     []string
		changed bool
		want    bucketClaims // the names that differ from base; a zero entry: freed
	}{
		{"claim a free name", claimChange{claim: []string{"free"}}, []string{"free"}, true,
			bucketClaims{"free": {"me", 9}}},
		{"claim a name held here: got, unchanged, its token kept", claimChange{claim: []string{"mine"}}, []string{"mine"}, false, nil},
		{"claim a name an ended session held", claimChange{claim: []string{"ended"}}, []string{"ended"}, true,
			bucketClaims{"ended": {"me", 9}}},
		{"claim a name a live session holds: not got", claimChange{claim: []string{"live"}}, nil, false, nil},
		{"release a name held here", claimChange{release: []string{"mine"}}, nil, true, bucketClaims{"mine": {}}},
		{"release a name held elsewhere: nothing", claimChange{release: []string{"live", "ended", "free"}}, nil, false, nil},
		{"give a name held here (hand-over)", claimChange{give: map[string]string{"mine": "next"}}, nil, true,
			bucketClaims{"mine": {"next", 9}}},
		{"give a name held here in a takeover: nothing", claimChange{give: map[string]string{"mine": "next"}, othersOnly: true}, nil, false, nil},
		{"give a free name", claimChange{give: map[string]string{"free": "next"}}, nil, true,
			bucketClaims{"free": {"next", 9}}},
		{"give an ended session's name (takeover)", claimChange{give: map[string]string{"ended": "next"}}, nil, true,
			bucketClaims{"ended": {"next", 9}}},
		{"give a live session's name: nothing", claimChange{give: map[string]string{"live": "next"}}, nil, false, nil},
		{"give a name to its holder: nothing", claimChange{give: map[string]string{"live": "other"}}, nil, false, nil},
		{"drop holdings by their tokens, whoever holds them", claimChange{drop: map[string]int64{"live": 4, "ended": 5}}, nil, true,
			bucketClaims{"live": {}, "ended": {}}},
		{"drop a holding by another token: nothing", claimChange{drop: map[string]int64{"mine": 2, "live": 5, "free": 0}}, nil, false, nil},
	} {
		t.Run(tc.what, func(t *testing.T) {
			c := base()
			got, changed := c.apply("me", tc.ch, ended, 9)
			if !slices.Equal(got, tc.got) || changed != tc.changed {
				t.Errorf("apply = %v, changed %v; want %v, changed %v", got, changed, tc.got, tc.changed)
			}
			want := base()
			for name, h := range tc.want {
				if h == (entry{}) {
					delete(want, name)
				} else {
					want[name] = h
				}
			}
			if !maps.Equal(c, want) {
				t.Errorf("claims after: %v, want %v", c, want)
			}
		})
	}
}

// A token only grows from one holder of a name to the next: each write
// that changes a holder is made at the bucket's counter plus one, and
// apply gives that token to every entry it writes, never to one it
// keeps.
func TestClaimsTokensGrowPerName(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	c := bucketClaims{}
	last := map[string]int64{}
	sessions := []string{"a", "b", "c", "dead/1"}
	ended := func(s string) bool { return s == "dead/1" }
	transitions := int64(0)
	for range 2000 {
		me := sessions[rng.IntN(len(sessions))]
		name := fmt.Sprint("n", rng.IntN(8))
		var ch claimChange
		switch rng.IntN(3) {
		case 0:
			ch.claim = []string{name}
		case 1:
			ch.release = []string{name}
		default:
			ch.give = map[string]string{name: sessions[rng.IntN(len(sessions))]}
		}
		before := c[name]
		if _, changed := c.apply(me, ch, ended, transitions+1); changed {
			transitions++
		}
		after, held := c[name]
		if held && after != before {
			if after.token <= last[name] {
				t.Fatalf("%s went from %v to %v: its token %d does not exceed the last holder's %d", name, before, after, after.token, last[name])
			}
			last[name] = after.token
		}
	}
}

// Claims come back as they went, whatever bytes the names hold, and the
// same claims always encode alike.
func TestClaimsRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for round := range 50 {
		c := bucketClaims{}
		for range rng.IntN(300) {
			b := make([]byte, rng.IntN(40))
			for i := range b {
				b[i] = byte(rng.IntN(256))
			}
			c[string(b)] = entry{session: fmt.Sprint("r", rng.IntN(5), "/", round), token: rng.Int64N(1 << 40)}
		}
		v, err := encodeClaims(c)
		if err != nil {
			t.Fatal(err)
		}
		back, err := decodeClaims(v)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if !maps.Equal(back, c) {
			t.Fatalf("round %d: %d claims came back as %d, or changed", round, len(c), len(back))
		}
		if again, _ := encodeClaims(back); again != v {
			t.Fatalf("round %d: the same claims encoded differently", round)
		}
	}
	if c, err := decodeClaims(""); err != nil || len(c) != 0 {
		t.Errorf(`decodeClaims("") = %v, %v; want no claims`, c, err)
	}
}

// At 100,000 names of 30 bytes over 256 buckets (the scale the issue
// sets) a bucket's claims take a small part of an annotation; claims that
// cannot fit are refused with errClaimsTooLarge rather than written.
func TestClaimsOfAFullBucketFit(t *testing.T) {
	c := bucketClaims{}
	for i := range 100_000 {
		name := fmt.Sprintf("default/endpoint-%013d", i) // 30 bytes
		if bucketOf(name, 256) == 7 {
			c[name] = entry{session: fmt.Sprintf("replica-%d/0123456789abcdef", i%3), token: int64(i)}
		}
	}
	v, err := encodeClaims(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("bucket 7 of 256: %d names in %d bytes", len(c), len(v))
	if len(v) > maxClaimsBytes/8 {
		t.Errorf("%d names take %d bytes, more than an eighth of the %d allowed", len(c), len(v), maxClaimsBytes)
	}
	huge := bucketClaims{}
	rng := rand.New(rand.NewPCG(5, 6))
	for len(huge) < 20_000 {
		b := make([]byte, 16)
		for i := range b {
			b[i] = byte(rng.IntN(256)) // incompressible
		}
		huge[string(b)] = entry{session: "r", token: 1}
	}
	if _, err := encodeClaims(huge); !errors.Is(err, errClaimsTooLarge) {
		t.Errorf("encoding 20,000 random 16-byte names: %v, want errClaimsTooLarge", err)
	}
}

// A value encodeClaims did not write is refused with errMalformedClaims,
// never a panic or a huge allocation.
func FuzzDecodeClaims(f *testing.F) {
	good, _ := encodeClaims(bucketClaims{"a": {"r/1", 1}, "b": {"s/2", 2}})
	f.Add(good)
	f.Add("")
	f.Add("!!!")
	f.Fuzz(func(t *testing.T, v string) {
		c, err := decodeClaims(v)
		if err != nil {
			if !errors.Is(err, errMalformedClaims) {
				t.Fatalf("decodeClaims: %v, not errMalformedClaims", err)
			}
			return
		}
		again, err := encodeClaims(c)
		if err != nil {
			return // valid, but too large to write again
		}
		back, err := decodeClaims(again)
		if err != nil || !maps.Equal(back, c) {
			t.Fatalf("claims decoded from %q do not survive a round trip: %v", v, err)
		}
	})
}

// A full bucket's claims go through the API server as they are: the
// annotation is accepted, and read back (by another client, from the
// server) it decodes to the same claims.
func TestClaimsSurviveTheAPIServer(t *testing.T) {
	c := needCluster(t)
	applyManifest(t, c)
	leases := c.replica.CoordinationV1().Leases(replicaNamespace)
	claims := bucketClaims{}
	for i := range 100_000 {
		name := fmt.Sprintf("default/endpoint-%013d", i)
		if bucketOf(name, 256) == 3 {
			claims[name] = entry{session: fmt.Sprintf("replica-%d/0123456789abcdef", i%3), token: int64(i)}
		}
	}
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{GenerateName: "claims-"}}
	if err := setClaims(l, claims); err != nil {
		t.Fatal(err)
	}
	created, err := leases.Create(t.Context(), l, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating a bucket with %d claims: %v", len(claims), err)
	}
	t.Cleanup(func() { _ = leases.Delete(context.Background(), created.Name, metav1.DeleteOptions{}) })
	read, err := c.admin.CoordinationV1().Leases(replicaNamespace).Get(t.Context(), created.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	back, err := claimsOf(read)
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(back, claims) {
		t.Errorf("%d claims written, %d read back, or changed", len(claims), len(back))
	}
}
