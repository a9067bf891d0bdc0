// The cases of the properties everything else rests on: replicas that
// claim the same names at once each win a name once, a claim within the
// limits a store declares is taken, and a session's readings are short
// of the truth by no more than the store declares.

package hatest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/bgctl/controller/ha"
)

// racers is how many replicas race for the same names in
// conformRacingClaims, and raceNames how many names they race for.
const (
	racers    = 4
	raceNames = 40
)

// Replicas that claim the same names at the same moment each win a name
// once: every name ends up held by exactly one session, the one whose
// claim answered it Mine; every other claimer is answered that it is
// held, by that holder when the store says whom (or that it was free,
// and finds it held when it claims again); and a listing shows each name
// once, under the winner's session. The claimers ask for the names in
// orders of their own, so that on a store of several records their writes
// interleave record by record.
func conformRacingClaims(t *testing.T, st Group) {
	ctx := context.Background()
	type claimer struct {
		id  string
		b   ha.Backend
		s   ha.Session
		got map[string]ha.Claimed // the outcome of each name, by name; written by the claimer's goroutine alone until wg.Wait
		err error
	}
	cs := make([]*claimer, racers)
	for i := range cs {
		id := fmt.Sprintf("r%d", i)
		b, s := beginAs(t, st, id)
		defer func() { _ = b.End(ctx, s.ID) }()
		cs[i] = &claimer{id: id, b: b, s: s, got: map[string]ha.Claimed{}}
	}
	names := make([]string, raceNames)
	for i := range names {
		names[i] = fmt.Sprintf("race-%02d", i)
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, c := range cs {
		// Claimer i asks from name i·raceNames/racers on, wrapping round.
		order := append(append([]string(nil), names[i*raceNames/racers:]...), names[:i*raceNames/racers]...)
		wg.Go(func() {
			<-start
			pending := order
			for round := 0; len(pending) > 0; round++ {
				if round == 10 {
					c.err = fmt.Errorf("%d names still answered free after %d claims: %v", len(pending), round, pending)
					return
				}
				rctx, cancel := request(ctx, c.b)
				got, absent, err := c.b.Claim(rctx, c.s.ID, pending)
				cancel()
				if err != nil {
					c.err = err
					return
				}
				for _, g := range got {
					c.got[g.Name] = g
				}
				pending = absent
			}
		})
	}
	close(start)
	wg.Wait()
	for _, c := range cs {
		if c.err != nil {
			t.Fatalf("the claim of %s: %v", c.id, c.err)
		}
	}
	winner := map[string]*claimer{}
	for _, n := range names {
		for _, c := range cs {
			g, ok := c.got[n]
			switch {
			case !ok:
				t.Errorf("%s's claim answered nothing of %s", c.id, n)
			case g.Mine && winner[n] != nil:
				t.Errorf("%s is held by both %s and %s", n, winner[n].id, c.id)
			case g.Mine:
				winner[n] = c
			}
		}
		if winner[n] == nil {
			t.Errorf("%s is held by none of the %d claimers", n, racers)
		}
	}
	for _, n := range names {
		w := winner[n]
		for _, c := range cs {
			if g := c.got[n]; w != nil && !g.Mine && g.Holder != "" && (g.Holder != w.id || g.Session != w.s.ID) {
				t.Errorf("%s's claim of %s answered it held by %s (session %d); it is %s's (session %d)", c.id, n, g.Holder, g.Session, w.id, w.s.ID)
			}
		}
	}
	records, _, err := cs[0].b.List(ctx)
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	listed := map[string]int{}
	for _, r := range records {
		if r.Kind != ha.ClaimPut {
			continue
		}
		listed[r.Name]++
		if w := winner[r.Name]; w != nil && (r.Member != w.id || r.Session != w.s.ID) {
			t.Errorf("the listing has %s held by %s (session %d); its claim answered %s (session %d)", r.Name, r.Member, r.Session, w.id, w.s.ID)
		}
	}
	for _, n := range names {
		if listed[n] != 1 {
			t.Errorf("the listing has %d holdings of %s, want 1", listed[n], n)
		}
	}
}

// limitProbe caps the names conformClaimLimits claims at once: a store
// may declare tens of thousands.
const limitProbe = 1000

// A claim of as many names as the backend declares it takes in one call
// (ClaimLimits: a count, and bytes by ClaimCost), up to limitProbe, is
// taken whole: it never fails as too many (ErrTooManyOps) or too large
// (ErrTooLarge), and every name comes back held by the session. Twice as
// many (when that is within limitProbe) either are taken, or fail with
// one of those two errors, which tell the caller to halve the batch:
// never with an error it would retry as it is.
func conformClaimLimits(t *testing.T, st Group) {
	ctx := context.Background()
	b, s := beginR0(t, st)
	defer func() { _ = b.End(ctx, s.ID) }()
	maxNames, maxBytes := ha.ClaimLimitsOf(b)
	if maxNames < 1 || maxBytes < 1 {
		t.Fatalf("ClaimLimits = %d names, %d bytes; want a claim of one name at least to fit", maxNames, maxBytes)
	}
	var batch []string
	cost := 0
	for i := 0; len(batch) < min(maxNames, limitProbe); i++ {
		n := fmt.Sprintf("limit-%05d", i)
		if cost+ha.ClaimCostOf(b, n) > maxBytes {
			break
		}
		batch = append(batch, n)
		cost += ha.ClaimCostOf(b, n)
	}
	claim := func(names []string) ([]ha.Claimed, []string, error) {
		rctx, cancel := request(ctx, b)
		defer cancel()
		return b.Claim(rctx, s.ID, names)
	}
	got, absent, err := claim(batch)
	if errors.Is(err, ha.ErrTooManyOps) || errors.Is(err, ha.ErrTooLarge) {
		t.Fatalf("a claim of %d names (%d bytes), within the declared %d names and %d bytes, was refused: %v", len(batch), cost, maxNames, maxBytes, err)
	}
	if err != nil {
		t.Fatalf("a claim of %d names: %v", len(batch), err)
	}
	if len(absent) > 0 {
		more, _, err := claim(absent)
		if err != nil {
			t.Fatalf("a claim of the %d names answered free: %v", len(absent), err)
		}
		got = append(got, more...)
	}
	mine := 0
	for _, g := range got {
		if g.Mine {
			mine++
		}
	}
	if mine != len(batch) {
		t.Errorf("a claim of %d free names within the limits made %d holdings of the session's; want all", len(batch), mine)
	}
	if 2*maxNames > limitProbe {
		return
	}
	var over []string
	for i := range 2 * maxNames {
		over = append(over, fmt.Sprintf("over-%05d", i))
	}
	if _, _, err := claim(over); err != nil && !errors.Is(err, ha.ErrTooManyOps) && !errors.Is(err, ha.ErrTooLarge) {
		t.Errorf("a claim of %d names, twice the declared %d: %v; want it taken, or refused with ErrTooManyOps or ErrTooLarge", len(over), maxNames, err)
	}
}

// A session's readings are short of the truth by no more than the
// backend's Rounding (a second when it does not say: ha.Rounding): each
// reading of a silent session, by its replica (TimeLeft) and by another
// (PeerLeft), put at the moment it was answered, reaches the end of the
// validity its last renewal granted, counted from that renewal's call,
// less at most the rounding. A replica holds a silent member's names
// until its readings' end plus the rounding, so a reading shorter than
// that would let the names start elsewhere before the member's fence.
// The readings start once the reader's feed has delivered a batch after
// the renewal (or TTL/4 passed): a store that reads from its feed (ha/kube)
// is short of a renewal it has not seen yet (ha.Rounding).
func conformReadingsWithinRounding(t *testing.T, st Group) {
	ctx := context.Background()
	a, sa := beginR0(t, st)
	defer func() { _ = a.End(ctx, sa.ID) }()
	reader := st.Backend("r1")
	w := watchGroup(t, reader)
	defer w.stop()
	short := time.Second
	if r, ok := a.(ha.Rounding); ok {
		short = r.Rounding()
	}
	n := w.taken()
	called := time.Now()
	valid, err := a.Renew(ctx, sa.ID)
	if err != nil {
		t.Fatalf("renew: %v", err)
	}
	until := called.Add(valid)
	w.next(n, TTL/4)
	read := func(who string, f func(context.Context, ha.SessionID) (time.Duration, time.Duration, error)) {
		t.Helper()
		left, _, err := f(ctx, sa.ID)
		answered := time.Now()
		if err != nil {
			t.Fatalf("%s %v after the renewal: %v", who, answered.Sub(called), err)
		}
		if end := answered.Add(left + short); end.Before(until) {
			t.Errorf("%s %v after the renewal answered %v left: the session's end %v before its validity ran out, beyond the rounding %v", who, answered.Sub(called).Round(time.Millisecond), left, until.Sub(end), short)
		}
	}
	for time.Until(until) > TTL/8 {
		read("timeLeft", a.TimeLeft)
		read("peerLeft", reader.PeerLeft)
		time.Sleep(TTL / 8)
	}
}

// requestTimeout bounds the cases' requests on a backend that does not
// bound them itself (ha.Requester).
const requestTimeout = 5 * time.Second

// request returns the context of one request on b, as a Replica makes
// it: b's own (ha.Requester), or bounded by requestTimeout.
func request(parent context.Context, b ha.Backend) (context.Context, context.CancelFunc) {
	if rq, ok := b.(ha.Requester); ok {
		return rq.Request(parent)
	}
	return context.WithTimeout(parent, requestTimeout)
}

// A store that has forgotten the history before a position (Compact:
// etcd's compaction, a pruned change log) says so, never guesses: HeldAt
// of an earlier position fails, and a feed still behind that position
// fails (one batch with its error, nothing after), where a replica lists
// the group again and starts a new feed from the listing, which then
// delivers the changes after it. A feed that stood at the current
// position goes on delivering.
func conformLostHistory(t *testing.T, st Group) {
	if st.Compact == nil {
		t.Skip("the Group offers no Compact hook: a store that keeps no history has none to lose")
	}
	ctx := context.Background()
	a, sa := beginR0(t, st)
	defer func() { _ = a.End(ctx, sa.ID) }()
	got, _, err := a.Claim(ctx, sa.ID, []string{"x"})
	if err != nil || len(got) != 1 || !got[0].Mine {
		t.Fatalf("claim of x = %+v, %v", got, err)
	}
	_, behind, err := a.List(ctx)
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	if err := a.Release(ctx, ha.Claim{Name: "x", Revision: got[0].Revision}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.Claim(ctx, sa.ID, []string{"y"}); err != nil {
		t.Fatal(err)
	}
	caught := watchGroup(t, a) // at the current position: caught up
	defer caught.stop()
	st.Compact()
	if h, ok := a.(ha.HistoryReader); ok {
		if names, err := h.HeldAt(ctx, sa.JoinedAt); err == nil {
			t.Errorf("heldAt(%d), a position before the compaction = %v; want an error", sa.JoinedAt, names)
		}
	}
	var wg sync.WaitGroup
	f := a.Watch(behind, &wg)
	select {
	case b := <-f.Batches():
		if b.Err == nil {
			t.Errorf("a feed from position %d, before the compaction, delivered %+v; want its failure", behind, b)
		}
	case <-time.After(5 * TTL):
		t.Errorf("a feed from position %d, before the compaction, delivered nothing in %v; want its failure", behind, 5*TTL)
	}
	f.Stop()
	wg.Wait()
	relisted := watchGroup(t, a)
	defer relisted.stop()
	if _, _, err := a.Claim(ctx, sa.ID, []string{"z"}); err != nil {
		t.Fatal(err)
	}
	relisted.await(t, "z held, after the relist", func(c ha.Change) bool { return c.Kind == ha.ClaimPut && c.Name == "z" })
	caught.await(t, "z held, on the feed that was caught up at the compaction", func(c ha.Change) bool { return c.Kind == ha.ClaimPut && c.Name == "z" })
}

// A feed owes progress: on a group where nothing changes but a member's
// renewals (the case renews a session every quarter of Window, as a
// replica does), another replica's feed delivers a batch, progress alone
// if nothing else, more often than Window (BackendConfig.Window, TTL −
// TTL/4 in the cases), for a Replica whose feed is silent that long
// reports ErrWatchStalled from Health.
func conformFeedProgress(t *testing.T, st Group) {
	ctx := context.Background()
	window := TTL - TTL/4
	a, sa := beginR0(t, st)
	defer func() { _ = a.End(ctx, sa.ID) }()
	reader := st.Backend("r1")
	_, from, err := reader.List(ctx)
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	var wg sync.WaitGroup
	f := reader.Watch(from, &wg)
	defer wg.Wait()
	defer f.Stop()
	last, end := time.Now(), time.Now().Add(3*window)
	renew := time.NewTicker(window / 4)
	defer renew.Stop()
	for time.Now().Before(end) {
		select {
		case b := <-f.Batches():
			if b.Err != nil {
				t.Fatalf("the feed of an idle group failed: %v", b.Err)
			}
			if gap := time.Since(last); gap >= window {
				t.Errorf("the feed delivered nothing for %v, a Window (%v) or more", gap, window)
			}
			last = time.Now()
		case <-renew.C:
			if _, err := a.Renew(ctx, sa.ID); err != nil {
				t.Fatalf("renew: %v", err)
			}
		case <-time.After(time.Until(last.Add(window))): // a Window since the last batch
			t.Fatalf("the feed delivered nothing for %v, a Window or more, on a group whose only change is a member's renewals", time.Since(last))
		}
	}
}
