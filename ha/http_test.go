package ha

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/bgctl/controller"
)

// The page from a fixed Status: the marked names first, unknown cells
// "-", the serving replica starred; marked=1 keeps the marked alone.
func TestPlacementText(t *testing.T) {
	now := time.Date(2026, 1, 2, 15, 4, 5, 0, time.UTC)
	ttl := controller.Duration(2 * time.Second)
	since := now.Add(-5 * time.Second)
	renewed := controller.Duration(8 * time.Second)
	st := Status{Prefix: "/svc", ID: "r0", Mode: "spread", Lease: "694d7f3b2a1c8d04", Fence: controller.Duration(1400 * time.Millisecond),
		Members: []MemberStatus{{ID: "r0", Lease: "694d7f3b2a1c8d04", Revision: 5, TTL: &ttl}, {ID: "r1", Lease: "694d7f3b2a1c8d09", Revision: 7, Renewed: &renewed, NotRenewing: true}},
		Names: []NameStatus{
			{Name: "job-00", Owner: "r0", Holder: "r0", Since: &since, Revision: 12, State: "running"},
			{Name: "job-01", Owner: "r1"},
			{Name: "job-02", Owner: "r1", Holder: "r0", Revision: 9, State: "releasing"},
		}}
	var b strings.Builder
	if err := newPlacementPage(st, errors.New("member \"r1\": reading lease 694d7f3b2a1c8d09:\ndeadline exceeded"), false, now).writeText(&b); err != nil {
		t.Fatal(err)
	}
	want := `Replicas of /svc, seen from r0 (spread, lease 694d7f3b2a1c8d04, fence 1.4s) at 2026-01-02T15:04:05Z
Error: member "r1": reading lease 694d7f3b2a1c8d09: deadline exceeded

Members: 2
Member   Lease              Lease TTL   Renewed                Fence   Key revision
r0 *     694d7f3b2a1c8d04   2s          -                      1.4s    5
r1       694d7f3b2a1c8d09   -           8s ago, not renewing   -       7

Names: 1 held by their owner, 1 without a holder, 1 held by a non-owner
Mark                  Name     Owner   Holder   Held since   Claim revision   Here
no holder             job-01   r1      -        -            -                -
held by a non-owner   job-02   r1      r0       -            9                releasing
ok                    job-00   r0      r0       5s ago       12               running
`
	if b.String() != want {
		t.Errorf("text:\n%s\nwant:\n%s", b.String(), want)
	}

	b.Reset()
	st.Lease = ""
	if err := newPlacementPage(st, nil, true, now).writeText(&b); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(b.String(), "Replicas of /svc, seen from r0 (spread, no lease: joining again) at") ||
		!strings.Contains(b.String(), "Showing the 2 marked\n") || strings.Contains(b.String(), "job-00") {
		t.Errorf("marked only, without a lease:\n%s", b.String())
	}
}

// Status's JSON writes durations as the core's does: strings.
func TestStatusJSONDurations(t *testing.T) {
	ttl := controller.Duration(3 * time.Second)
	b, err := json.Marshal(Status{Fence: controller.Duration(1500 * time.Millisecond), Members: []MemberStatus{{ID: "r0", TTL: &ttl}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"fence":"1.5s"`, `"ttl":"3s"`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("JSON %s has no %s", b, want)
		}
	}
}
