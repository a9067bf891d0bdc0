// The claims of one bucket: which session holds each of its names, and
// the token each was written at, as the bucket Lease's annotation
// carries them (DESIGN.md, "What is stored"), and the one rule by which
// every write changes them.

package kube

import (
	"bytes"
	"compress/flate"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"

	coordinationv1 "k8s.io/api/coordination/v1"
)

// claimsAnnotation is the annotation of a bucket Lease that holds its
// claims.
const claimsAnnotation = "ha.bgctl.dev/claims"

// maxClaimsBytes bounds a bucket's encoded claims: the API server refuses
// an object whose annotations exceed 256 KiB together, and the rest is
// left for the other annotations. At 100,000 names of 30 bytes over 256
// buckets a bucket's claims take about 4 KiB (TestClaimsOfAFullBucketFit).
const maxClaimsBytes = 224 << 10

// errClaimsTooLarge is returned by encodeClaims for claims that do not
// fit in maxClaimsBytes: the group needs more buckets.
var errClaimsTooLarge = errors.New("the claims of one bucket exceed the size of an annotation")

// bucketOf returns the bucket of name among n buckets: FNV-1a (64 bits)
// of the name, modulo n. Every version sharing a group must compute it
// alike (TestBucketOfIsStable): a name in two buckets could be claimed
// in both.
func bucketOf(name string, n int) int {
	const offset, prime = 14695981039346656037, 1099511628211
	h := uint64(offset)
	for i := 0; i < len(name); i++ {
		h ^= uint64(name[i])
		h *= prime
	}
	return int(h % uint64(n))
}

// entry is one name's claim: the session that holds it and its token.
type entry struct {
	// session is the holderIdentity of the holder's member Lease: its ID
	// and the incarnation of its session.
	session string
	// token is the bucket's leaseTransitions after the write that gave
	// the name to session. It only grows from one holder of a name to
	// the next, because each write that changes a holder increments the
	// bucket's counter (DESIGN.md, rule 10).
	token int64
}

// bucketClaims are the claims of one bucket, by name. A name absent is
// free.
type bucketClaims map[string]entry

// claimChange is what one writer asks of a bucket's claims, read at some
// resourceVersion; apply works out what holds, and the writer writes the
// result guarded by that version.
type claimChange struct {
	claim   []string          // names for this writer to hold
	release []string          // names this writer holds, to free
	give    map[string]string // names to hold by another session: name → session
	// othersOnly makes give leave the writer's own names alone: a
	// takeover gives only names free or held by ended sessions, since
	// the writer may be running a name it holds (it claimed it, or was
	// handed it, after the takeover was planned); its own names are
	// handed over only once their controllers stopped (rule 7).
	othersOnly bool
	// drop frees names whose entry still has the given token, whoever
	// holds them: name → token. A token names one holding of a name (it
	// grows from one holder of the name to the next), so a holding that
	// ended by its replica's own release, under a session live or not,
	// is freed, and a later one is left alone.
	drop map[string]int64
	// dropAt is drop by position (position): name → the position of the
	// holding to free. group.change resolves it into drop on the version
	// it writes on; position 0 (unknown) frees nothing.
	dropAt map[string]int64
}

// apply changes c as ch asks, for the writer of session me, and reports
// the names it claimed (now or before: a retry whose first answer was
// lost finds them its own) and whether c changed. ended reports whether
// a session is proven ended (DESIGN.md, rule 6); token is the value the
// bucket's leaseTransitions takes with the write, given to every entry
// the write creates. The rules, by what a name is before the write:
//
//	                    claim by me      release by me   give to s
//	free                me               -               s
//	held by me          me (unchanged)   free            s (hand-over; - if othersOnly)
//	held by ended x     me               -               s (takeover)
//	held by live x      -  (not got)     -               -
//
// So a name changes holder only when it is free, its holder gives it
// away, or its holder's session is proven ended; and the server's
// resourceVersion check makes the read and the write one step.
//
// A drop frees the name if its entry has the token named, whoever holds
// it, and is applied with the releases.
//
// The claims are applied first, then the releases and drops, then the gives, and
// got is computed from the claims as they end: a name of ch.claim is got
// only if c names me as its holder after the whole change. A change that
// claims a name and also releases or gives it (the caller's mistake, or
// two plans merged) is not refused: the later step wins, and the name is
// not reported got, so that no caller installs a name whose entry names
// another session, or none.
func (c bucketClaims) apply(me string, ch claimChange, ended func(session string) bool, token int64) (got []string, changed bool) {
	takeable := func(name string) (entry, bool) {
		h, held := c[name]
		return h, !held || h.session == me || ended(h.session)
	}
	for _, name := range ch.claim {
		h, ok := takeable(name)
		if !ok {
			continue
		}
		if h.session != me {
			c[name] = entry{session: me, token: token}
			changed = true
		}
	}
	for _, name := range ch.release {
		if h, held := c[name]; held && h.session == me {
			delete(c, name)
			changed = true
		}
	}
	for name, token := range ch.drop {
		if h, held := c[name]; held && h.token == token {
			delete(c, name)
			changed = true
		}
	}
	for _, name := range slices.Sorted(maps.Keys(ch.give)) {
		s := ch.give[name]
		if h, ok := takeable(name); ok && h.session != s && !(ch.othersOnly && h.session == me) {
			c[name] = entry{session: s, token: token}
			changed = true
		}
	}
	for _, name := range ch.claim {
		if h, held := c[name]; held && h.session == me && !slices.Contains(got, name) {
			got = append(got, name)
		}
	}
	return got, changed
}

// encodeClaims returns c as the annotation's value: the sessions, then
// each name (sorted) with the index of its session and its token, every
// string as a uvarint length and its bytes (a name may hold any byte),
// deflated and in base64. The same claims always give the same value.
func encodeClaims(c bucketClaims) (string, error) {
	raw := rawClaims(c)
	var z bytes.Buffer
	w, _ := flate.NewWriter(&z, flate.BestCompression) // the level is valid
	_, _ = w.Write(raw)                                // a bytes.Buffer does not fail
	_ = w.Close()
	out := base64.StdEncoding.EncodeToString(z.Bytes())
	if len(out) > maxClaimsBytes {
		return "", fmt.Errorf("%w: %d names take %d bytes, more than %d", errClaimsTooLarge, len(c), len(out), maxClaimsBytes)
	}
	return out, nil
}

// rawClaims returns c as encodeClaims lays it out, before compression.
func rawClaims(c bucketClaims) []byte {
	names := slices.Sorted(maps.Keys(c))
	index := map[string]uint64{}
	var sessions []string
	for _, name := range names {
		if _, ok := index[c[name].session]; !ok {
			index[c[name].session] = uint64(len(sessions))
			sessions = append(sessions, c[name].session)
		}
	}
	var raw []byte
	raw = binary.AppendUvarint(raw, uint64(len(sessions)))
	for _, s := range sessions {
		raw = appendString(raw, s)
	}
	raw = binary.AppendUvarint(raw, uint64(len(names)))
	for _, name := range names {
		raw = appendString(raw, name)
		raw = binary.AppendUvarint(raw, index[c[name].session])
		raw = binary.AppendUvarint(raw, uint64(c[name].token))
	}
	return raw
}

func appendString(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

// claimsOf returns the claims that bucket Lease l carries.
func claimsOf(l *coordinationv1.Lease) (bucketClaims, error) {
	return decodeClaims(l.Annotations[claimsAnnotation])
}

// setClaims writes c into bucket Lease l, for an update of l.
func setClaims(l *coordinationv1.Lease, c bucketClaims) error {
	v, err := encodeClaims(c)
	if err != nil {
		return fmt.Errorf("bucket %s: %w", l.Name, err)
	}
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	l.Annotations[claimsAnnotation] = v
	return nil
}

// errMalformedClaims is returned by decodeClaims for a value that
// encodeClaims did not write.
var errMalformedClaims = errors.New("malformed claims annotation")

// decodeClaims reverses encodeClaims; "" is a bucket with no claims.
func decodeClaims(v string) (bucketClaims, error) {
	c := bucketClaims{}
	if v == "" {
		return c, nil
	}
	z, err := base64.StdEncoding.DecodeString(v)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errMalformedClaims, err)
	}
	// Inflated at most to a bound well above what maxClaimsBytes can
	// carry, so that a hostile value cannot take the replica's memory.
	raw, err := io.ReadAll(io.LimitReader(flate.NewReader(bytes.NewReader(z)), 64<<20))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errMalformedClaims, err)
	}
	d := decoder{b: raw}
	count := d.uvarint()
	if count > uint64(len(d.b)) { // a session takes a byte at least
		d.err = fmt.Errorf("%d sessions in %d bytes", count, len(d.b))
	}
	sessions := make([]string, 0, min(count, uint64(len(d.b))))
	for range count {
		if d.err != nil {
			break
		}
		sessions = append(sessions, d.string())
	}
	for n := d.uvarint(); n > 0 && d.err == nil; n-- {
		name, s, token := d.string(), d.uvarint(), d.uvarint()
		if d.err == nil && s >= uint64(len(sessions)) {
			d.err = fmt.Errorf("session %d of %d", s, len(sessions))
		}
		if d.err == nil {
			c[name] = entry{session: sessions[s], token: int64(token)}
		}
	}
	if d.err == nil && len(d.b) > 0 {
		d.err = fmt.Errorf("%d bytes after the claims", len(d.b))
	}
	if d.err != nil {
		return nil, fmt.Errorf("%w: %v", errMalformedClaims, d.err)
	}
	return c, nil
}

// decoder reads what encodeClaims wrote; the first error stops it.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, k := binary.Uvarint(d.b)
	if k <= 0 {
		d.err = errors.New("truncated number")
		return 0
	}
	d.b = d.b[k:]
	return v
}

func (d *decoder) string() string {
	n := d.uvarint()
	if d.err == nil && n > uint64(len(d.b)) {
		d.err = errors.New("truncated string")
	}
	if d.err != nil {
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

// positionsAnnotation is the annotation of a bucket Lease that holds, for
// each token its entries carry but the current one, the resourceVersion
// of the write that set that token: the entry's position. An entry of the
// current token (leaseTransitions) is at the Lease's own resourceVersion.
// A write learns the resourceVersion of the previous write only as the
// precondition it is guarded by, so each write records the one before it.
const positionsAnnotation = "ha.bgctl.dev/positions"

// position returns the position of an entry of bucket Lease l with the
// given token: the resourceVersion, as an integer, of the write that gave
// it its holder. Since Kubernetes 1.35 the resourceVersions of one
// resource compare as integers across objects, so the positions of
// entries in different buckets order their writes. It answers 0 when l
// does not say (a token no entry carries, or a Lease written by hand).
func position(l *coordinationv1.Lease, token int64) int64 { return positions(l)(token) }

// positions returns position of l's tokens, decoding l's positions
// annotation once, the first time a token needs it: for the entries of
// a whole bucket.
func positions(l *coordinationv1.Lease) func(token int64) int64 {
	var earlier map[int64]int64
	return func(token int64) int64 {
		switch {
		case l == nil:
			return 0
		case token == int64(transitions(l)):
			rv, _ := strconv.ParseInt(l.ResourceVersion, 10, 64)
			return rv
		case earlier == nil:
			earlier = positionsOf(l)
		}
		return earlier[token]
	}
}

// positionsOf decodes l's positions annotation, "token=rv,…"; a pair that
// does not parse is left out.
func positionsOf(l *coordinationv1.Lease) map[int64]int64 {
	pos := map[int64]int64{}
	for pair := range strings.SplitSeq(l.Annotations[positionsAnnotation], ",") {
		t, rv, ok := strings.Cut(pair, "=")
		token, err1 := strconv.ParseInt(t, 10, 64)
		at, err2 := strconv.ParseInt(rv, 10, 64)
		if ok && err1 == nil && err2 == nil {
			pos[token] = at
		}
	}
	return pos
}

// setPositions writes into next, the version of a bucket Lease that
// replaces cur (nil: created) with claims c at leaseTransitions token,
// the positions of every token of c but token: cur's resourceVersion for
// cur's own token, else what cur recorded. It fails if cur's
// resourceVersion is not an integer (a server before 1.35).
func setPositions(next, cur *coordinationv1.Lease, c bucketClaims, token int64) error {
	used := map[int64]bool{}
	for _, e := range c {
		if e.token != token {
			used[e.token] = true
		}
	}
	var pairs []string
	if len(used) > 0 {
		rv, err := strconv.ParseInt(cur.ResourceVersion, 10, 64)
		if err != nil {
			return fmt.Errorf("resourceVersion %q is not an integer: %w", cur.ResourceVersion, err)
		}
		old := positionsOf(cur)
		for _, t := range slices.Sorted(maps.Keys(used)) {
			at := old[t]
			if t == int64(transitions(cur)) {
				at = rv
			}
			pairs = append(pairs, fmt.Sprintf("%d=%d", t, at))
		}
	}
	if len(pairs) == 0 {
		delete(next.Annotations, positionsAnnotation)
		return nil
	}
	if next.Annotations == nil {
		next.Annotations = map[string]string{}
	}
	next.Annotations[positionsAnnotation] = strings.Join(pairs, ",")
	return nil
}
