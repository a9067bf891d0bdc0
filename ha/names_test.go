package ha

import (
	"fmt"
	"testing"

	"github.com/bgctl/controller/ha/internal/place"
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
		if got, want := r.ownerLocked(name), place.Owner(name, all); got != want {
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
		want := place.Owner(name, all)
		if i%2 == 1 {
			want = place.Owner(name, []string{"a", "c"})
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
