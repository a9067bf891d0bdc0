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
//	held by me          me (unchanged)   free            s (hand-over)
//	held by ended x     me               -               s (takeover)
//	held by live x      -  (not got)     -               -
//
// So a name changes holder only when it is free, its holder gives it
// away, or its holder's session is proven ended; and the server's
// resourceVersion check makes the read and the write one step.
//
// The claims are applied first, then the releases, then the gives, and
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
	for _, name := range slices.Sorted(maps.Keys(ch.give)) {
		s := ch.give[name]
		if h, ok := takeable(name); ok && h.session != s {
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
	var z bytes.Buffer
	w, _ := flate.NewWriter(&z, flate.BestCompression) // the level is valid
	_, _ = w.Write(raw)                                // a bytes.Buffer does not fail
	_ = w.Close()
	out := base64.StdEncoding.EncodeToString(z.Bytes())
	if len(out) > maxClaimsBytes {
		return "", fmt.Errorf("%w: %d names take %d bytes, more than %d", errClaimsTooLarge, len(names), len(out), maxClaimsBytes)
	}
	return out, nil
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
