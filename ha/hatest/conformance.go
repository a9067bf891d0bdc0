// The contract's cases, the Group a store runs each on, and their helpers.

package hatest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bgctl/controller/ha"
)

// TTL is the sessions' TTL in the cases: whole seconds, as Options.TTL
// must be, and short, so that a case that waits for an end waits little
// (on etcd it is the shortest its default election timeout allows).
const TTL = 2 * time.Second

// Group is one fresh group on the store under test, filled by the test
// that runs a case (see the package documentation for one). Backend
// returns the backend of a replica with that ID, and is required; the
// harness makes it with the BackendConfig a Replica would give at TTL:
// ID id, TTL, Window TTL − TTL/4, RenewEvery a quarter of that, a
// RequestTimeout longer than the 1.2s by which SlowBegin's case holds an
// answer back (2s, as this repository's stores use), and a non-nil
// Logger and Stopping, as a Replica always gives. SlowBegin and LoseBegin are
// fault hooks a store offers the suite, optional as a store's
// capabilities are: without SlowBegin its case reads the validity of an
// answer that came at once; without LoseBegin its case is skipped,
// saying so.
type Group struct {
	Backend func(id string) ha.Backend
	// Slack is how much later than the TTL a session may end, and how
	// much short of the TTL a renewal's valid and a fresh reading's
	// left (TimeLeft, PeerLeft) may answer: a second on etcd, which
	// truncates remaining TTLs to whole seconds and checks expiry every
	// 500ms; on Kubernetes what another replica's observer takes to
	// prove it (it looks every TTL/8, then reads and deletes); none in
	// memory. On a store that carries expiry out itself: at least the
	// longest between a validity running out and the end being carried
	// out (its polling period), plus a request's round trip.
	Slack time.Duration
	// Early is how long before a validity runs out a case reads that
	// the session still lives: what the reading may take to arrive.
	// 300ms on etcd and Kubernetes; a nanosecond in memory, where a
	// reading takes no time; on a store of your own, its longest round
	// trip.
	Early time.Duration
	// NoHistory says the store keeps no earlier state of the group: its
	// backend is no ha.HistoryReader, or HeldAt answers an error for
	// every position (the Kubernetes API
	// server, whose lists at an earlier resourceVersion are served, if
	// at all, from a cache of recent changes). False on etcd and in
	// memory, which answer it until a compaction.
	NoHistory bool
	// SlowBegin holds the answer to the next Begin of any replica of
	// the group back by d, the session started meanwhile: on etcd, the
	// answer to its grant; on Kubernetes, to the create of its member
	// Lease. The Begin then answers as late as d, or fails when its
	// context ends first.
	SlowBegin func(d time.Duration)
	// NewReplica makes replica id of the group on the store under
	// test, with o (the case sets TTL, Margin, Settle and Logger; the
	// harness sets Prefix, ID to id, and whatever its store needs; zero
	// fields take their defaults), not joined: for the case
	// of whole replicas, which is skipped, saying so, without it. The
	// case closes every replica it made.
	NewReplica func(id string, o ha.Options) (*ha.Replica, error)
	// EndEarly ends the session of NewReplica's replica id before its
	// validity ran out, as a store or an operator may (etcd: a revoke
	// of its lease; Kubernetes: its member Lease deleted by hand). Nil:
	// the case of whole replicas leaves the early end out.
	EndEarly func(id string)
	// Compact has the store forget the group's history before its
	// current position, as etcd's compaction or a pruned change log
	// does; nil on a store that keeps no history to lose (NoHistory) or
	// offers no such hook, whose case is then skipped, saying so.
	Compact func()
	// LoseBegin loses the answer to the next Begin of any replica of
	// the group, whose requests the store carried out: on etcd, the
	// answer to its member record's write; on Kubernetes, to the create
	// of its member Lease. The Begin must then fail and leave no member
	// record under a live session (see ha.Backend's Begin).
	LoseBegin func()
}

// A Case is one clause of the contract.
type Case struct {
	Name string                      // for t.Run: what the store must do, in CamelCase
	Test func(t *testing.T, g Group) // runs the clause on g, a group no other case uses
}

// Cases returns the contract, one case each. A store runs each in a
// group of its own, in parallel or not.
func Cases() []Case { return slices.Clone(cases) }

var cases = []Case{
	{"RacingClaimersEachWinANameOnce", conformRacingClaims},
	{"ClaimWithinTheDeclaredLimitsIsTaken", conformClaimLimits},
	{"ReadingsAreShortByNoMoreThanTheRounding", conformReadingsWithinRounding},
	{"LostHistoryFailsHeldAtAndTheFeedThatNeedsIt", conformLostHistory},
	{"WholeReplicasSurviveAnEarlyEndALeaveAndACrash", conformWholeReplicas},
	{"AFeedOwesProgressMoreOftenThanTheWindow", conformFeedProgress},
	{"BeginRenewEnd", conformBeginRenewEnd},
	{"DuplicateIDRefusedWhileLive", conformDuplicateID},
	{"BeginMovesTheRecordFromPrevOnly", conformMoveFromPrev},
	{"UnrenewedSessionEnds", conformExpiry},
	{"RenewalKeepsTheSession", conformRenewalKeeps},
	{"MemberRecordWrittenOnlyUnderItsSession", conformMemberRecord},
	{"ClaimTakesFreeNamesAtOnce", conformClaimFree},
	{"ClaimOfHeldNamesReadsThem", conformClaimHeld},
	{"ClaimsGoWithTheirSession", conformClaimsGoWithSession},
	{"ReleaseEndsOnlyThatHolding", conformRelease},
	{"SessionLivesWhatItWasGranted", conformValidity},
	{"SessionsOfOneReplicaAreApart", conformSessionsApart},
	{"BeginWhoseAnswerIsLostLeavesNoSession", conformLostBegin},
	{"PublishedSetReadsBackUntilWithdrawn", conformPublish},
	{"ListingHoldsTheGroupAtOnePosition", conformList},
	{"AnotherMembersSessionIsRead", conformPeerLeft},
	{"FeedDeliversChangesAndASessionsEndInOneBatch", conformFeed},
	{"RestartWaitsForTheEarlierRunsSilentSession", conformRestartSilent},
	{"RestartNeverEndsARenewedSession", conformRestartRenewed},
}

// beginR0 begins a session of replica r0, or fails the test.
func beginR0(t *testing.T, st Group) (ha.Backend, ha.Session) {
	t.Helper()
	return beginAs(t, st, "r0")
}

// beginAs begins a session of replica id, or fails the test.
func beginAs(t *testing.T, st Group, id string) (ha.Backend, ha.Session) {
	t.Helper()
	b := st.Backend(id)
	s, err := b.Begin(context.Background(), 0, TTL, "digest")
	if err != nil {
		t.Fatalf("begin: %v", err)
	}
	return b, s
}

// A session begins valid from a moment taken before its request, is
// renewed for its TTL, is the member record's, and once ended is known
// to be: renew, end and timeLeft say errSessionEnded, and the record is
// gone.
func conformBeginRenewEnd(t *testing.T, st Group) {
	ctx := context.Background()
	b := st.Backend("r0")
	before := time.Now()
	s, err := b.Begin(ctx, 0, TTL, "digest")
	if err != nil {
		t.Fatalf("begin: %v", err)
	}
	if s.ID == 0 || s.Sent.Before(before) || s.Sent.After(time.Now()) {
		t.Errorf("begin = %+v: want a session ID, sent between the call and its return", s)
	}
	if id, found, err := b.MemberSession(ctx); err != nil || !found || id != s.ID {
		t.Errorf("memberSession = %d, %v, %v; want %d, true", id, found, err, s.ID)
	}
	valid, err := b.Renew(ctx, s.ID)
	if err != nil || valid > TTL || valid < TTL-st.Slack {
		t.Errorf("renew = %v, %v; want the TTL %v (less at most %v)", valid, err, TTL, st.Slack)
	}
	left, granted, err := b.TimeLeft(ctx, s.ID)
	if err != nil || granted != TTL || left > granted || left < TTL-st.Slack {
		t.Errorf("timeLeft = %v of %v, %v; want about %v of %v", left, granted, err, TTL, TTL)
	}
	if err := b.End(ctx, s.ID); err != nil {
		t.Fatalf("end: %v", err)
	}
	if _, err := b.Renew(ctx, s.ID); !errors.Is(err, ha.ErrSessionEnded) {
		t.Errorf("renew after end: %v, want errSessionEnded", err)
	}
	if err := b.End(ctx, s.ID); !errors.Is(err, ha.ErrSessionEnded) {
		t.Errorf("end after end: %v, want errSessionEnded", err)
	}
	if _, _, err := b.TimeLeft(ctx, s.ID); !errors.Is(err, ha.ErrSessionEnded) {
		t.Errorf("timeLeft after end: %v, want errSessionEnded", err)
	}
	if id, found, err := b.MemberSession(ctx); err != nil || found {
		t.Errorf("memberSession after end = %d, %v, %v; want none", id, found, err)
	}
}

// A second replica with the same ID cannot begin while the first's
// session lives (ErrDuplicateID, and the first keeps its record); it can
// once that session ended.
func conformDuplicateID(t *testing.T, st Group) {
	ctx := context.Background()
	first, second := st.Backend("r0"), st.Backend("r0")
	s, err := first.Begin(ctx, 0, TTL, "digest")
	if err != nil {
		t.Fatalf("begin: %v", err)
	}
	if _, err := second.Begin(ctx, 0, TTL, "digest"); !errors.Is(err, ha.ErrDuplicateID) {
		t.Fatalf("a second begin of r0: %v, want ErrDuplicateID", err)
	}
	if id, found, _ := first.MemberSession(ctx); !found || id != s.ID {
		t.Errorf("after the refused begin the record is under %d (found %v), want %d", id, found, s.ID)
	}
	if _, err := first.Renew(ctx, s.ID); err != nil {
		t.Errorf("the first session after the refused begin: %v", err)
	}
	if err := first.End(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	s2, err := second.Begin(ctx, 0, TTL, "digest")
	if err != nil {
		t.Fatalf("begin after the first session ended: %v", err)
	}
	_ = second.End(ctx, s2.ID)
}

// begin with prev moves the member record from prev to the new session,
// but only while it is under prev: a record under another session
// refuses it.
func conformMoveFromPrev(t *testing.T, st Group) {
	ctx := context.Background()
	b, s1 := beginR0(t, st)
	s2, err := b.Begin(ctx, s1.ID, TTL, "digest")
	if err != nil {
		t.Fatalf("begin from the previous session: %v", err)
	}
	if s2.ID == s1.ID {
		t.Fatalf("begin from %d returned the same session", s1.ID)
	}
	if id, found, _ := b.MemberSession(ctx); !found || id != s2.ID {
		t.Errorf("the record is under %d (found %v), want the new session %d", id, found, s2.ID)
	}
	if _, err := b.Begin(ctx, s1.ID, TTL, "digest"); !errors.Is(err, ha.ErrDuplicateID) {
		t.Errorf("begin from %d while the record is under %d: %v, want ErrDuplicateID", s1.ID, s2.ID, err)
	}
	_ = b.End(ctx, s1.ID)
	_ = b.End(ctx, s2.ID)
}

// A session nobody renews ends within its TTL (and the store's slack),
// and its member record and holdings go with it: another replica with its
// ID may begin, and a replica that watches the group sees the holdings
// go and may claim the names then. The claim follows the feed, as a
// replica's does: on Kubernetes a replica takes a name of an ended
// session only once its own observer counts the session ended, by what
// its feed showed it, and its feed delivers the end at that moment; a
// replica that never saw the session waits a TTL from its first look.
func conformExpiry(t *testing.T, st Group) {
	ctx := context.Background()
	b, s := beginR0(t, st)
	if got, _, err := b.Claim(ctx, s.ID, []string{"x"}); err != nil || len(got) != 1 || !got[0].Mine {
		t.Fatalf("claim of x = %+v, %v", got, err)
	}
	o := st.Backend("r1")
	w := watchGroup(t, o)
	defer w.stop()
	time.Sleep(TTL + st.Slack)
	if _, err := b.Renew(ctx, s.ID); !errors.Is(err, ha.ErrSessionEnded) {
		t.Errorf("renew %v after begin, unrenewed: %v, want errSessionEnded", TTL+st.Slack, err)
	}
	if _, found, err := b.MemberSession(ctx); err != nil || found {
		t.Errorf("the member record of an expired session: found %v, %v", found, err)
	}
	s2, err := st.Backend("r0").Begin(ctx, 0, TTL, "digest")
	if err != nil {
		t.Fatalf("begin after the session expired: %v", err)
	}
	defer func() { _ = b.End(ctx, s2.ID) }()
	w.await(t, "the expired session's holding of x gone", func(c ha.Change) bool { return c.Kind == ha.ClaimGone && c.Name == "x" })
	so, err := o.Begin(ctx, 0, TTL, "digest")
	if err != nil {
		t.Fatalf("begin r1: %v", err)
	}
	defer func() { _ = o.End(ctx, so.ID) }()
	if got, _, err := o.Claim(ctx, so.ID, []string{"x"}); err != nil || len(got) != 1 || !got[0].Mine {
		t.Errorf("claim of the expired session's x by r1, once its feed delivered x gone = %+v, %v; want ours", got, err)
	}
}

// watching is a feed of one replica's backend, started at a listing as a
// replica starts its own, whose batches a goroutine of its own (take)
// takes in as they come, as a replica's loop does: what that replica
// knows of the group.
type watching struct {
	f    ha.Feed
	wg   sync.WaitGroup // the feed's goroutines and take: joined by stop
	done chan struct{}  // closed by stop: take returns
	more chan struct{}  // capacity 1: take signals each batch it took in
	mu   sync.Mutex
	seen []ha.Change // guarded by mu: every change delivered, in order
	err  error       // guarded by mu: the feed's failure, if it failed
	n    int         // guarded by mu: how many batches take took in
}

// taken returns how many batches the feed has delivered.
func (w *watching) taken() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n
}

// next waits until the feed has delivered a batch past the first n, or
// for limit.
func (w *watching) next(n int, limit time.Duration) {
	t := time.NewTimer(limit)
	defer t.Stop()
	for w.taken() <= n {
		select {
		case <-w.more:
		case <-t.C:
			return
		}
	}
}

// watchGroup lists the group through b and starts b's feed from the
// listing's position; stop ends it.
func watchGroup(t *testing.T, b ha.Backend) *watching {
	t.Helper()
	_, from, err := b.List(context.Background())
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	w := &watching{done: make(chan struct{}), more: make(chan struct{}, 1)}
	w.f = b.Watch(from, &w.wg)
	w.wg.Go(w.take)
	return w
}

// take takes in the feed's batches until the feed fails or stop.
func (w *watching) take() {
	for {
		var fb ha.FeedBatch
		select {
		case fb = <-w.f.Batches():
		case <-w.done:
			return
		}
		w.mu.Lock()
		w.seen = append(w.seen, fb.Changes...)
		w.err = fb.Err
		w.n++
		w.mu.Unlock()
		select {
		case w.more <- struct{}{}:
		default:
		}
		if fb.Err != nil {
			return
		}
	}
}

// await waits until the feed has delivered a change that match accepts,
// or fails the test when it failed or 5 TTLs passed first.
func (w *watching) await(t *testing.T, what string, match func(ha.Change) bool) {
	t.Helper()
	timeout := time.After(5 * TTL)
	for {
		w.mu.Lock()
		found, err := slices.ContainsFunc(w.seen, match), w.err
		w.mu.Unlock()
		switch {
		case found:
			return
		case err != nil:
			t.Fatalf("the feed failed before it delivered %s: %v", what, err)
		}
		select {
		case <-w.more:
		case <-timeout:
			t.Fatalf("the feed did not deliver %s in %v", what, 5*TTL)
		}
	}
}

// stop ends the feed and take, and waits for their goroutines.
func (w *watching) stop() {
	close(w.done)
	w.f.Stop()
	w.wg.Wait()
}

// alive reports whether session id of b's replica still holds the member
// record, without renewing it.
func alive(t *testing.T, b ha.Backend, id ha.SessionID) bool {
	t.Helper()
	under, found, err := b.MemberSession(context.Background())
	if err != nil {
		t.Fatalf("memberSession: %v", err)
	}
	return found && under == id
}

// A session lives at least what begin and renew granted, counted from
// the moment the fence counts from (begin's sent, the call of renew):
// read just before that runs out, its member record is still there.
func conformValidity(t *testing.T, st Group) {
	ctx := context.Background()
	// Its answer held back well past what early allows, so that a sent
	// taken after the session started shows.
	if st.SlowBegin != nil {
		st.SlowBegin(1200 * time.Millisecond)
	}
	b, s := beginR0(t, st)
	defer func() { _ = b.End(ctx, s.ID) }()
	time.Sleep(time.Until(s.Sent.Add(TTL - st.Early)))
	if !alive(t, b, s.ID) {
		t.Fatalf("the session ended before sent + TTL − %v", st.Early)
	}
	called := time.Now()
	valid, err := b.Renew(ctx, s.ID)
	if err != nil {
		t.Fatalf("renew: %v", err)
	}
	time.Sleep(time.Until(called.Add(valid - st.Early)))
	if !alive(t, b, s.ID) {
		t.Errorf("the session ended before renew's call + valid (%v) − %v", valid, st.Early)
	}
}

// A begin that fails leaves no session, even when the store carried out
// its requests and only the answer was lost: nothing refuses the next
// begin of the replica's ID.
func conformLostBegin(t *testing.T, st Group) {
	ctx := context.Background()
	b := st.Backend("r0")
	if st.LoseBegin == nil {
		t.Skip("the Group offers no LoseBegin hook: a begin whose answer is lost is not tested")
	}
	st.LoseBegin()
	if s, err := b.Begin(ctx, 0, TTL, "digest"); err == nil {
		_ = b.End(ctx, s.ID)
		t.Fatal("a begin whose answer was lost returned no error")
	}
	if under, found, err := b.MemberSession(ctx); err != nil || found {
		t.Errorf("after a failed begin the member record is under %d (found %v, %v), want none", under, found, err)
	}
	s, err := b.Begin(ctx, 0, TTL, "digest")
	if err != nil {
		t.Fatalf("begin after a failed one: %v", err)
	}
	_ = b.End(ctx, s.ID)
}

// Two sessions of one replica (an epoch and the next) are apart: a name
// the earlier holds is never found the later's holding, and ending the
// earlier leaves the member record moved to the later and the later's
// holdings alone. The earlier may end as the later begins from it: on
// Kubernetes the member record is the session's Lease, and begin ends
// prev to move it (its holdings go with it at once, and End then says
// ErrSessionEnded); the later then claims the name anew, at a later
// position. On etcd and in memory it lives on until End, its holdings
// with it.
func conformSessionsApart(t *testing.T, st Group) {
	ctx := context.Background()
	b, s1 := beginR0(t, st)
	defer func() { _ = b.End(ctx, s1.ID) }()
	held, _, err := b.Claim(ctx, s1.ID, []string{"x"})
	if err != nil || len(held) != 1 || !held[0].Mine {
		t.Fatalf("claim of x under s1 = %+v, %v", held, err)
	}
	s2, err := b.Begin(ctx, s1.ID, TTL, "digest")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = b.End(ctx, s2.ID) }()
	got, absent, err := b.Claim(ctx, s2.ID, []string{"x", "y"})
	x := claimedBy(got)["x"]
	heldByS1 := !x.Mine && x.Holder != "" && x.Session == s1.ID
	if err != nil || !(heldByS1 || x.Mine && x.Revision > held[0].Revision) {
		t.Errorf("claim of x under s2 after s1 held it at %d = %+v , %v; want held by s1, or claimed anew later", held[0].Revision, got, err)
	}
	if len(absent) > 0 {
		got, _, err = b.Claim(ctx, s2.ID, absent)
	}
	if y := claimedBy(got)["y"]; err != nil || !y.Mine {
		t.Fatalf("claim of y under s2 = %+v, %v", got, err)
	}
	if err := b.End(ctx, s1.ID); err != nil && !errors.Is(err, ha.ErrSessionEnded) {
		t.Fatal(err)
	}
	if !alive(t, b, s2.ID) {
		t.Errorf("ending s1 took the member record moved to s2")
	}
	o, so := beginAs(t, st, "r1")
	defer func() { _ = o.End(ctx, so.ID) }()
	got, _, err = o.Claim(ctx, so.ID, []string{"x", "y"})
	y := claimedBy(got)["y"]
	if err != nil || y.Mine || y.Holder == "" || y.Session != s2.ID {
		t.Errorf("claim of y by r1 after s1 ended = %+v , %v; want still s2's", got, err)
	}
}

// A session renewed more often than its TTL outlives it several times
// over.
func conformRenewalKeeps(t *testing.T, st Group) {
	ctx := context.Background()
	b, s := beginR0(t, st)
	for range 6 {
		time.Sleep(TTL / 2)
		if _, err := b.Renew(ctx, s.ID); err != nil {
			t.Fatalf("renew every half TTL: %v", err)
		}
	}
	if id, found, _ := b.MemberSession(ctx); !found || id != s.ID {
		t.Errorf("after 3 TTLs of renewals the record is under %d (found %v), want %d", id, found, s.ID)
	}
	_ = b.End(ctx, s.ID)
}

// putMember rewrites the record only while it is under the session
// named; ensureMember leaves a record that is there as it is and says
// whose it is, and writes none under a session that ended.
func conformMemberRecord(t *testing.T, st Group) {
	ctx := context.Background()
	b, s1 := beginR0(t, st)
	if ok, err := b.PutMember(ctx, s1.ID, "other", true); err != nil || !ok {
		t.Errorf("putMember under its own session = %v, %v; want written", ok, err)
	}
	s2, err := b.Begin(ctx, s1.ID, TTL, "digest") // the record moves to s2
	if err != nil {
		t.Fatal(err)
	}
	// s1 may have ended with the move (Kubernetes: the record is its
	// Lease): errSessionEnded then.
	if ok, err := b.PutMember(ctx, s1.ID, "stale", false); ok || (err != nil && !errors.Is(err, ha.ErrSessionEnded)) {
		t.Errorf("putMember under the session the record left = %v, %v; want not written", ok, err)
	}
	if under, found, err := b.EnsureMember(ctx, s1.ID, "stale"); err != nil || !found || under != s2.ID {
		t.Errorf("ensureMember from the old session = %d, %v, %v; want the record left under %d", under, found, err, s2.ID)
	}
	if under, found, err := b.EnsureMember(ctx, s2.ID, "digest"); err != nil || !found || under != s2.ID {
		t.Errorf("ensureMember under its session = %d, %v, %v; want %d", under, found, err, s2.ID)
	}
	if err := b.End(ctx, s1.ID); err != nil && !errors.Is(err, ha.ErrSessionEnded) {
		t.Fatal(err)
	}
	// etcd reads the record without looking at the session; a store
	// may also say errSessionEnded.
	if under, found, err := b.EnsureMember(ctx, s1.ID, "stale"); !errors.Is(err, ha.ErrSessionEnded) && (err != nil || !found || under != s2.ID) {
		t.Errorf("ensureMember under the ended s1 = %d, %v, %v; want the record under %d, or errSessionEnded", under, found, err, s2.ID)
	}
	_ = b.End(ctx, s2.ID)
	// etcd's compare fails before the put names the lease: not written,
	// no error. A store may also say errSessionEnded.
	if ok, err := b.PutMember(ctx, s2.ID, "digest", false); ok || (err != nil && !errors.Is(err, ha.ErrSessionEnded)) {
		t.Errorf("putMember under an ended session = %v, %v; want not written", ok, err)
	}
	// A record written under an ended session would outlive it, and
	// refuse every later begin of the ID.
	if under, found, err := b.EnsureMember(ctx, s2.ID, "digest"); !errors.Is(err, ha.ErrSessionEnded) {
		t.Errorf("ensureMember under an ended session = %d, %v, %v; want errSessionEnded", under, found, err)
	}
	if under, found, err := b.MemberSession(ctx); err != nil || found {
		t.Errorf("after ensureMember under an ended session the record is under %d (found %v, %v), want none", under, found, err)
	}
}

// claimedBy returns the outcomes in got by name.
func claimedBy(got []ha.Claimed) map[string]ha.Claimed {
	m := map[string]ha.Claimed{}
	for _, c := range got {
		m[c.Name] = c
	}
	return m
}

// Free names are all claimed in one request, at one revision; claiming
// them again (an answer lost) finds them this session's, at that
// revision.
func conformClaimFree(t *testing.T, st Group) {
	ctx := context.Background()
	b, s := beginR0(t, st)
	defer func() { _ = b.End(ctx, s.ID) }()
	got, absent, err := b.Claim(ctx, s.ID, []string{"a", "b", "c"})
	if err != nil || len(absent) != 0 || len(got) != 3 {
		t.Fatalf("claim of three free names = %v, absent %v, %v", got, absent, err)
	}
	rev := got[0].Revision
	for _, c := range got {
		if !c.Mine || c.Revision != rev || c.Revision == 0 {
			t.Errorf("claim of free names: %+v, want ours at one revision (%d)", c, rev)
		}
	}
	again, absent, err := b.Claim(ctx, s.ID, []string{"a", "b", "c"})
	if err != nil || len(absent) != 0 {
		t.Fatalf("claim again = %v, absent %v, %v", again, absent, err)
	}
	for _, c := range again {
		if !c.Mine || c.Revision != rev {
			t.Errorf("claim again: %+v, want found ours at revision %d", c, rev)
		}
	}
}

// When some of the names are held, each held name is reported with its
// holder, and each free one is claimed, or named to claim again: etcd
// and the memory store claim nothing then, all or nothing; Kubernetes
// claims every free name of a bucket in that bucket's write, and names
// none to claim again.
func conformClaimHeld(t *testing.T, st Group) {
	ctx := context.Background()
	a, sa := beginR0(t, st)
	defer func() { _ = a.End(ctx, sa.ID) }()
	if _, _, err := a.Claim(ctx, sa.ID, []string{"x"}); err != nil {
		t.Fatal(err)
	}
	b, sb := beginAs(t, st, "r1")
	defer func() { _ = b.End(ctx, sb.ID) }()
	got, absent, err := b.Claim(ctx, sb.ID, []string{"x", "y"})
	if err != nil {
		t.Fatal(err)
	}
	byName := claimedBy(got)
	x, y := byName["x"], byName["y"]
	if x.Mine || x.Holder != "r0" || x.Session != sa.ID {
		t.Errorf("claim of held x and free y by r1: %+v, want x held by r0 under %d", got, sa.ID)
	}
	switch {
	case len(got) == 1 && slices.Equal(absent, []string{"y"}):
		if got, _, err := b.Claim(ctx, sb.ID, absent); err != nil || len(got) != 1 || !got[0].Mine {
			t.Errorf("claim of y alone = %+v, %v; want ours", got, err)
		}
	case len(got) != 2 || !y.Mine || len(absent) != 0:
		t.Errorf("claim of held x and free y by r1: %+v, absent %v; want y ours, or [y] to claim again", got, absent)
	}
}

// A session's holdings end with it, so another may claim them; a session
// that ended claims nothing, finds nothing its own, and leaves the names
// free.
func conformClaimsGoWithSession(t *testing.T, st Group) {
	ctx := context.Background()
	a, sa := beginR0(t, st)
	if _, _, err := a.Claim(ctx, sa.ID, []string{"x"}); err != nil {
		t.Fatal(err)
	}
	if err := a.End(ctx, sa.ID); err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.Claim(ctx, sa.ID, []string{"y"}); !errors.Is(err, ha.ErrSessionEnded) {
		t.Errorf("claim under an ended session: %v, want errSessionEnded", err)
	}
	// Nor is the name it held found its own: its holder would run it
	// with no holding to keep the others off.
	if got, _, err := a.Claim(ctx, sa.ID, []string{"x"}); err == nil && (len(got) != 1 || got[0].Mine) {
		t.Errorf("claim of its x by the ended session = %+v; want errSessionEnded, or x not ours", got)
	}
	b, sb := beginAs(t, st, "r1")
	defer func() { _ = b.End(ctx, sb.ID) }()
	got, absent, err := b.Claim(ctx, sb.ID, []string{"x", "y"})
	if err != nil || len(absent) != 0 || len(got) != 2 || !got[0].Mine || !got[1].Mine {
		t.Errorf("claim of the ended session's x and of y = %+v, absent %v, %v; want both ours", got, absent, err)
	}
}

// release ends the holding it names and no other: released again after
// the same session or another claimed the name anew, it leaves that
// holding alone.
func conformRelease(t *testing.T, st Group) {
	ctx := context.Background()
	a, sa := beginR0(t, st)
	defer func() { _ = a.End(ctx, sa.ID) }()
	got, _, err := a.Claim(ctx, sa.ID, []string{"x"})
	if err != nil || len(got) != 1 {
		t.Fatal(got, err)
	}
	old := ha.Claim{Name: "x", Revision: got[0].Revision}
	if err := a.Release(ctx, old); err != nil {
		t.Fatalf("release: %v", err)
	}
	// Held anew by the same session: the old holding's release, sent
	// again (a retry, or a request that arrives late), leaves it alone.
	got, _, err = a.Claim(ctx, sa.ID, []string{"x"})
	if err != nil || len(got) != 1 || !got[0].Mine || got[0].Revision <= old.Revision {
		t.Fatalf("claim of released x by r0 again = %+v, %v; want ours at a later revision than %d", got, err, old.Revision)
	}
	anew := ha.Claim{Name: "x", Revision: got[0].Revision}
	if err := a.Release(ctx, old); err != nil {
		t.Fatalf("release of a holding that ended: %v", err)
	}
	if got, _, err := a.Claim(ctx, sa.ID, []string{"x"}); err != nil || len(got) != 1 || !got[0].Mine || got[0].Revision != anew.Revision {
		t.Errorf("after r0 released its old holding again, x = %+v, %v; want still its new holding, at %d", got, err, anew.Revision)
	}
	if err := a.Release(ctx, anew); err != nil {
		t.Fatalf("release: %v", err)
	}
	b, sb := beginAs(t, st, "r1")
	defer func() { _ = b.End(ctx, sb.ID) }()
	got, _, err = b.Claim(ctx, sb.ID, []string{"x"})
	if err != nil || len(got) != 1 || !got[0].Mine || got[0].Revision <= old.Revision {
		t.Fatalf("claim of released x by r1 = %+v, %v; want ours at a later revision than %d", got, err, old.Revision)
	}
	if err := a.Release(ctx, old); err != nil {
		t.Fatalf("release of a holding that ended: %v", err)
	}
	got, absent, err := a.Claim(ctx, sa.ID, []string{"x"})
	if err != nil || len(absent) != 0 || len(got) != 1 || got[0].Mine || got[0].Holder != "r1" {
		t.Errorf("after r0 released its old holding again, x = %+v, absent %v, %v; want still r1's", got, absent, err)
	}
}

// readSet returns what fetch read of member's set with digest, as
// "i/n=data" in chunk order, and the position it read at.
func readSet(t *testing.T, b ha.Backend, member, digest string) (string, int64) {
	t.Helper()
	chunks, at, err := b.Fetch(context.Background(), member, digest)
	if err != nil {
		t.Fatalf("fetch of %s's set %s: %v", member, digest, err)
	}
	slices.SortFunc(chunks, func(a, b ha.Chunk) int { return a.Index - b.Index })
	var out []string
	for _, c := range chunks {
		if c.Member != member || c.Digest != digest {
			t.Errorf("fetch of %s's set %s read a chunk of %s's set %s", member, digest, c.Member, c.Digest)
		}
		out = append(out, fmt.Sprintf("%d/%d=%s", c.Index, c.Count, c.Data))
	}
	return strings.Join(out, " "), at
}

// A published set reads back whole, from another replica, at a position
// past every earlier write of the group (a claim's here); a set
// withdrawn, replaced by another digest's, or under a session that ended
// reads as nothing; and an ended session publishes nothing.
func conformPublish(t *testing.T, st Group) {
	ctx := context.Background()
	a, sa := beginR0(t, st)
	reader := st.Backend("r1")
	got, _, err := a.Claim(ctx, sa.ID, []string{"x"})
	if err != nil || len(got) != 1 {
		t.Fatal(got, err)
	}
	if err := a.Publish(ctx, sa.ID, "d1", "", [][]byte{[]byte("a"), []byte("b")}); err != nil {
		t.Fatalf("publish: %v", err)
	}
	if set, at := readSet(t, reader, "r0", "d1"); set != "0/2=a 1/2=b" || at <= got[0].Revision {
		t.Errorf("fetch after publishing d1 = %q at %d; want 0/2=a 1/2=b, past the claim's position %d", set, at, got[0].Revision)
	}
	if err := a.Publish(ctx, sa.ID, "d2", "d1", [][]byte{[]byte("c")}); err != nil {
		t.Fatalf("publish d2 in d1's place: %v", err)
	}
	if set, _ := readSet(t, reader, "r0", "d1"); set != "" {
		t.Errorf("d1 after d2 replaced it: %q, want withdrawn", set)
	}
	if set, _ := readSet(t, reader, "r0", "d2"); set != "0/1=c" {
		t.Errorf("d2 = %q, want 0/1=c", set)
	}
	if err := a.Publish(ctx, sa.ID, "", "d2", nil); err != nil {
		t.Fatalf("withdraw: %v", err)
	}
	if set, _ := readSet(t, reader, "r0", "d2"); set != "" {
		t.Errorf("d2 after the withdrawal: %q, want nothing", set)
	}
	if err := a.Publish(ctx, sa.ID, "d3", "", [][]byte{[]byte("e")}); err != nil {
		t.Fatal(err)
	}
	if err := a.End(ctx, sa.ID); err != nil {
		t.Fatal(err)
	}
	if set, _ := readSet(t, reader, "r0", "d3"); set != "" {
		t.Errorf("d3 after its session ended: %q, want gone with it", set)
	}
	if err := a.Publish(ctx, sa.ID, "d4", "", [][]byte{[]byte("f")}); !errors.Is(err, ha.ErrSessionEnded) {
		t.Errorf("publish under an ended session: %v, want errSessionEnded", err)
	}
}

// chunkLine renders c for a case's comparison.
func chunkLine(c ha.Chunk) string {
	return fmt.Sprintf("chunk %s/%s %d/%d=%s", c.Member, c.Digest, c.Index, c.Count, c.Data)
}

// sameLines fails the test unless got is want, line for line.
func sameLines(t *testing.T, what string, got []string, want ...string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("%s:\n%s\nwant\n%s", what, strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// A listing holds every member record, holding and published chunk, as
// they stand at its position, with the positions that created them (a
// member record's is begin's joinedAt, a holding's its claim's); heldAt
// answers the names held at an earlier position, holdings released
// since included, or, on a store that keeps no history (NoHistory), an
// error for each.
func conformList(t *testing.T, st Group) {
	ctx := context.Background()
	a, sa := beginR0(t, st)
	defer func() { _ = a.End(ctx, sa.ID) }()
	got, _, err := a.Claim(ctx, sa.ID, []string{"x", "y"})
	if err != nil || len(got) != 2 {
		t.Fatal(got, err)
	}
	claimedAt := got[0].Revision
	b, sb := beginAs(t, st, "r1")
	defer func() { _ = b.End(ctx, sb.ID) }()
	if err := b.Publish(ctx, sb.ID, "d1", "", [][]byte{[]byte("a")}); err != nil {
		t.Fatal(err)
	}
	if err := a.Release(ctx, ha.Claim{Name: "x", Revision: claimedAt}); err != nil {
		t.Fatal(err)
	}
	records, at, err := b.List(ctx)
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	var listed []string
	for _, c := range records {
		if c.At > at || c.At <= 0 {
			t.Errorf("record %+v written at %d, outside the listing's position %d", c, c.At, at)
		}
		switch c.Kind {
		case ha.MemberPut:
			listed = append(listed, fmt.Sprintf("member %s session=%t created=%t digest=%s", c.Member, c.Session == sa.ID || c.Session == sb.ID, c.Created == sa.JoinedAt || c.Created == sb.JoinedAt, c.Digest))
		case ha.ClaimPut:
			listed = append(listed, fmt.Sprintf("claim %s by %s session=%t created=%t", c.Name, c.Member, c.Session == sa.ID, c.Created == claimedAt))
		case ha.ChunkPut:
			listed = append(listed, chunkLine(c.Chunk))
		default:
			t.Errorf("a listing holds %+v, not a put", c)
		}
	}
	slices.Sort(listed)
	sameLines(t, "the listing", listed,
		"chunk r1/d1 0/1=a",
		"claim y by r0 session=true created=true",
		"member r0 session=true created=true digest=digest",
		"member r1 session=true created=true digest=digest")
	h, history := b.(ha.HistoryReader)
	if !history {
		if !st.NoHistory {
			t.Error("the backend is no ha.HistoryReader, and the Group does not say NoHistory")
		}
		return
	}
	for _, q := range []struct {
		at   int64
		want string
	}{
		{sa.JoinedAt, "map[]"},
		{claimedAt, "map[x:true y:true]"},
		{sb.JoinedAt, "map[x:true y:true]"},
		{at, "map[y:true]"},
	} {
		names, err := h.HeldAt(ctx, q.at)
		switch {
		case st.NoHistory && err == nil:
			t.Errorf("heldAt(%d) = %v on a store that keeps no history; want an error", q.at, names)
		case !st.NoHistory && (err != nil || fmt.Sprint(names) != q.want):
			t.Errorf("heldAt(%d) = %v, %v; want %s", q.at, names, err, q.want)
		}
	}
}

// Another replica reads a member's session as the member would: its
// validity, the time left within it, and, once its feed delivered the
// session's end, its end. The reader watches the group, as a replica
// does all along: on Kubernetes the reading is the reader's own
// observer's, which learns of the end from that feed.
func conformPeerLeft(t *testing.T, st Group) {
	ctx := context.Background()
	a, sa := beginR0(t, st)
	reader := st.Backend("r1")
	w := watchGroup(t, reader)
	defer w.stop()
	left, granted, err := reader.PeerLeft(ctx, sa.ID)
	if err != nil || granted != TTL || left <= 0 || left > TTL || left < TTL-st.Slack-time.Second/2 {
		t.Errorf("peerLeft of r0's new session = %v of %v, %v; want about %v of %v", left, granted, err, TTL, TTL)
	}
	if err := a.End(ctx, sa.ID); err != nil {
		t.Fatal(err)
	}
	w.await(t, "r0's end", func(c ha.Change) bool { return c.Kind == ha.MemberGone && c.Member == "r0" })
	if _, _, err := reader.PeerLeft(ctx, sa.ID); !errors.Is(err, ha.ErrSessionEnded) {
		t.Errorf("peerLeft of r0's ended session: %v, want errSessionEnded", err)
	}
}

// A feed started at a listing's position delivers the later changes in
// the order of their positions, each batch saying how far it has
// delivered: a claim of two names at one position, a release alone at
// its own, a published chunk, and a session's end, whose deletions (its
// member record and its remaining holding) come in one batch at one
// position. Its goroutines end with stop.
func conformFeed(t *testing.T, st Group) {
	ctx := context.Background()
	a, sa := beginR0(t, st)
	b, sb := beginAs(t, st, "r1")
	defer func() { _ = b.End(ctx, sb.ID) }()
	_, from, err := b.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	f := b.Watch(from, &wg)
	got, _, err := a.Claim(ctx, sa.ID, []string{"x", "y"})
	if err != nil || len(got) != 2 {
		t.Fatal(got, err)
	}
	if err := a.Release(ctx, ha.Claim{Name: "x", Revision: got[0].Revision}); err != nil {
		t.Fatal(err)
	}
	if err := b.Publish(ctx, sb.ID, "d1", "", [][]byte{[]byte("a")}); err != nil {
		t.Fatal(err)
	}
	if err := a.End(ctx, sa.ID); err != nil {
		t.Fatal(err)
	}
	// Each position's changes, the positions numbered from 1 in the
	// order they came; a position's changes in one batch (batchOf).
	var seen [][]string
	pos := map[int64]int{}
	batchOf := map[int64]int{}
	last := from
	timeout := time.After(10 * time.Second)
	for n, done := 0, false; !done; n++ {
		var fb ha.FeedBatch
		select {
		case fb = <-f.Batches():
		case <-timeout:
			t.Fatalf("the feed delivered %v, and not r0's end, in 10s", seen)
		}
		if fb.Err != nil {
			t.Fatalf("the feed failed: %v", fb.Err)
		}
		for _, c := range fb.Changes {
			if c.At <= from {
				continue // at the listing's position: may come again
			}
			if c.At < last || c.At > fb.At {
				t.Errorf("change %+v at %d: after %d, in a batch up to %d", c, c.At, last, fb.At)
			}
			last = c.At
			if pos[c.At] == 0 {
				pos[c.At] = len(pos) + 1
				batchOf[c.At] = n
				seen = append(seen, nil)
			}
			if batchOf[c.At] != n {
				t.Errorf("the changes at position %d came in batches %d and %d", c.At, batchOf[c.At], n)
			}
			var what string
			switch c.Kind {
			case ha.ClaimPut:
				what = fmt.Sprintf("claim %s by %s session=%t created=%t", c.Name, c.Member, c.Session == sa.ID, c.Created == c.At)
			case ha.ClaimGone:
				what = "released " + c.Name
			case ha.ChunkPut:
				what = chunkLine(c.Chunk)
			case ha.MemberGone:
				what, done = "gone "+c.Member, true
			default:
				what = fmt.Sprintf("%+v", c)
			}
			seen[pos[c.At]-1] = append(seen[pos[c.At]-1], what)
		}
	}
	var delivered []string
	for _, at := range seen {
		slices.Sort(at) // within a position, in no order
		delivered = append(delivered, strings.Join(at, ", "))
	}
	sameLines(t, "the feed, a line per position,", delivered,
		"claim x by r0 session=true created=true, claim y by r0 session=true created=true",
		"released x",
		"chunk r1/d1 0/1=a",
		"gone r0, released y")
	f.Stop()
	wg.Wait()
}

// A replica restarted under its ID (a new backend of that ID: a new
// process) while the session of its earlier run lives, the earlier run
// silent (crashed, or frozen), finds its member record under that
// session, and reads the session as live, with time left of its TTL,
// until it has ended, never before the validity of its last renewal
// (the call of renew + valid) has run out, and at most about a TTL and
// the store's slack later; then it begins. This is what Replica.Join's
// wait relies on: it begins once TimeLeft says ErrSessionEnded. No
// other replica of the case's own watches the group (a group of one
// replica, restarted); a harness that runs a watcher beside every case
// (Kubernetes') may have it prove the end first, so a store must test
// its restarted replica's own proof alone as well
// (ha/kube: TestRestartReviewRunAloneProvesItsEarlierSessionEnded).
func conformRestartSilent(t *testing.T, st Group) {
	ctx := context.Background()
	earlier, s := beginR0(t, st)
	renewed := time.Now()
	valid, err := earlier.Renew(ctx, s.ID) // its last: it crashes after it
	if err != nil {
		t.Fatalf("renew: %v", err)
	}
	later := st.Backend("r0")
	id, found, err := later.MemberSession(ctx)
	if err != nil || !found || id != s.ID {
		t.Fatalf("memberSession of the restarted replica = %d, %v, %v; want the earlier run's %d", id, found, err, s.ID)
	}
	if s2, err := later.Begin(ctx, 0, TTL, "digest"); !errors.Is(err, ha.ErrDuplicateID) {
		if err == nil {
			_ = later.End(ctx, s2.ID)
		}
		t.Fatalf("begin of the restarted replica while the earlier run's session lives: %v, want ErrDuplicateID", err)
	}
	giveUp := renewed.Add(valid + TTL + st.Slack)
	for {
		left, granted, err := later.TimeLeft(ctx, id)
		answered := time.Now()
		if errors.Is(err, ha.ErrSessionEnded) {
			if until := renewed.Add(valid); answered.Before(until) {
				t.Errorf("timeLeft said ended %v before the validity of the earlier run's last renewal ran out", until.Sub(answered))
			}
			break
		}
		if err != nil {
			t.Fatalf("timeLeft of the earlier run's session: %v", err)
		}
		if granted != TTL || left < 0 || left > granted {
			t.Errorf("timeLeft of the earlier run's session = %v of %v; want at most its TTL %v", left, granted, TTL)
		}
		if answered.After(giveUp) {
			t.Fatalf("the earlier run's session, silent since its renewal %v ago, still lives (%v left)", answered.Sub(renewed), left)
		}
		time.Sleep(TTL / 20)
	}
	s2, err := later.Begin(ctx, 0, TTL, "digest")
	if err != nil {
		t.Fatalf("begin of the restarted replica once the earlier run's session ended: %v", err)
	}
	defer func() { _ = later.End(ctx, s2.ID) }()
	if id, found, _ := later.MemberSession(ctx); !found || id != s2.ID {
		t.Errorf("after the restart the member record is under %d (found %v), want the new session %d", id, found, s2.ID)
	}
	if _, err := earlier.Renew(ctx, s.ID); !errors.Is(err, ha.ErrSessionEnded) {
		t.Errorf("the earlier run's renewal after the restart began: %v, want ErrSessionEnded", err)
	}
}

// A replica started under an ID whose other run is alive and renews (a
// real duplicate, not a restart) never reads that session as ended, and
// its readings show the session's end moving later with each renewal:
// what tells Replica.Join a live duplicate from a crashed run. Its begin
// is refused throughout.
func conformRestartRenewed(t *testing.T, st Group) {
	ctx := context.Background()
	earlier, s := beginR0(t, st)
	defer func() { _ = earlier.End(ctx, s.ID) }()
	later := st.Backend("r0")
	var first time.Time // the end the first reading implies: its send time + left
	for i := range 24 { // three TTLs
		if i%2 == 0 {
			if _, err := earlier.Renew(ctx, s.ID); err != nil {
				t.Fatalf("the live run's renewal: %v", err)
			}
		}
		sent := time.Now()
		left, _, err := later.TimeLeft(ctx, s.ID)
		if err != nil {
			t.Fatalf("timeLeft of a session renewed every %v, read %v after its begin: %v; want it live", TTL/4, time.Since(s.Sent).Round(time.Millisecond), err)
		}
		if first.IsZero() {
			first = sent.Add(left)
		}
		if i == 23 {
			if end := sent.Add(left); end.Sub(first) < TTL {
				t.Errorf("the readings over %v of renewals put the session's end %v later than the first did; want it moved by a TTL (%v) at least", 3*TTL, end.Sub(first), TTL)
			}
		}
		time.Sleep(TTL / 8)
	}
	if s2, err := later.Begin(ctx, 0, TTL, "digest"); !errors.Is(err, ha.ErrDuplicateID) {
		if err == nil {
			_ = later.End(ctx, s2.ID)
		}
		t.Errorf("begin while another run of the ID renews: %v, want ErrDuplicateID", err)
	}
	if !alive(t, earlier, s.ID) {
		t.Error("the live run's session ended under the other run's readings")
	}
}
