// What a replica's backend does with the group's feed: its observer
// stamps the member Leases, and the bucket versions it brings are where
// the next writes start.

package kube

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
)

// observe takes in one change of the group's feed: the observer sees it
// (observer.observe), and the backend keeps the latest version of every
// bucket (where claims start: kubeBackend.known) and every member Lease
// (the live members, for takeOver).
func (b *kubeBackend) observe(ch change) {
	b.o.observe(ch)
	switch ch.kind {
	case changeSnapshot:
		b.mu.Lock()
		clear(b.members)
		b.mu.Unlock()
		for _, l := range ch.leases {
			b.keep(l, false)
		}
	case changePut:
		b.keep(ch.lease, false)
	case changeDelete:
		b.keep(ch.lease, true)
	}
}

// keep records Lease l of the group, from the feed: a bucket as its
// latest version seen (remember), a member Lease under its member ID, or
// removed from the members when deleted.
func (b *kubeBackend) keep(l *coordinationv1.Lease, deleted bool) {
	if !isMember(l) {
		if i, ok := b.bucketIndex(l.Name); ok && !deleted {
			b.remember(i, l)
		}
		return
	}
	id, ok := strings.CutPrefix(l.Name, b.g.name+memberInfix)
	if !ok {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if deleted {
		if cur := b.members[id]; cur != nil && cur.UID == l.UID {
			delete(b.members, id)
		}
		return
	}
	b.members[id] = l
}

// bucketIndex returns i for the name of bucket i's Lease.
func (b *kubeBackend) bucketIndex(name string) (int, bool) {
	s, ok := strings.CutPrefix(name, b.g.name+bucketInfix)
	if !ok {
		return 0, false
	}
	i, err := strconv.Atoi(s)
	if err != nil || i < 0 || i >= b.g.buckets {
		return 0, false
	}
	return i, true
}

// run runs the group's feed into observe, and every D/8 has the observer
// prove ended the sessions whose stamped version is due
// (observer.expire), until ctx ends or the feed fails; it answers the
// feed's error (ctx's when it was stopped). Its caller owns it; it
// leaves no goroutine behind.
func (b *kubeBackend) run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	fed := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Go(func() { // joined below
		fed <- b.g.feed(ctx, "", b.observe)
		cancel()
	})
	defer wg.Wait()
	tick := time.NewTicker(b.g.duration / 8)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			wg.Wait()
			return <-fed
		case <-tick.C:
			b.proveDue(ctx)
		}
	}
}
