// The etcd backend's feed: a watch of the prefix on a gRPC stream of its
// own, its responses decoded into batches of changes, asked for its
// progress while it is quiet, and given up when it stays silent.

package etcd

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bgctl/controller/ha"
	"go.etcd.io/etcd/api/v3/mvccpb"
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
// etcdFeed.watcher).
const watchStreamKey = "bgctl-ha-watch"

// watchSeq numbers the view's watches in the process, whose replicas may
// share a client: no two watches share a stream.
var watchSeq atomic.Uint64

// errFeedSilent fails a feed that said nothing, neither an event nor a
// progress notification, for the silence limit (checkWatch): the loop
// lists again at once.
var errFeedSilent = fmt.Errorf("%w: the watch of the prefix heard nothing", ha.ErrFeedSilent)

// etcdFeed is the feed on etcd: one watch of the prefix, from a listing's
// revision. Its states: creating (etcd has not confirmed the watch yet;
// Watch waits for that on a goroutine of its own, as on a connection
// that stopped answering it would wait for ever), watching, and stopped.
// Its goroutine (run) owns the watch and the check; stop, called by the
// loop, ends it.
type etcdFeed struct {
	b    *etcdBackend // immutable
	from int64        // immutable: the revision the watch starts at
	out  chan ha.FeedBatch

	// ctx is the watch's, and carries its stream's metadata. It does not
	// derive from the epoch's context, whose end would cancel it together
	// with a progress request in flight (see stop); stop ends it.
	ctx     context.Context
	cancel  context.CancelFunc
	created chan clientv3.WatchChan // capacity 1: the creating goroutine's one send

	// Owned by run.
	heard time.Time    // the watch's start, or its last response
	check *time.Ticker // every Options.keepAliveEvery

	// asked is closed when the last progress request returned (nil: none
	// sent); askCancel ends that request. Written by run; read by stop
	// once run has returned (ran).
	asked     chan struct{}
	askCancel context.CancelFunc
	quit      chan struct{} // closed by stop: run returns
	ran       chan struct{} // closed as run returns

	// watcher is the watch's own: closing it takes down its gRPC stream
	// in every state, where cancelling the watch leaves a stream open
	// until the client closes when the watch was not confirmed yet, or
	// its stream was reconnecting. Closed by stop, on a goroutine counted
	// in wg (the epoch's), as Close waits for the stream's goroutines.
	watcher clientv3.Watcher
	wg      *sync.WaitGroup
}

// Watch watches the prefix from from, the revision the view was listed
// at. From from, not from+1: etcd answers a progress request only once
// the store has reached the Watch's start revision, which on a quiet
// store could take for ever; the events at from come again and change
// nothing, as the view holds their outcome already. TestQuietWatchIsKept
// fails with from+1, and with a progress request sent without the
// Watch's metadata.
func (b *etcdBackend) Watch(from int64, wg *sync.WaitGroup) ha.Feed {
	ctx := clientv3.WithRequireLeader(context.Background()) // replaces the outgoing metadata: first
	ctx = metadata.AppendToOutgoingContext(ctx, watchStreamKey, strconv.FormatUint(watchSeq.Add(1), 10))
	f := &etcdFeed{
		b:       b,
		from:    from,
		out:     make(chan ha.FeedBatch),
		created: make(chan clientv3.WatchChan, 1),
		heard:   time.Now(),
		check:   time.NewTicker(b.checkEvery),
		quit:    make(chan struct{}),
		ran:     make(chan struct{}),
		watcher: clientv3.NewWatcher(b.cli),
		wg:      wg,
	}
	f.ctx, f.cancel = context.WithCancel(ctx)
	wg.Add(2)
	go func() { // owned by the feed; joined through wg, once stop ended f.ctx
		defer wg.Done()
		f.created <- f.watcher.Watch(f.ctx, b.keys.all, clientv3.WithPrefix(), clientv3.WithRev(from))
	}()
	go f.run() // owned by the feed; joined by stop, and through wg
	return f
}

func (f *etcdFeed) Batches() <-chan ha.FeedBatch { return f.out }

// run forwards the watch's responses as batches, and checks the watch's
// silence every period; it sends a batch with an error, and returns,
// when the watch fails or stays silent.
func (f *etcdFeed) run() {
	defer f.wg.Done()
	defer close(f.ran)
	var ch clientv3.WatchChan
	created := f.created
	for {
		var b ha.FeedBatch
		select {
		case <-f.quit:
			return
		case c := <-created:
			ch, created = c, nil
			continue
		case wr, ok := <-ch:
			switch {
			case !ok:
				b.Err = errors.New("ha: the watch of the prefix ended")
			case wr.Err() != nil:
				b.Err = wr.Err()
			default:
				f.heard = time.Now()
				b = f.decode(wr)
			}
		case now := <-f.check.C:
			silent := now.Sub(f.heard)
			switch checkWatch(silent, f.b.checkEvery, f.b.silentLimit) {
			case askProgress:
				if ch != nil {
					f.askProgress()
				}
				continue
			case replaceWatch:
				f.b.log.Warn("watch of the prefix silent for too long (no event, no progress notification): listing again", "silent", silent.Round(time.Millisecond))
				b.Err = errFeedSilent
			default:
				continue
			}
		}
		select {
		case f.out <- b:
		case <-f.quit:
			return
		}
		if b.Err != nil {
			return
		}
	}
}

// decode makes a batch of a watch response: its events as changes, up
// to its last event's revision, or the header's of a progress
// notification, which etcd sends only once every watcher of the stream
// has been sent every event up to it. Never a response's header
// otherwise: a watcher more than 1,000 revisions behind gets etcd's
// catch-up batches, each of at most 1,000 revisions and each carrying the
// store's current revision, and a claim created after a batch's last
// event would look deleted (stepLocked's lost) while its creation is
// still on the way. A lease's end deletes its keys in one revision,
// which etcd never splits between responses: one response, one batch.
func (f *etcdFeed) decode(wr clientv3.WatchResponse) ha.FeedBatch {
	if wr.IsProgressNotify() {
		return ha.FeedBatch{At: wr.Header.Revision}
	}
	b := ha.FeedBatch{Changes: make([]ha.Change, 0, len(wr.Events))}
	for _, ev := range wr.Events {
		b.At = max(b.At, ev.Kv.ModRevision)
		if c, ok := f.b.keys.decode(ev.Kv, ev.Type != mvccpb.PUT); ok {
			b.Changes = append(b.Changes, c)
		}
	}
	return b
}

// watchAction is what the feed does with its watch at a check.
type watchAction uint8

const (
	keepWatch    watchAction = iota // it spoke lately
	askProgress                     // quiet: ask etcd where it stands
	replaceWatch                    // silent despite the requests: list again and watch anew
)

// checkWatch decides from how long the watch has said nothing, neither an
// event nor a progress notification: it asks for progress once the watch
// has been quiet for half a period, and replaces it once it has been
// silent for limit. The feed checks every period, (TTL − Margin)/4, with
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
func (f *etcdFeed) askProgress() {
	if f.asked != nil {
		select {
		case <-f.asked:
		default:
			return
		}
	}
	// The request's context carries the watch's metadata, so the client
	// sends it on the watch's stream; with any other metadata it would
	// open a stream of its own and ask there.
	ctx, cancel := context.WithTimeout(f.ctx, f.b.requestTimeout)
	done := make(chan struct{})
	f.asked, f.askCancel = done, cancel
	f.wg.Add(1)
	go func() { // owned by the feed; joined by stop, and through wg
		defer f.wg.Done()
		defer close(done)
		defer cancel()
		if err := f.watcher.RequestProgress(ctx); err != nil {
			f.b.log.Debug("requesting the watch's progress", "error", err)
		}
	}()
}

// Stop ends the feed. It ends run, then the progress request in flight,
// and waits for it before it ends the watch: a request that finds its
// stream gone makes the client open a new one, which would idle until
// the client closes. (A stream that etcd ends on its own, for want of a
// leader, can still race with a request; the idle stream it leaves ends
// with the client.)
func (f *etcdFeed) Stop() {
	close(f.quit)
	<-f.ran
	f.check.Stop()
	if f.askCancel != nil {
		f.askCancel()
		<-f.asked
	}
	f.cancel()
	f.wg.Add(1)
	go func() { // owned by the feed; joined through wg
		defer f.wg.Done()
		_ = f.watcher.Close()
	}()
}
