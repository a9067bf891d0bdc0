package ha

import "testing"

func TestOldestMember(t *testing.T) {
	if got := oldestMember(nil); got != "" {
		t.Errorf("oldestMember with no members = %q", got)
	}
	for _, tc := range []struct {
		members map[string]int64
		want    string
	}{
		{map[string]int64{"a": 5}, "a"},
		{map[string]int64{"a": 9, "b": 3, "c": 7}, "b"},
		{map[string]int64{"b": 3, "a": 3}, "a"}, // a tie goes to the smaller ID
	} {
		if got := oldestMember(tc.members); got != tc.want {
			t.Errorf("oldestMember(%v) = %q, want %q", tc.members, got, tc.want)
		}
	}
}
