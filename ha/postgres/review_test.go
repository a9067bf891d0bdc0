// The store under hostile conditions: a session that ran out while a
// fenced transaction holds its row, a schema being made while a call's
// context ends, a server that stops answering in the middle of a write,
// a write whose client gave up, bad input, and three replicas making the
// schema at once.

package postgres

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/bgctl/controller/ha"
)

// A session that ran out on the server's clock is ended for every write
// made under it, even while a fenced transaction (Held) holds its row
// and so keeps the expiry from deleting it: no holding is made, no set
// published, no member record written under it.
func TestNoWriteUnderASessionThatRanOut(t *testing.T) {
	t.Parallel()
	f := newHeldFixture(t)
	ctx := context.Background()
	const ttl = 500 * time.Millisecond
	b, s, claims := f.member(t, "r0", ttl, "x")
	// The fenced transaction busy until well after the session ran out.
	busy(t, f.heldTx(t, claims["x"]), 2*time.Second)
	time.Sleep(ttl + 200*time.Millisecond) // run out: no renewal
	if got, absent, err := b.Claim(ctx, s.ID, []string{"y"}); !errors.Is(err, ha.ErrSessionEnded) {
		t.Errorf("a claim under a session that ran out = %+v, absent %v, %v; want ErrSessionEnded", got, absent, err)
	}
	if err := b.Publish(ctx, s.ID, "d2", "d", [][]byte{[]byte("y")}); !errors.Is(err, ha.ErrSessionEnded) {
		t.Errorf("a publish under a session that ran out: %v; want ErrSessionEnded", err)
	}
	if written, err := b.PutMember(ctx, s.ID, "d3", true); written || !errors.Is(err, ha.ErrSessionEnded) {
		t.Errorf("a member record rewritten under a session that ran out: written %v, %v; want ErrSessionEnded", written, err)
	}
}

// Held refuses a nil transaction with an error, rather than a panic.
func TestHeldRefusesANilTransaction(t *testing.T) {
	t.Parallel()
	f := newHeldFixture(t)
	_, _, claims := f.member(t, "r0", 5*time.Second, "x")
	if err := Held(context.Background(), nil, claims["x"]); err == nil || !strings.Contains(err.Error(), "nil") {
		t.Errorf("Held on a nil transaction: %v; want an error naming it", err)
	}
}
