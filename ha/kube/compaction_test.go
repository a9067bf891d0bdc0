// Compaction and relists: whole replicas on a kube-apiserver whose etcd
// compacts every two seconds, with its watch cache and without, whose
// watches stall and end, so that each is made again from a version the
// server may have compacted (410 Gone): the feeds list again, and no name
// stops, runs twice or loses its fence meanwhile.

package kube

import (
	"bytes"
	"context"
	"io"
	"maps"
	"net/http"
	"sync"
	"testing"
	"time"
)

// goneEvent is in the message of a watch stream's error event that says
// the version it was asked to start from is older than the history the
// server keeps (410, Expired), whatever the stream's encoding: etcd's
// watch says "The resourceVersion for the provided watch is too old.",
// the watch cache "too old resource version: <asked> (<oldest>)".
const goneEvent = "too old"

// stallable is a group's transport whose watch streams the test can
// stall, then end: as a connection that delivers nothing for a while,
// then closes cleanly (a load balancer's idle timeout, an API server
// going away), after which the feed watches again from the last version
// it saw. It counts, by replica, watches, lists, and the 410 Gone
// answers to watches. Its fields are guarded by mu.
type stallable struct {
	mu     sync.Mutex
	gate   chan struct{}  // non-nil while the watches are stalled; closed when they end
	counts map[string]int // "<replica> watch|list|gone" → how many
}

func newStallable() *stallable { return &stallable{counts: map[string]int{}} }

// stall holds every watch stream's next read, from now until end.
func (s *stallable) stall() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gate == nil {
		s.gate = make(chan struct{})
	}
}

// end ends every stalled watch stream, as if its connection had closed,
// and lets the watches made from now on through.
func (s *stallable) end() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gate != nil {
		close(s.gate)
		s.gate = nil
	}
}

// stalled returns the gate a read waits for, or nil.
func (s *stallable) stalled() chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gate
}

func (s *stallable) count(id, what string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.counts[id+" "+what]++
}

// snapshot returns a copy of the counts.
func (s *stallable) snapshot() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.counts)
}

// sumOf returns the count of what over the replicas ids in counts.
func sumOf(counts map[string]int, what string, ids ...string) int {
	n := 0
	for _, id := range ids {
		n += counts[id+" "+what]
	}
	return n
}

// transport returns replica id's rt, stalled and counted by s.
func (s *stallable) transport(id string, rt http.RoundTripper) http.RoundTripper {
	return stallTransport{rt: rt, id: id, s: s}
}

// stallTransport is replica id's transport under s. Immutable.
type stallTransport struct {
	rt http.RoundTripper
	id string
	s  *stallable
}

func (t stallTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	kind := requestKind(req)
	if kind == "watch" || kind == "list" {
		t.s.count(t.id, kind)
	}
	resp, err := t.rt.RoundTrip(req)
	if err != nil || kind != "watch" {
		return resp, err
	}
	if resp.StatusCode == http.StatusGone {
		t.s.count(t.id, "gone")
		return resp, nil
	}
	resp.Body = &stallBody{rc: resp.Body, id: t.id, s: t.s, closed: make(chan struct{})}
	return resp, nil
}

// stallBody is a watch stream under s: a read waits while s stalls the
// watches, and ends the stream when s ends them. It counts an error
// event of 410 in s. Read by one goroutine at a time, as a body is;
// Close may come from another.
type stallBody struct {
	rc     io.ReadCloser
	id     string // the replica
	s      *stallable
	tail   []byte // the last len(goneEvent)-1 bytes read
	once   sync.Once
	closed chan struct{} // closed by Close
}

func (b *stallBody) Read(p []byte) (int, error) {
	if gate := b.s.stalled(); gate != nil {
		select {
		case <-gate:
		case <-b.closed:
		}
		return 0, io.EOF
	}
	n, err := b.rc.Read(p)
	if n > 0 {
		seen := append(b.tail, p[:n]...)
		if bytes.Contains(seen, []byte(goneEvent)) {
			b.s.count(b.id, "gone")
		}
		b.tail = append(b.tail[:0], seen[max(0, len(seen)-len(goneEvent)+1):]...)
	}
	return n, err
}

func (b *stallBody) Close() error {
	b.once.Do(func() { close(b.closed) })
	return b.rc.Close()
}

// compactEvery is how often the test's kube-apiservers compact their
// etcd; stallFor is how long a stall lasts: more than two intervals, so
// that the version a stalled watch last saw is compacted when it ends
// (the API server compacts, each interval, to the revision it noted at
// the previous one).
const (
	compactEvery = 2 * time.Second
	stallFor     = 3 * compactEvery
)

// Three replicas on a kube-apiserver of their own whose etcd compacts
// every two seconds go through two rounds of their watches stalling for
// three compactions, then ending: each watch is made again from the
// version it last saw. Without the watch cache, the server answers 410
// Gone, and each replica's feed lists again; with it, the cache still
// holds those versions. Either way, every name keeps running where it
// ran (no name starts again), no fence passes, nothing runs twice at
// once, and the feeds work on: a graceful Leave's names run elsewhere at
// once.
func TestReplicasThroughCompactionAndRelists(t *testing.T) {
	t.Parallel() // servers of its own
	for _, tc := range []struct {
		name     string
		flags    []string
		wantGone bool // each replica's re-made watch is answered 410, and it lists again
	}{
		{"watch cache", nil, false},
		{"no watch cache", []string{"--watch-cache=false"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel() // servers of its own
			c := newCluster(t, append([]string{"--etcd-compaction-interval=" + compactEvery.String()}, tc.flags...)...)
			g := newKubeReplicasOn(t, c, 30)
			g.ttl = 10 * time.Second // a stall is shorter than D: what it costs is the relist alone
			st := newStallable()
			g.wrap = st.transport
			ids := []string{"a", "b", "c"}
			for _, id := range ids {
				g.join(id)
			}
			g.waitPlaced("three replicas placing", 30*time.Second, ids...)
			placed := g.mark()

			for round := range 2 {
				before := st.snapshot()
				st.stall()
				time.Sleep(stallFor) // the fault's length: history compacted past what the watches saw
				st.end()
				ended := time.Now()
				// Each replica watches again; without the cache, its watch is
				// answered 410, its feed lists, ha lists, and the feed
				// watches from that listing: two watches and two lists.
				done := func(got map[string]int) bool {
					for _, id := range ids {
						d := func(what string) int { return got[id+" "+what] - before[id+" "+what] }
						if d("watch") < 1 || tc.wantGone && (d("gone") < 1 || d("list") < 2 || d("watch") < 2) {
							return false
						}
					}
					return true
				}
				for got := st.snapshot(); !done(got); got = st.snapshot() {
					if time.Since(ended) > 20*time.Second {
						t.Fatalf("round %d: 20 s after the stalls ended: %v, from %v; want each replica to watch again and, without the watch cache, to be answered 410 and list again", round, got, before)
					}
					time.Sleep(20 * time.Millisecond) // a real server's time: polled, loosely bounded
				}
				got := st.snapshot()
				t.Logf("round %d: within %v of the stalls' end, %d watches made, %d answered 410, %d lists", round, time.Since(ended).Round(time.Millisecond),
					sumOf(got, "watch", ids...)-sumOf(before, "watch", ids...), sumOf(got, "gone", ids...)-sumOf(before, "gone", ids...), sumOf(got, "list", ids...)-sumOf(before, "list", ids...))
			}
			if got := sumOf(st.snapshot(), "gone", ids...); !tc.wantGone && got != 0 {
				t.Logf("with the watch cache, %d watches were answered 410 all the same", got)
			}
			if restarted, kept := g.keptSince(placed); restarted != 0 || !kept {
				t.Errorf("through the relists: %d runs started, every name kept on its replica: %v; want the names to run on where they ran", restarted, kept)
			}
			if n := g.fences.Load(); n != 0 {
				t.Errorf("%d fence passes; want none", n)
			}

			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			if err := g.rs["c"].Leave(ctx); err != nil {
				t.Fatalf("Leave(c): %v", err)
			}
			delete(g.rs, "c")
			took, _ := g.waitPlaced("after c left", 20*time.Second, "a", "b")
			t.Logf("c's names run on a and b %v after its Leave returned", took.Round(time.Millisecond))
			if took > g.ttl/2 {
				t.Errorf("c's names ran elsewhere %v after its Leave returned; want them handed over at once, as feeds that work on do", took)
			}
		})
	}
}
