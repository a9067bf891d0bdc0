// The view's watch: a watch of the prefix on a gRPC stream of its own,
// asked for its progress while it is quiet, and replaced when it stays
// silent.

package ha

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/metadata"
)

// watchStreamKey is the gRPC metadata key that gives each of the view's
// watches a stream of its own. The etcd client carries every watch whose
// context has the same metadata on one gRPC stream, and sends a progress
// request on the stream its context's metadata names; etcd answers it
// only once every watch on that stream has caught up. A stream of its own
// keeps the answer from waiting on a watch of the service's. Each watch
// also has a Watcher of its own, whose Close takes its stream down (see
// viewWatch.watcher).
const watchStreamKey = "bgctl-ha-watch"

// watchSeq numbers the view's watches in the process, whose replicas may
// share a client: no two watches share a stream.
var watchSeq atomic.Uint64

// viewWatch is the loop's watch of the prefix, one per relist. Its states:
// creating (ch nil: etcd has not confirmed the watch yet; Watch waits for
// that on a goroutine of its own, as on a connection that stopped
// answering it would wait for ever), watching (ch set), and stopped. Owned
// by the loop goroutine; the goroutines it starts touch only the channels
// they are given.
type viewWatch struct {
	// ctx is the watch's, and carries its stream's metadata. It does not
	// derive from the epoch's context, whose end would cancel it together
	// with a progress request in flight (see stop); stop, which endEpoch
	// calls through ep.watchCancel, ends it.
	ctx     context.Context
	cancel  context.CancelFunc
	created chan clientv3.WatchChan // capacity 1: the creating goroutine's one send; nil once received
	ch      clientv3.WatchChan      // nil while creating
	heard   time.Time               // the watch's start, or its last response
	check   *time.Ticker            // every Options.keepAliveEvery

	asked     chan struct{}      // closed when the last progress request returned; nil: none sent
	askCancel context.CancelFunc // ends that request

	// watcher is the watch's own: closing it takes down its gRPC stream
	// in every state, where cancelling the watch leaves a stream open
	// until the client closes when the watch was not confirmed yet, or
	// its stream was reconnecting. Closed by stop, on a goroutine counted
	// in wg (the epoch's), as Close waits for the stream's goroutines.
	watcher clientv3.Watcher
	wg      *sync.WaitGroup
}

// startWatch watches the prefix from rev, the revision the view was
// listed at. From rev, not rev+1: etcd answers a progress request only
// once the store has reached the watch's start revision, which on a quiet
// store could take for ever; the events at rev come again and change
// nothing, as the view holds their outcome already. TestQuietWatchIsKept
// fails with rev+1, and with a progress request sent without the watch's
// metadata.
func (r *Replica) startWatch(ep *epoch, rev int64) *viewWatch {
	ctx := clientv3.WithRequireLeader(context.Background()) // replaces the outgoing metadata: first
	ctx = metadata.AppendToOutgoingContext(ctx, watchStreamKey, strconv.FormatUint(watchSeq.Add(1), 10))
	w := &viewWatch{
		created: make(chan clientv3.WatchChan, 1),
		heard:   time.Now(),
		check:   time.NewTicker(r.opts.keepAliveEvery()),
		watcher: clientv3.NewWatcher(r.cli),
		wg:      &ep.wg,
	}
	w.ctx, w.cancel = context.WithCancel(ctx)
	ep.wg.Add(1)
	go func() { // owned by the loop; joined by endEpoch through ep.wg, once stop ended w.ctx
		defer ep.wg.Done()
		w.created <- w.watcher.Watch(w.ctx, r.keys.all, clientv3.WithPrefix(), clientv3.WithRev(rev))
	}()
	return w
}

// watchAction is what the loop does with its watch at a check.
type watchAction uint8

const (
	keepWatch    watchAction = iota // it spoke lately
	askProgress                     // quiet: ask etcd where it stands
	replaceWatch                    // silent despite the requests: list again and watch anew
)

// checkWatch decides from how long the watch has said nothing, neither an
// event nor a progress notification: it asks for progress once the watch
// has been quiet for half a period, and replaces it once it has been
// silent for limit. The loop checks every period, (TTL − Margin)/4, with
// limit TTL − Margin. With TTL 10s and Margin 2.5s (period 1.875s, limit
// 7.5s), a quiet but healthy watch is asked at every check and answers
// within a round trip; one that stopped delivering is asked four times
// and replaced at the first check 7.5s or more after it last spoke: 7.5s
// to 9.4s. A watch that is catching up does not answer progress requests
// (etcd holds the answer until it caught up) but sends events, which
// count.
//
// Why TTL − Margin: a frozen view delays takeovers (a member's departure
// unseen) by about as long as a crash does, TTL, and no more; a shorter
// limit would list the whole prefix again each time a loaded etcd is slow
// to answer.
func checkWatch(silent, period, limit time.Duration) watchAction {
	switch {
	case silent >= limit:
		return replaceWatch
	case silent >= period/2:
		return askProgress
	}
	return keepWatch
}

// askProgress requests a progress notification on the watch's stream,
// from a goroutine: the request waits until the client's stream goroutine
// takes it, which a stream being reopened delays. One request at a time.
func (r *Replica) askProgress(ep *epoch, w *viewWatch) {
	if w.asked != nil {
		select {
		case <-w.asked:
		default:
			return
		}
	}
	// The request's context carries the watch's metadata, so the client
	// sends it on the watch's stream; with any other metadata it would
	// open a stream of its own and ask there.
	ctx, cancel := context.WithTimeout(w.ctx, r.opts.RequestTimeout)
	done := make(chan struct{})
	w.asked, w.askCancel = done, cancel
	ep.wg.Add(1)
	go func() { // owned by the loop; joined by stop, and by endEpoch through ep.wg
		defer ep.wg.Done()
		defer close(done)
		defer cancel()
		if err := w.watcher.RequestProgress(ctx); err != nil {
			r.log.Debug("requesting the watch's progress", "error", err)
		}
	}()
}

// stop ends the watch. It ends the progress request in flight and waits
// for it first: a request that finds its stream gone makes the client open
// a new one, which would idle until the client closes. (A stream that etcd
// ends on its own, for want of a leader, can still race with a request;
// the idle stream it leaves ends with the client.)
func (w *viewWatch) stop() {
	w.check.Stop()
	if w.askCancel != nil {
		w.askCancel()
		<-w.asked
	}
	w.cancel()
	w.wg.Add(1)
	go func() { // owned by the loop; joined by endEpoch through ep.wg
		defer w.wg.Done()
		_ = w.watcher.Close()
	}()
}

// dropWatch stops the epoch's watch; the loop lists and watches anew.
func (r *Replica) dropWatch(ep *epoch) {
	ep.watch.stop()
	ep.watch, ep.watchCancel = nil, nil
}

// checkWatchNow is the loop's periodic check of its watch.
func (r *Replica) checkWatchNow(ep *epoch, now time.Time) {
	w := ep.watch
	silent := now.Sub(w.heard)
	switch checkWatch(silent, r.opts.keepAliveEvery(), r.opts.window()) {
	case askProgress:
		if w.ch != nil {
			r.askProgress(ep, w)
		}
	case replaceWatch:
		r.log.Warn("watch of the prefix silent for too long (no event, no progress notification): listing again", "silent", silent.Round(time.Millisecond))
		r.dropWatch(ep)
	}
}
