package kube

import (
	"errors"
	"testing"

	"github.com/bgctl/controller/ha"
)

// The feed's changes reach ha as the same kinds: seamKind's values are
// ha's ChangeKind's, one for one.
func TestSeamKindsAreHas(t *testing.T) {
	for k, want := range map[seamKind]ha.ChangeKind{
		memberPut: ha.MemberPut, memberGone: ha.MemberGone, claimPut: ha.ClaimPut,
		claimGone: ha.ClaimGone, chunkPut: ha.ChunkPut, chunkGone: ha.ChunkGone,
	} {
		if got := haChanges([]seamChange{{kind: k}})[0].Kind; got != want {
			t.Errorf("seamKind %d reaches ha as %d, want %d", k, got, want)
		}
	}
}

// The backend's errors reach ha as the sentinels ha acts on: an ended or
// lost session ends the epoch, a live session of the same ID refuses the
// join, a full bucket halves the batch.
func TestSeamErrorsWrapHasSentinels(t *testing.T) {
	for _, tc := range []struct {
		err, want error
	}{
		{errSessionEnded, ha.ErrSessionEnded},
		{errSessionLost, ha.ErrSessionEnded},
		{errDuplicateSession, ha.ErrDuplicateID},
		{errClaimsTooLarge, ha.ErrTooLarge},
		{errTooLarge, ha.ErrTooLarge},
	} {
		if got := seamErr(tc.err); !errors.Is(got, tc.want) || !errors.Is(got, tc.err) {
			t.Errorf("seamErr(%v) = %v, want it to wrap %v and the cause", tc.err, got, tc.want)
		}
	}
	other := errors.New("a timeout")
	if got := seamErr(other); got != other {
		t.Errorf("seamErr(%v) = %v, want it unchanged", other, got)
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
