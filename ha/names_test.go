package ha

import (
	"crypto/sha256"
	"fmt"
	"maps"
	"slices"
	"testing"
)

// The digest must be the same on every replica of every version sharing a
// prefix: these values are pinned.
func TestNamesDigestIsStable(t *testing.T) {
	var d namesDigest
	if got := d.String(); got != "00000000000000000000000000000000" {
		t.Errorf("empty: %s", got)
	}
	d.add("a")
	d.add("b")
	ab := d.String()
	if ab != "08bb6928ca5517142e4b8118ff058d81" {
		t.Errorf("{a, b}: %s", ab)
	}
	var e namesDigest
	e.add("b")
	e.add("c")
	e.add("a")
	e.remove("c")
	if e.String() != ab {
		t.Errorf("order or removal changes the digest: %s, want %s", e, ab)
	}
}

func TestMemberValue(t *testing.T) {
	for _, tc := range []struct {
		id, value, digest string
		leaving           bool
	}{
		{"r0", memberValue("r0", "ab", false), "ab", false},
		{"r0", memberValue("r0", "ab", true), "ab", true},
		{"r0", "r0", "", false},           // an earlier version
		{"r0", "r0 (leaving)", "", true},  // an earlier version, leaving
		{"r0", "someone else", "", false}, // not its own: nothing known
		{"r0", "r0 names=", "", false},    // no names registered would be 32 zeros
	} {
		d, l := parseMemberValue(tc.id, tc.value)
		if d != tc.digest || l != tc.leaving {
			t.Errorf("parseMemberValue(%q, %q) = %q, %v; want %q, %v", tc.id, tc.value, d, l, tc.digest, tc.leaving)
		}
	}
}

func TestNamesRoundTrip(t *testing.T) {
	for _, n := range []int{0, 1, 3, 200000} {
		names := make([]string, n)
		for i := range names {
			// Hex of a hash: little to compress, so that the set takes
			// several chunks.
			names[i] = fmt.Sprintf("%06d-%x\n/\x00", i, sha256.Sum256([]byte{byte(i), byte(i >> 8), byte(i >> 16)}))
		}
		chunks := encodeNames(names)
		for _, c := range chunks {
			if len(c) > maxChunk {
				t.Fatalf("a chunk of %d bytes", len(c))
			}
		}
		got, err := decodeNames(chunks)
		if err != nil {
			t.Fatal(err)
		}
		if keys := slices.Sorted(maps.Keys(got)); !slices.Equal(keys, names) && !(n == 0 && len(keys) == 0) {
			t.Errorf("%d names: got %d back", n, len(keys))
		}
		if n == 200000 && len(chunks) < 2 {
			t.Errorf("%d names in %d chunk: the test checks too little", n, len(chunks))
		}
	}
	if _, err := decodeNames([][]byte{[]byte("not deflate")}); err == nil {
		t.Error("garbage decoded")
	}
}

func TestChunkKey(t *testing.T) {
	k := keysOf("/svc")
	key := k.chunkKey("r0", "ab", 2, 3)
	if key != "/svc/name-sets/r0/ab/2-of-3" {
		t.Errorf("chunkKey: %s", key)
	}
	id, d, i, n, ok := parseChunkKey(key[len(k.names):])
	if !ok || id != "r0" || d != "ab" || i != 2 || n != 3 {
		t.Errorf("parseChunkKey: %s %s %d %d %v", id, d, i, n, ok)
	}
	for _, bad := range []string{"r0/ab", "r0/ab/3-of-3", "r0/ab/x-of-3", "r0/ab/0-of-0", "r0/ab/1/0-of-1"} {
		if _, _, _, _, ok := parseChunkKey(bad); ok {
			t.Errorf("parseChunkKey(%q) ok", bad)
		}
	}
}

// Owners are chosen among the members known to register a name; a member
// whose names are unknown counts as registering every name.
func TestOwnerAmongRegistering(t *testing.T) {
	r := &Replica{opts: Options{ID: "a"}, members: map[string]int64{"a": 3, "b": 1, "c": 2},
		memberNames: map[string]string{"a": "da", "b": "db", "c": "dc"}, sets: map[string]*nameSet{}}
	names := make([]string, 200)
	for i := range names {
		names[i] = fmt.Sprintf("n%d", i)
	}
	all := []string{"a", "b", "c"}
	for _, name := range names {
		if got, want := r.ownerLocked(name), spreadOwner(name, all); got != want {
			t.Fatalf("%s: owner %s, want %s with no set known", name, got, want)
		}
	}
	if u := r.unconfirmedLocked(); !u["b"] || !u["c"] || u["a"] {
		t.Errorf("unconfirmed: %v", u)
	}
	// b registers the even names only.
	even := map[string]struct{}{}
	for i, name := range names {
		if i%2 == 0 {
			even[name] = struct{}{}
		}
	}
	r.sets["b/db"] = &nameSet{names: even}
	r.place = nil
	for i, name := range names {
		want := spreadOwner(name, all)
		if i%2 == 1 {
			want = spreadOwner(name, []string{"a", "c"})
		}
		if got := r.ownerLocked(name); got != want {
			t.Errorf("%s: owner %s, want %s", name, got, want)
		}
	}
	if u := r.unconfirmedLocked(); u["b"] || !u["c"] {
		t.Errorf("unconfirmed with b's set known: %v", u)
	}
	if n := testing.AllocsPerRun(100, func() { r.ownerLocked("n1") }); n != 0 {
		t.Errorf("ownerLocked allocates %v times a name", n)
	}
	r.opts.Mode, r.place = Leader, nil
	if got := r.ownerLocked("n0"); got != "b" {
		t.Errorf("leader of n0: %s, want b, the oldest", got)
	}
	if got := r.ownerLocked("n1"); got != "c" {
		t.Errorf("leader of n1: %s, want c, the oldest registering it", got)
	}
}
