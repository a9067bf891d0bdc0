// Writing claims: one session's change of the claims of one bucket, read
// with a quorum read, worked out by the claims' one rule (claims.go) on
// what this replica's observer knows of the holders' ends, and written
// by one update guarded by the resourceVersion read.

package kube

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A write that loses to another writer's (409) is retried from a new
// read after a pause drawn at random in [0, b), b doubling from
// minChangeBackoff up to maxChangeBackoff: writers that conflicted once
// spread out instead of meeting again, however many there are (a join:
// every holder hands over its part while the joiner claims). Retries go
// on until the change's context ends.
const (
	minChangeBackoff = 10 * time.Millisecond
	maxChangeBackoff = 500 * time.Millisecond
)

// errBucketContended is change's answer when its context ended while it
// was waiting to retry a write that lost to another writer's. It wraps
// the context's error too.
var errBucketContended = errors.New("kube: the bucket was written by another on every try until the context ended")

// changeResult is what a change of one bucket's claims left.
type changeResult struct {
	// got holds the names of the change's claim that the session holds
	// after it, each with its token: the bucket's leaseTransitions when
	// its entry was written (by this change, or by an earlier one for a
	// name already held).
	got map[string]int64
	// lease is the bucket Lease as the change's write left it, or as
	// read when nothing needed writing; nil when the bucket is absent
	// and nothing needed writing.
	lease *coordinationv1.Lease
	// wrote says whether the change wrote the bucket.
	wrote bool
	// claims are the bucket's claims after the change (as read, when
	// nothing needed writing).
	claims bucketClaims
}

// change makes the change ch to the claims of bucket i for the session
// (claimChange, bucketClaims.apply), and answers the names of ch.claim it
// holds after it with their tokens.
//
// It reads the bucket with a quorum read; has the observer o learn of
// every session that holds a name ch claims or gives (a quorum read of
// the member Lease of each it knows nothing of); applies ch with o's
// judgement of which sessions ended (observer.ended); and writes the
// result, if it changed anything, with one update guarded by the
// resourceVersion read, which bumps spec.leaseTransitions by one (the
// token of every entry it writes) and sets holderIdentity to the
// session's, for people reading the Lease. A bucket that is absent is
// created with the result, leaseTransitions 0 and the group's labels. A
// conflict (another writer came between the read and the write, or
// created the bucket first) starts over from a new read after a random
// pause (minChangeBackoff), for as long as ctx lasts (then
// errBucketContended, or the error of the request ctx cut short). A
// change that changes
// nothing writes nothing. A bucket whose claims do not decode
// (errMalformedClaims) is left as it is.
//
// A session that is lost or ended reads and writes nothing
// (errSessionLost, ha.ErrSessionEnded), as far as it knows before each read
// and before each write: a session lost
// while its write is in flight (an observer deleted its member Lease in
// between) may still have its entry written. So the caller, the shared
// part of ha, must install a name it got only if its own fence is still
// open when the answer comes (DESIGN.md, rule 6): that fence passed
// before the observer's delete, and others take the name once they see
// the session ended.
//
// The bucket's leaseTransitions grows by one with every write that
// changes it, so a name's token grows from one holder to the next (rule
// 10). A sample, one bucket, names n and m:
//
//	create by A, claim n            leaseTransitions 0   n: A@0
//	B claims m                      1                    n: A@0, m: B@1
//	A releases n                    2                    m: B@1
//	B claims n                      3                    n: B@3, m: B@1
//	B's session proven ended; A claims n and m
//	                                4                    n: A@4, m: A@4
func (s *session) change(ctx context.Context, o *observer, i int, ch claimChange) (changeResult, error) {
	return s.g.change(ctx, o, i, ch, s.writer(), nil)
}

// writer is who makes a change: the session identity its claims and
// releases name, and a check that it may still write, made before each
// read and each write (nil: always).
type writer struct {
	identity string
	check    func() error
}

// writer returns the session as the writer of its changes: they stop
// once it is lost or ended.
func (s *session) writer() writer { return writer{identity: s.identity, check: s.stateErr} }

// known is a version of a bucket Lease the caller has already seen (the
// feed's, its own last write's, or a list's): lease, or nil when the
// bucket was known absent. again, when not nil, is how change reads the bucket
// when the version known would write nothing: a quorum read shared by
// the buckets of one call (claim's listing), in place of a read of its
// own.
type known struct {
	lease *coordinationv1.Lease
	again func(ctx context.Context, name string) (*coordinationv1.Lease, error) // nil (absent), or the bucket named as a quorum read sent after the caller began found it
}

// change is session.change for any writer w; from, when not nil, is the
// version the first try starts from instead of a quorum read: the write
// is guarded by its resourceVersion all the same, so a stale one costs a
// conflict, and only then a read. (So a replica whose feed is current
// writes a bucket with one request, not two.) A change that would write
// nothing on the version known reads the bucket all the same and works
// it out again: the version known may be behind, and a name found
// already held, or already free, must be so now: from.again reads it, if
// set, else a quorum read of the bucket.
func (g *group) change(ctx context.Context, o *observer, i int, ch claimChange, w writer, from *known) (changeResult, error) {
	if i < 0 || i >= g.buckets {
		return changeResult{}, fmt.Errorf("kube: bucket %d out of [0, %d)", i, g.buckets)
	}
	name := g.bucketName(i)
	check := func(what string) error {
		if w.check == nil {
			return nil
		}
		if err := w.check(); err != nil {
			return fmt.Errorf("%w: not %s %s", err, what, name)
		}
		return nil
	}
	again := false // the first try would have written nothing on the version known: read it by from.again
	for try := 0; ; try++ {
		if try > 0 && !again {
			if err := changeBackoff(ctx, try); err != nil {
				return changeResult{}, fmt.Errorf("%w: %s, %d tries: %w", errBucketContended, name, try, err)
			}
		}
		if err := check("changing"); err != nil {
			return changeResult{}, err
		}
		var cur *coordinationv1.Lease
		var err error
		switch {
		case try == 0 && from != nil:
			cur = from.lease.DeepCopy() // DeepCopy of nil is nil: absent
		case again:
			again = false
			if cur, err = from.again(ctx, name); err != nil {
				return changeResult{}, fmt.Errorf("kube: reading %s: %w", name, err)
			}
			cur = cur.DeepCopy()
		default:
			if cur, err = g.leases.Get(ctx, name, metav1.GetOptions{}); apierrors.IsNotFound(err) { // no resourceVersion: a quorum read
				cur = nil
			} else if err != nil {
				return changeResult{}, fmt.Errorf("kube: reading %s: %w", name, err)
			}
		}
		absent := cur == nil
		claims := bucketClaims{}
		token := int64(0) // a created bucket's leaseTransitions
		if !absent {
			if claims, err = claimsOf(cur); err != nil {
				return changeResult{}, fmt.Errorf("kube: %s: %w", name, err)
			}
			token = int64(transitions(cur)) + 1
			if token > math.MaxInt32 {
				// Some 68 years of a write a second to one bucket.
				return changeResult{}, fmt.Errorf("kube: %s: leaseTransitions cannot grow past %d", name, int32(math.MaxInt32))
			}
		}
		if err := o.learn(ctx, holdersAsked(claims, w.identity, ch)); err != nil {
			return changeResult{}, err
		}
		got, changed := claims.apply(w.identity, resolveDrops(ch, claims, cur), o.ended, token)
		res := changeResult{got: make(map[string]int64, len(got)), claims: claims}
		for _, n := range got {
			res.got[n] = claims[n].token
		}
		if !changed && try == 0 && from != nil {
			again = from.again != nil
			continue // the version known may be behind: a change that writes nothing reads to be sure
		}
		if !changed {
			res.lease = cur
			return res, nil
		}
		if err := check("writing"); err != nil {
			return changeResult{}, err
		}
		var next *coordinationv1.Lease
		if absent {
			next = &coordinationv1.Lease{
				ObjectMeta: metav1.ObjectMeta{Name: name, Labels: g.labels(kindBucket)},
				Spec:       coordinationv1.LeaseSpec{LeaseTransitions: new(int32(0))},
			}
		} else {
			next = cur.DeepCopy()
			next.Spec.LeaseTransitions = new(int32(token))
		}
		next.Spec.HolderIdentity = new(w.identity) // for people: the last writer
		if err := setClaims(next, claims); err != nil {
			return changeResult{}, err
		}
		if err := setPositions(next, cur, claims, token); err != nil {
			return changeResult{}, fmt.Errorf("kube: %s: %w", name, err)
		}
		var wrote *coordinationv1.Lease
		if absent {
			wrote, err = g.leases.Create(ctx, next, metav1.CreateOptions{})
		} else {
			wrote, err = g.leases.Update(ctx, next, metav1.UpdateOptions{})
		}
		if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) {
			continue
		}
		if err != nil {
			return changeResult{}, fmt.Errorf("kube: writing %s: %w", name, err)
		}
		res.lease, res.wrote = wrote, true
		return res, nil
	}
}

// resolveDrops returns ch with its dropAt resolved, on bucket Lease cur
// and its claims c, into drop: each name whose entry is at the position
// named is to be freed by its token.
func resolveDrops(ch claimChange, c bucketClaims, cur *coordinationv1.Lease) claimChange {
	if len(ch.dropAt) == 0 {
		return ch
	}
	drop := maps.Clone(ch.drop)
	if drop == nil {
		drop = map[string]int64{}
	}
	for n, at := range ch.dropAt {
		if e, held := c[n]; held && at != 0 && position(cur, e.token) == at {
			drop[n] = e.token
		}
	}
	ch.drop, ch.dropAt = drop, nil
	return ch
}

// changeBackoff waits before the given retry (1 for the first) of a
// change whose write lost: a time drawn at random in [0, b), b =
// minChangeBackoff·2^(retry−1), at most maxChangeBackoff. It answers
// ctx's error if ctx ends first.
func changeBackoff(ctx context.Context, retry int) error {
	b := maxChangeBackoff
	if retry < 16 {
		b = min(minChangeBackoff<<(retry-1), maxChangeBackoff)
	}
	t := time.NewTimer(rand.N(b))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// holdersAsked returns the sessions other than me that hold a name ch
// claims or gives: those whose end the rule will ask about.
func holdersAsked(c bucketClaims, me string, ch claimChange) []string {
	ids := map[string]bool{}
	for _, n := range slices.Concat(ch.claim, slices.Collect(maps.Keys(ch.give))) {
		if h, held := c[n]; held && h.session != me {
			ids[h.session] = true
		}
	}
	return slices.Sorted(maps.Keys(ids))
}

// holder returns the Lease's holderIdentity, "" for none.
func holder(l *coordinationv1.Lease) string {
	if l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// transitions returns the Lease's leaseTransitions, 0 for none.
func transitions(l *coordinationv1.Lease) int32 {
	if l.Spec.LeaseTransitions == nil {
		return 0
	}
	return *l.Spec.LeaseTransitions
}
