// Tests of Health's reasons, from a table; a replica's Health through a
// partition and a same-ID replica is tested against etcd, in ha/etcd.

package ha

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// Each state gives its reasons, each wrapping its sentinels, with a text
// that names the replica and quotes the causes without a second "ha: ".
func TestHealthReasons(t *testing.T) {
	dup := errors.New("ha: another live replica has this ID: the member record of r0 held by session 7f")
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
