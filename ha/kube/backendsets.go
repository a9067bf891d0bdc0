// Published sets of names: each chunk ha makes of a set (up to 512 KiB)
// is split into pieces that fit a Lease's annotations, one piece Lease
// each, written under the member's session and deleted with it.

package kube

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/bgctl/controller/ha"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// The piece Leases of published sets: <group>-s-<member hash>-<digest>-<i>-<p>,
// piece p of chunk i, labelled with the group, kindChunk, the member's
// hash (publisherLabel) and the set (setLabel: the member's hash and the
// digest), so that a set is read, and a member's sets withdrawn, by one
// list. The member is the holderIdentity's ID: the session the piece is
// under. The hash (memberHash) keeps names and label values short
// whatever the ID's length; the holder tells two IDs of one hash apart.
const (
	kindChunk       = "chunk"
	chunkInfix      = "-s-"
	setLabel        = "ha.bgctl.dev/set"
	publisherLabel  = "ha.bgctl.dev/publisher"
	pieceAnnotation = "ha.bgctl.dev/piece" // "<digest> <i>/<n> <p>/<pieces>"
	dataAnnotation  = "ha.bgctl.dev/data"  // the piece's bytes, in base64
)

// pieceBytes bounds the bytes of one piece. The API server refuses an
// object whose annotations exceed 256 KiB together; in base64 a piece
// takes 4/3 of its bytes, 224 KiB at most here, as a bucket's claims
// (maxClaimsBytes), which leaves the rest to the other annotations. A
// chunk of ha's largest (512 KiB) is four pieces. The backend splits
// rather than asking ha for smaller chunks: the chunks, and the digest
// every version computes alike, stay what they are on etcd.
const pieceBytes = 168 << 10

// memberHash returns FNV-1a (64 bits) of member ID id, in 16 hex digits.
func memberHash(id string) string {
	h := fnv.New64a()
	h.Write([]byte(id))
	return fmt.Sprintf("%016x", h.Sum64())
}

// pieceName returns the name of piece p of chunk i of member id's set
// with digest.
func (g *group) pieceName(id, digest string, i, p int) string {
	return fmt.Sprintf("%s%s%s-%s-%d-%d", g.name, chunkInfix, memberHash(id), digest, i, p)
}

// chunkKey names one chunk of a published set.
type chunkKey struct {
	member, digest string
	i, n           int
}

// pieceOf returns what piece Lease l carries: its chunk, its place p of
// pieces, and its bytes; ok is false for a Lease that is not one.
func pieceOf(l *coordinationv1.Lease) (key chunkKey, p, pieces int, data []byte, ok bool) {
	member, ok := identityID(holder(l))
	if !ok {
		return chunkKey{}, 0, 0, nil, false
	}
	var digest string
	var i, n int
	if _, err := fmt.Sscanf(l.Annotations[pieceAnnotation], "%s %d/%d %d/%d", &digest, &i, &n, &p, &pieces); err != nil ||
		n < 1 || i < 0 || i >= n || pieces < 1 || p < 0 || p >= pieces {
		return chunkKey{}, 0, 0, nil, false
	}
	data, err := base64.StdEncoding.DecodeString(l.Annotations[dataAnnotation])
	if err != nil {
		return chunkKey{}, 0, 0, nil, false
	}
	return chunkKey{member: member, digest: digest, i: i, n: n}, p, pieces, data, true
}

// pieceKey returns the chunk piece Lease l is a piece of.
func (v *groupView) pieceKey(l *coordinationv1.Lease) (chunkKey, bool) {
	key, _, _, _, ok := pieceOf(l)
	return key, ok
}

// chunkKeys returns the chunks the view has pieces of, in order.
func (v *groupView) chunkKeys() []chunkKey {
	keys := map[chunkKey]bool{}
	for _, l := range v.pieces {
		if key, ok := v.pieceKey(l); ok {
			keys[key] = true
		}
	}
	return slices.SortedFunc(maps.Keys(keys), func(a, b chunkKey) int {
		return cmpChunks(a, b)
	})
}

// cmpChunks orders chunks by member, digest, count and place.
func cmpChunks(a, b chunkKey) int {
	if c := strings.Compare(a.member, b.member); c != 0 {
		return c
	}
	if c := strings.Compare(a.digest, b.digest); c != 0 {
		return c
	}
	if a.n != b.n {
		return a.n - b.n
	}
	return a.i - b.i
}

// chunkRecord returns chunk key as the view holds it, nil unless every
// piece of it has come, all under one session whose records are in the
// view: its bytes, at the position of its last piece's write.
func (v *groupView) chunkRecord(key chunkKey) *ha.Change {
	var parts [][]byte
	var owner string
	var at int64
	for _, l := range v.pieces {
		k, p, pieces, data, ok := pieceOf(l)
		if !ok || k != key {
			continue
		}
		if parts == nil {
			parts, owner = make([][]byte, pieces), holder(l)
		}
		if len(parts) != pieces || holder(l) != owner {
			return nil // two splits, or two sessions' pieces: not one chunk yet
		}
		parts[p], at = data, max(at, rvOf(l))
	}
	if parts == nil || v.over[owner] || slices.ContainsFunc(parts, func(b []byte) bool { return b == nil }) {
		return nil
	}
	return &ha.Change{Kind: ha.ChunkPut, At: at, Chunk: ha.Chunk{Member: key.member, Digest: key.digest, Index: key.i, Count: key.n, Data: bytes.Join(parts, nil)}}
}

// diffChunk returns the change of chunk key from before to after at
// position at: put when it came whole or changed, gone when it no longer
// is whole.
func diffChunk(before, after *ha.Change, key chunkKey, at int64) []ha.Change {
	switch {
	case after != nil && (before == nil || !bytes.Equal(before.Chunk.Data, after.Chunk.Data)):
		c := *after
		c.At = max(at, c.At)
		return []ha.Change{c}
	case after == nil && before != nil:
		return []ha.Change{{Kind: ha.ChunkGone, At: at, Chunk: ha.Chunk{Member: key.member, Digest: key.digest, Index: key.i, Count: key.n}}}
	}
	return nil
}

// Publish writes chunks as this replica's set with digest, each chunk's
// pieces one piece Lease each, under session id (its holderIdentity),
// then withdraws the set of digest old; a digest of "" publishes nothing
// and withdraws every set of this replica. A piece Lease that exists is
// written again under this session when it is another's (an earlier
// session of this ID) or carries other bytes, on condition of the
// version read: so a call made again whole changes nothing. A session
// not live here is ha.ErrSessionEnded; the pieces it wrote go with it (End
// withdraws them; an observer that counts it ended deletes them: watch).
// Each request is bounded by the request timeout and ctx.
func (b *kubeBackend) Publish(ctx context.Context, id ha.SessionID, digest, old string, chunks [][]byte) error {
	s := b.live(id)
	if s == nil {
		return b.ended(id)
	}
	if digest != "" {
		if errs := validation.IsValidLabelValue(memberHash(b.id) + "-" + digest); len(errs) > 0 || strings.ContainsAny(digest, " /") {
			return fmt.Errorf("kube: digest %q cannot name a set: %s", digest, strings.Join(errs, "; "))
		}
		for i, c := range chunks {
			pieces := max((len(c)+pieceBytes-1)/pieceBytes, 1)
			for p := range pieces {
				data := c[p*pieceBytes : min((p+1)*pieceBytes, len(c))]
				if err := b.writePiece(ctx, s, digest, i, len(chunks), p, pieces, data); err != nil {
					return err
				}
			}
		}
	}
	switch {
	case digest == "":
		return b.withdraw(ctx, publisherLabel+"="+memberHash(b.id))
	case old != "" && old != digest:
		return b.withdraw(ctx, setLabel+"="+memberHash(b.id)+"-"+old)
	}
	return nil
}

// writePiece writes piece p of pieces of chunk i of n under session s,
// unless its Lease already carries it under s.
func (b *kubeBackend) writePiece(ctx context.Context, s *session, digest string, i, n, p, pieces int, data []byte) error {
	name := b.g.pieceName(b.id, digest, i, p)
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return fmt.Errorf("kube: a piece of member %s's set: %s", b.id, strings.Join(errs, "; "))
	}
	labels := b.g.labels(kindChunk)
	labels[setLabel] = memberHash(b.id) + "-" + digest
	labels[publisherLabel] = memberHash(b.id)
	annotations := map[string]string{
		pieceAnnotation: fmt.Sprintf("%s %d/%d %d/%d", digest, i, n, p, pieces),
		dataAnnotation:  base64.StdEncoding.EncodeToString(data),
	}
	for try := 0; ; try++ {
		if err := s.stateErr(); err != nil {
			return fmt.Errorf("kube: writing %s: %w: %w", name, ha.ErrSessionEnded, err)
		}
		rctx, cancel := b.request(ctx)
		cur, err := b.g.leases.Get(rctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, Annotations: annotations},
				Spec: coordinationv1.LeaseSpec{HolderIdentity: new(s.identity)}}
			_, err = b.g.leases.Create(rctx, l, metav1.CreateOptions{})
		case err == nil && holder(cur) == s.identity && maps.Equal(cur.Annotations, annotations) && maps.Equal(cur.Labels, labels):
			cancel()
			return nil
		case err == nil:
			next := cur.DeepCopy()
			next.Labels, next.Annotations, next.Spec.HolderIdentity = labels, annotations, new(s.identity)
			_, err = b.g.leases.Update(rctx, next, metav1.UpdateOptions{})
		}
		cancel()
		if err == nil {
			return nil
		}
		if !(apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err)) || try >= 8 {
			return fmt.Errorf("kube: writing %s: %w", name, err)
		}
	}
}

// withdraw deletes the piece Leases of this replica's ID that selector
// (a label of the pieces) picks, each on condition of its UID and the
// version listed: a piece written again since, by a later session of the
// ID, is left to that session.
func (b *kubeBackend) withdraw(ctx context.Context, selector string) error {
	rctx, cancel := b.request(ctx)
	ls, err := b.g.leases.List(rctx, metav1.ListOptions{LabelSelector: groupLabel + "=" + b.g.name + "," + kindLabel + "=" + kindChunk + "," + selector})
	cancel()
	if err != nil {
		return fmt.Errorf("kube: listing the sets of %s: %w", b.id, err)
	}
	var errs []error
	for i := range ls.Items {
		l := &ls.Items[i]
		if id, _ := identityID(holder(l)); id != b.id {
			continue // another ID of the same hash
		}
		if err := b.deletePiece(ctx, l); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// deletePiece deletes piece Lease l on condition of its UID and
// resourceVersion; one gone already, or written since, is no error.
func (b *kubeBackend) deletePiece(ctx context.Context, l *coordinationv1.Lease) error {
	rctx, cancel := b.request(ctx)
	defer cancel()
	uid, rv := l.UID, l.ResourceVersion
	err := b.g.leases.Delete(rctx, l.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("kube: deleting %s: %w", l.Name, err)
	}
	return nil
}

// Fetch reads member's set with digest by one quorum list of its piece
// Leases, bounded by the request timeout and ctx, and answers its whole
// chunks (those of a session this replica's observer counts ended left
// out) and the list's position.
func (b *kubeBackend) Fetch(ctx context.Context, member, digest string) ([]ha.Chunk, int64, error) {
	ctx, cancel := b.request(ctx)
	defer cancel()
	ls, err := b.g.leases.List(ctx, metav1.ListOptions{LabelSelector: groupLabel + "=" + b.g.name + "," + kindLabel + "=" + kindChunk + "," + setLabel + "=" + memberHash(member) + "-" + digest})
	if err != nil {
		return nil, 0, fmt.Errorf("kube: reading %s's set %s: %w", member, digest, err)
	}
	at, err := strconv.ParseInt(ls.ResourceVersion, 10, 64)
	if err != nil {
		return nil, 0, fmt.Errorf("kube: reading %s's set %s: resourceVersion %q is not an integer", member, digest, ls.ResourceVersion)
	}
	v, _ := newGroupView(b.g, nil, nil)
	for i := range ls.Items {
		l := &ls.Items[i]
		if key, ok := v.pieceKey(l); ok && key.member == member && key.digest == digest {
			v.pieces[l.Name] = l
			if b.o.ended(holder(l)) {
				v.over[holder(l)] = true
			}
		}
	}
	var chunks []ha.Chunk
	for _, key := range v.chunkKeys() {
		if c := v.chunkRecord(key); c != nil {
			chunks = append(chunks, c.Chunk)
		}
	}
	return chunks, at, nil
}
