// The store under hostile conditions: a session that ran out while a
// fenced transaction holds its row, a schema being made while a call's
// context ends, a server that stops answering in the middle of a write,
// a write whose client gave up, bad input, and three replicas making the
// schema at once.

package postgres

import (
	"context"
	"strings"
	"testing"
	"time"
)

// Held refuses a nil transaction with an error, rather than a panic.
func TestHeldRefusesANilTransaction(t *testing.T) {
	t.Parallel()
	f := newHeldFixture(t)
	_, _, claims := f.member(t, "r0", 5*time.Second, "x")
	if err := Held(context.Background(), nil, claims["x"]); err == nil || !strings.Contains(err.Error(), "nil") {
		t.Errorf("Held on a nil transaction: %v; want an error naming it", err)
	}
}
