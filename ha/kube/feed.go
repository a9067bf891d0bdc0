// The feed: every change to a group's Leases, member and bucket, in the
// order the server committed them, from a listing then a watch, listing
// again when the watch's history has expired.

package kube

import (
	"context"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// changeKind says what a change reports.
type changeKind int

const (
	// changeSnapshot: every Lease of the group at one resourceVersion,
	// from a listing. It replaces all the receiver knew: what is not in
	// it is gone (deleted while no watch ran).
	changeSnapshot changeKind = iota
	// changePut: a Lease created or written.
	changePut
	// changeDelete: a Lease deleted; the Lease is its last version.
	changeDelete
)

// change is one thing the feed reports.
type change struct {
	kind   changeKind
	leases []*coordinationv1.Lease // changeSnapshot: the group's Leases
	lease  *coordinationv1.Lease   // changePut, changeDelete
	rv     string                  // the resourceVersion the receiver is at after it
	at     time.Time               // monotonic: when the feed received it, after its commit
}

// isMember reports whether l is a member Lease (else it is a bucket).
func isMember(l *coordinationv1.Lease) bool { return l.Labels[kindLabel] == kindMember }

// feed reports the group's Leases to handle, in commit order, on the
// caller's goroutine, until ctx is done (then it answers ctx's error) or
// a request fails otherwise. It starts with a watch from the
// resourceVersion from, or with a listing when from is "". When the
// server answers that the watch's resourceVersion is too old (410 Gone,
// its history compacted), it lists again, and reports the listing as a
// snapshot, which may skip versions but is itself consistent. When a
// watch ends without error (the server times watches out), it watches
// again from the last resourceVersion reported, or bookmarked.
//
// Each change is received before handle is called, and handle is called
// before the next is received: a slow handle slows the feed (the watch's
// buffer, then the server's), and makes its receipt times later, which
// only ever delays expiry (observe.go).
func (g *group) feed(ctx context.Context, from string, handle func(change)) error {
	selector := groupLabel + "=" + g.name
	rv := from
	for {
		if rv == "" {
			list, err := g.leases.List(ctx, metav1.ListOptions{LabelSelector: selector})
			if err != nil {
				return feedErr(ctx, fmt.Errorf("kube: listing group %s: %w", g.name, err))
			}
			leases := make([]*coordinationv1.Lease, len(list.Items))
			for i := range list.Items {
				leases[i] = &list.Items[i]
			}
			rv = list.ResourceVersion
			handle(change{kind: changeSnapshot, leases: leases, rv: rv, at: time.Now()})
		}
		w, err := g.leases.Watch(ctx, metav1.ListOptions{LabelSelector: selector, ResourceVersion: rv, AllowWatchBookmarks: true})
		if isExpired(err) {
			rv = ""
			continue
		}
		if err != nil {
			return feedErr(ctx, fmt.Errorf("kube: watching group %s from %s: %w", g.name, rv, err))
		}
		next, err := drain(w, rv, handle)
		w.Stop()
		if err != nil {
			return feedErr(ctx, fmt.Errorf("kube: watching group %s: %w", g.name, err))
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		rv = next
	}
}

// drain reports the events of w to handle until it ends, and answers the
// resourceVersion to watch from next: the last one reported or
// bookmarked, or "" to list again (the watch expired). Errors other than
// expiry end the feed.
func drain(w watch.Interface, rv string, handle func(change)) (string, error) {
	for ev := range w.ResultChan() {
		at := time.Now()
		switch ev.Type {
		case watch.Added, watch.Modified, watch.Deleted:
			l, ok := ev.Object.(*coordinationv1.Lease)
			if !ok {
				return "", fmt.Errorf("a %s event of a %T", ev.Type, ev.Object)
			}
			rv = l.ResourceVersion
			kind := changePut
			if ev.Type == watch.Deleted {
				kind = changeDelete
			}
			handle(change{kind: kind, lease: l, rv: rv, at: at})
		case watch.Bookmark:
			if l, ok := ev.Object.(*coordinationv1.Lease); ok {
				rv = l.ResourceVersion
			}
		case watch.Error:
			err := apierrors.FromObject(ev.Object)
			if isExpired(err) {
				return "", nil
			}
			return "", err
		}
	}
	return rv, nil
}

// isExpired reports whether err is the server's answer that a
// resourceVersion is older than the history it keeps.
func isExpired(err error) bool {
	return err != nil && (apierrors.IsResourceExpired(err) || apierrors.IsGone(err))
}

// feedErr returns ctx's error when ctx is done (the feed was stopped,
// not broken), else err.
func feedErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}
