// A lagging observer: one replica's watch streams held for several D, as
// a watch cache behind the server the others write through, whose
// events come late but in order. Its stamps fall due on versions long
// renewed; it acts on them only through quorum reads and guarded
// deletes, so it ends no live session, and a crashed one still ends.

package kube

import (
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// laggingWatch is a replica's transport whose watch streams the test can
// hold (shut its valve): a chunk read while held crosses once released,
// in order, as a lagging watch cache delivers its events. It counts the
// replica's requests to other replicas' member Leases, by "<method> <ID>
// <status>".
type laggingWatch struct {
	*valve // shut while the streams are held
	mu     sync.Mutex
	counts map[string]int // "GET b 200" → how many; guarded by mu
}

func newLaggingWatch() *laggingWatch {
	return &laggingWatch{valve: newValve(), counts: map[string]int{}}
}

// count returns how many requests of method to member ID's Lease were
// answered status.
func (l *laggingWatch) count(method, id string, status int) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.counts[method+" "+id+" "+http.StatusText(status)]
}

// transport returns rt under l.
func (l *laggingWatch) transport(rt http.RoundTripper) http.RoundTripper {
	return lagTransport{rt: rt, l: l}
}

// lagTransport is a replica's transport under l. Immutable.
type lagTransport struct {
	rt http.RoundTripper
	l  *laggingWatch
}

func (t lagTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.rt.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	if _, id, ok := strings.Cut(req.URL.Path[strings.LastIndex(req.URL.Path, "/")+1:], "-m-"); ok {
		t.l.mu.Lock()
		t.l.counts[req.Method+" "+id+" "+http.StatusText(resp.StatusCode)]++
		t.l.mu.Unlock()
	}
	if requestKind(req) == "watch" {
		resp.Body = &lagBody{rc: resp.Body, l: t.l, closed: make(chan struct{})}
	}
	return resp, nil
}

// lagBody is a watch stream under l: what a read brings waits while l
// holds the streams. Read by one goroutine at a time, as a body is;
// Close may come from another.
type lagBody struct {
	rc     io.ReadCloser
	l      *laggingWatch
	once   sync.Once
	closed chan struct{} // closed by Close
}

func (b *lagBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	select {
	case <-b.l.gate():
	case <-b.closed:
	}
	return n, err
}

func (b *lagBody) Close() error {
	b.once.Do(func() { close(b.closed) })
	return b.rc.Close()
}

// Replica a's watch lags by three lease durations while c crashes: a's
// stamps of b's Lease fall due on versions b renewed long since, and
// the quorum read a makes before its guarded delete finds b's newer one,
// so b keeps its session and its names, and no fence passes on a or b.
// c's session is proven ended (by a or by b) all the same, and c's names
// run elsewhere once a's watch catches up; nothing runs twice at once.
func TestLaggingObserverOnKubernetes(t *testing.T) {
	t.Parallel() // each in a group of its own; their waits overlap
	g := newKubeReplicas(t, 60)
	lag := newLaggingWatch()
	g.wrap = func(id string, rt http.RoundTripper) http.RoundTripper {
		if id == "a" {
			return lag.transport(rt)
		}
		return rt
	}
	ids := []string{"a", "b", "c"}
	for _, id := range ids {
		g.join(id)
	}
	g.waitPlaced("three replicas placing", 30*time.Second, ids...)
	placed := g.mark()

	lag.shut()
	held := time.Now()
	readsOfB := lag.count(http.MethodGet, "b", http.StatusOK)
	var ofC []string
	for n, id := range placed.where {
		if id == "c" {
			ofC = append(ofC, n)
		}
	}
	g.cuts["c"].off.Store(true) // a crash: c never ends its session
	if err := g.rs["c"].Close(); err != nil {
		t.Logf("Close(c) cut off: %v", err)
	}
	delete(g.rs, "c")
	time.Sleep(3 * replicaTTL) // the lag: a's stamps of b fall due twice at least
	readsOfB = lag.count(http.MethodGet, "b", http.StatusOK) - readsOfB
	lag.release()
	released := time.Now()
	took, _ := g.waitPlaced("after a's watch caught up", 30*time.Second, "a", "b")
	first, last, moved := g.runs.startedBetween(ofC, held)
	t.Logf("a's watch held %v from c's crash; %d of c's %d names ran elsewhere %v to %v after the crash (D = %v), every name on a or b %v after the release; a read b's Lease %d times meanwhile (its stamps due on versions b had renewed)",
		released.Sub(held).Round(time.Millisecond), moved, len(ofC), first.Sub(held).Round(time.Millisecond), last.Sub(held).Round(time.Millisecond), replicaTTL, took.Round(time.Millisecond), readsOfB)

	if readsOfB == 0 {
		t.Errorf("a never read b's Lease while its watch lagged; want its stamps of b to fall due, and a quorum read to find b renewed")
	}
	if n := lag.count(http.MethodDelete, "b", http.StatusOK); n != 0 {
		t.Errorf("a deleted b's member Lease %d times; want none, b renewed all along", n)
	}
	for _, id := range []string{"a", "b"} {
		if n := g.fencesOf[id].Load(); n != 0 {
			t.Errorf("%d fence passes on %s; want none", n, id)
		}
	}
	// b's names ran on: none started again, each on b.
	g.runs.mu.Lock()
	defer g.runs.mu.Unlock()
	for n, id := range placed.where {
		if again := len(g.runs.began[n]) - placed.startsOf[n]; id == "b" && (again != 0 || g.runs.where[n] != "b") {
			t.Errorf("%s, b's, started %d times since the lag began, runs on %q now; want it run on b", n, again, g.runs.where[n])
		}
	}
}
