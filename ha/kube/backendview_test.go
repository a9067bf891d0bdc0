// The listing, the readings of other members' sessions and the
// published sets of kubeBackend, on the real API server as the
// replicas (the manifest's Role alone).

package kube

import (
	"bytes"
	"compress/flate"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/bgctl/controller/ha"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// replicaBackend returns the backend of member id in g on clients of its
// own, with an observer of its own and no feed running.
func replicaBackend(t *testing.T, g *group, id string) *kubeBackend {
	t.Helper()
	return newKubeBackend(otherReplica(t, needCluster(t), g, nil), id, slog.New(slog.DiscardHandler), nil, 5*time.Second)
}

// mustBeginAs begins a session of b, or fails the test.
func mustBeginAs(t *testing.T, b *kubeBackend, digest string) ha.Session {
	t.Helper()
	s, err := b.Begin(t.Context(), 0, testD, digest)
	if err != nil {
		t.Fatalf("begin %s: %v", b.id, err)
	}
	return s
}

// begunIn returns the backend of member id in g, on clients of its own,
// and its session begun with digest.
func begunIn(t *testing.T, g *group, id, digest string) (*kubeBackend, ha.Session) {
	t.Helper()
	b := replicaBackend(t, g, id)
	return b, mustBeginAs(t, b, digest)
}

// pairOf returns a group of its own, the backend of r0 with a session
// begun with digest, and the backend of r1, with none.
func pairOf(t *testing.T, digest string) (*group, *kubeBackend, ha.Session, *kubeBackend) {
	t.Helper()
	g := newTestGroup(t, needCluster(t), 4, nil)
	a := replicaBackend(t, g, "r0")
	return g, a, mustBeginAs(t, a, digest), replicaBackend(t, g, "r1")
}

// recordLine renders a record of a listing or a feed for comparison;
// sessions are named by the members whose sessions are given.
func recordLine(c ha.Change, sessions map[ha.SessionID]string) string {
	switch c.Kind {
	case ha.MemberPut:
		return fmt.Sprintf("member %s of %s digest=%s leaving=%t", c.Member, sessions[c.Session], c.Digest, c.Leaving)
	case ha.MemberGone:
		return "gone " + c.Member
	case ha.ClaimPut:
		return fmt.Sprintf("claim %s by %s of %s", c.Name, c.Member, sessions[c.Session])
	case ha.ClaimGone:
		return "released " + c.Name
	case ha.ChunkPut:
		return fmt.Sprintf("chunk %s/%s %d/%d=%s", c.Chunk.Member, c.Chunk.Digest, c.Chunk.Index, c.Chunk.Count, c.Chunk.Data)
	case ha.ChunkGone:
		return fmt.Sprintf("chunk gone %s/%s %d/%d", c.Chunk.Member, c.Chunk.Digest, c.Chunk.Index, c.Chunk.Count)
	}
	return fmt.Sprintf("%+v", c)
}

// A listing reads the group at one position: every member record with
// the position of its member Lease's create (the one renewed since as
// well as the one not), every holding with its claim's position, every
// published chunk, and nothing written after it. A session whose member
// Lease an administrator deleted stays listed, its holdings too, until
// the lister's observer counts it ended, D after the list that found it
// gone; then neither is listed, though its entry stays in the bucket.
// HeldAt cannot say.
func TestBackendListAtOnePosition(t *testing.T) {
	t.Parallel()
	c := needCluster(t)
	g := newTestGroup(t, c, 4, nil)
	ctx := t.Context()
	a, b, x := replicaBackend(t, g, "r0"), replicaBackend(t, g, "r1"), replicaBackend(t, g, "r2")
	sa, sb, sx := mustBeginAs(t, a, "da"), mustBeginAs(t, b, "db"), mustBeginAs(t, x, "dx")
	if _, err := a.Renew(ctx, sa.ID); err != nil {
		t.Fatal(err)
	}
	if ok, err := b.PutMember(ctx, sb.ID, "db2", true); !ok || err != nil {
		t.Fatalf("PutMember: %v, %v", ok, err)
	}
	names := append(namesIn(g, 0, 2), namesIn(g, 1, 1)...)
	got, _, err := a.Claim(ctx, sa.ID, names)
	if err != nil || len(got) != 3 {
		t.Fatalf("claim: %+v, %v", got, err)
	}
	rev := map[string]int64{}
	for _, c := range got {
		rev[c.Name] = c.Revision
	}
	if err := a.Release(ctx, ha.Claim{Name: names[1], Revision: rev[names[1]]}); err != nil {
		t.Fatal(err)
	}
	lost := namesIn(g, 2, 1)[0]
	if _, _, err := x.Claim(ctx, sx.ID, []string{lost}); err != nil {
		t.Fatal(err)
	}
	if err := b.Publish(ctx, sb.ID, "db2", "", [][]byte{[]byte("p"), []byte("q")}); err != nil {
		t.Fatalf("publish: %v", err)
	}
	if err := c.admin.CoordinationV1().Leases(replicaNamespace).Delete(ctx, g.memberName("r2"), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	sessions := map[ha.SessionID]string{sa.ID: "r0", sb.ID: "r1", sx.ID: "r2"}
	joined := map[string]int64{"r0": sa.JoinedAt, "r1": sb.JoinedAt, "r2": sx.JoinedAt}
	listed := func() ([]string, int64) {
		records, at, err := b.List(ctx)
		if err != nil {
			t.Fatalf("list: %v", err)
		}
		var lines []string
		for _, c := range records {
			if c.At > at || c.At <= 0 {
				t.Errorf("record %+v written at %d, outside the listing's position %d", c, c.At, at)
			}
			if c.Kind == ha.MemberPut && c.Created != joined[c.Member] {
				t.Errorf("member %s created at %d, want its begin's %d", c.Member, c.Created, joined[c.Member])
			}
			if c.Kind == ha.ClaimPut && c.Created != rev[c.Name] && c.Name != lost {
				t.Errorf("claim of %s created at %d, want its claim's %d", c.Name, c.Created, rev[c.Name])
			}
			lines = append(lines, recordLine(c, sessions))
		}
		slices.Sort(lines)
		return lines, at
	}
	lines, at := listed()
	sameLines(t, "the listing", lines,
		"chunk r1/db2 0/2=p",
		"chunk r1/db2 1/2=q",
		fmt.Sprintf("claim %s by r0 of r0", names[0]),
		fmt.Sprintf("claim %s by r0 of r0", names[2]),
		fmt.Sprintf("claim %s by r2 of r2", lost),
		"member r0 of r0 digest=da leaving=false",
		"member r1 of r1 digest=db2 leaving=true")
	if at < rev[names[2]] {
		t.Errorf("listed at %d, before the claim at %d", at, rev[names[2]])
	}
	if names, err := b.HeldAt(ctx, sa.JoinedAt); err == nil {
		t.Errorf("HeldAt = %v, want an error: the API server keeps no history", names)
	}
	time.Sleep(testD)
	lines, _ = listed()
	sameLines(t, "the listing D after r2's member Lease was found deleted", lines,
		"chunk r1/db2 0/2=p",
		"chunk r1/db2 1/2=q",
		fmt.Sprintf("claim %s by r0 of r0", names[0]),
		fmt.Sprintf("claim %s by r0 of r0", names[2]),
		"member r0 of r0 digest=da leaving=false",
		"member r1 of r1 digest=db2 leaving=true")
	if claims, _ := bucketNow(t, c, g, 2); len(claims) != 1 {
		t.Errorf("bucket 2 holds %v, want r2's entry still there", claims)
	}
}

// Another replica reads a member's session from its observer's stamps:
// about D of D when it first sees it, less as time passes unrenewed, and
// ha.ErrSessionEnded once its observer proved it ended.
func TestBackendPeerLeftFromTheObserversStamps(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	_, _, sa, reader := pairOf(t, "d")
	left, granted, err := reader.PeerLeft(ctx, sa.ID)
	if err != nil || granted != testD || left > testD || left < testD-time.Second/2 {
		t.Fatalf("PeerLeft of a new session = %v of %v, %v; want about %v of %v", left, granted, err, testD, testD)
	}
	time.Sleep(testD / 2)
	if left2, _, err := reader.PeerLeft(ctx, sa.ID); err != nil || left2 > left-testD/2 || left2 < left-testD/2-time.Second/2 {
		t.Errorf("PeerLeft D/2 later, unrenewed = %v, %v; want about %v", left2, err, left-testD/2)
	}
	time.Sleep(testD / 2)
	reader.proveDue(ctx)
	if _, _, err := reader.PeerLeft(ctx, sa.ID); !errors.Is(err, ha.ErrSessionEnded) {
		t.Errorf("PeerLeft once the reader's observer proved the session ended: %v, want ha.ErrSessionEnded", err)
	}
	if _, _, err := reader.PeerLeft(ctx, sa.ID+1); err == nil || errors.Is(err, ha.ErrSessionEnded) {
		t.Errorf("PeerLeft of a session nobody began: %v, want an error other than ha.ErrSessionEnded", err)
	}
}

// setOf returns n names as a service might register them, some
// random, and the chunks ha would publish of them: deflated, in chunks
// of at most 512 KiB.
func setOf(n int) [][]byte {
	var raw bytes.Buffer
	for i := range n {
		name := fmt.Sprintf("tenant-%d/job-%s", i%97, rand.Text()[:12])
		raw.Write(binary.AppendUvarint(nil, uint64(len(name))))
		raw.WriteString(name)
	}
	var z bytes.Buffer
	w, _ := flate.NewWriter(&z, flate.DefaultCompression)
	_, _ = w.Write(raw.Bytes())
	_ = w.Close()
	var chunks [][]byte
	for all := z.Bytes(); len(all) > 0; all = all[min(len(all), 512<<10):] {
		chunks = append(chunks, all[:min(len(all), 512<<10)])
	}
	return chunks
}

// A set of 100,000 names, several chunks of 512 KiB, each more than one
// Lease can carry, is written in pieces and read back whole by another
// replica, at a position past the write; replaced by another digest's,
// it is gone; and the set left goes with its session's end.
func TestBackendPublishesLargeSets(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	g, a, sa, reader := pairOf(t, "d1")
	chunks := setOf(100000)
	if len(chunks) < 2 || len(chunks[0]) <= pieceBytes {
		t.Fatalf("the set is %d chunks, the first of %d bytes: want several, larger than a piece", len(chunks), len(chunks[0]))
	}
	if err := a.Publish(ctx, sa.ID, "d1", "", chunks); err != nil {
		t.Fatalf("publish: %v", err)
	}
	if err := a.Publish(ctx, sa.ID, "d1", "", chunks); err != nil {
		t.Fatalf("publish again: %v", err)
	}
	read := func(digest string) ([]ha.Chunk, int64) {
		got, at, err := reader.Fetch(ctx, "r0", digest)
		if err != nil {
			t.Fatalf("fetch %s: %v", digest, err)
		}
		slices.SortFunc(got, func(a, b ha.Chunk) int { return a.Index - b.Index })
		return got, at
	}
	got, at := read("d1")
	if len(got) != len(chunks) || at <= sa.JoinedAt {
		t.Fatalf("fetch read %d chunks at %d, want %d after %d", len(got), at, len(chunks), sa.JoinedAt)
	}
	for i, ch := range got {
		if ch.Member != "r0" || ch.Digest != "d1" || ch.Index != i || ch.Count != len(chunks) || !bytes.Equal(ch.Data, chunks[i]) {
			t.Errorf("chunk %d read back as %s/%s %d/%d of %d bytes, want r0/d1 %d/%d of %d", i, ch.Member, ch.Digest, ch.Index, ch.Count, len(ch.Data), i, len(chunks), len(chunks[i]))
		}
	}
	if n := pieceLeases(t, g); n <= len(chunks) {
		t.Errorf("%d piece Leases for %d chunks, want more", n, len(chunks))
	}
	if err := a.Publish(ctx, sa.ID, "d2", "d1", [][]byte{[]byte("small")}); err != nil {
		t.Fatalf("publish d2 in d1's place: %v", err)
	}
	if got, _ := read("d1"); len(got) != 0 {
		t.Errorf("d1 after d2 replaced it: %d chunks, want none", len(got))
	}
	if got, _ := read("d2"); len(got) != 1 || string(got[0].Data) != "small" {
		t.Errorf("d2 = %+v, want one chunk", got)
	}
	if err := a.End(ctx, sa.ID); err != nil {
		t.Fatal(err)
	}
	if n := pieceLeases(t, g); n != 0 {
		t.Errorf("%d piece Leases after the session's end, want none", n)
	}
	if err := a.Publish(ctx, sa.ID, "d3", "", [][]byte{[]byte("x")}); !errors.Is(err, ha.ErrSessionEnded) {
		t.Errorf("publish under an ended session: %v, want ha.ErrSessionEnded", err)
	}
}

// pieceLeases counts the piece Leases of g, as the administrator lists
// them.
func pieceLeases(t *testing.T, g *group) int {
	t.Helper()
	ls, err := needCluster(t).admin.CoordinationV1().Leases(replicaNamespace).List(t.Context(), metav1.ListOptions{LabelSelector: groupLabel + "=" + g.name + "," + kindLabel + "=" + kindChunk})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	n := 0
	for _, l := range ls.Items {
		if strings.Contains(l.Name, chunkInfix) {
			n++
		}
	}
	return n
}

// sameLines fails the test unless got is want, line for line.
func sameLines(t *testing.T, what string, got []string, want ...string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("%s:\n%s\nwant\n%s", what, strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
