// A write whose COMMIT reached the server but whose answer was lost (the
// connection dropped right after it, as a proxy or a network may do):
// the caller's retry finds what the commit did, as the contract says.

package postgres

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bgctl/controller/ha"
)

// commitCutter is a TCP proxy to the test server that, when armed, drops
// the next connection that sends a COMMIT right after forwarding it: the
// server commits, the client never hears.
type commitCutter struct {
	ln     net.Listener
	target string
	armed  atomic.Bool
	cut    chan struct{} // one value per COMMIT cut, once the server has answered it
	wg     sync.WaitGroup
}

// cancelRequestCode opens a CancelRequest in place of a startup message.
const cancelRequestCode = 80877102

// newCommitCutter listens on a free loopback port; it stops when t ends.
func newCommitCutter(t *testing.T) *commitCutter {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &commitCutter{ln: ln, target: net.JoinHostPort("127.0.0.1", strconv.Itoa(testServer.Port)), cut: make(chan struct{}, 1)}
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		_ = ln.Close()
		p.wg.Wait()
	})
	return p
}

// dsn is a URL of the test server's database through the proxy.
func (p *commitCutter) dsn() string {
	return "postgres://postgres@" + p.ln.Addr().String() + "/postgres?sslmode=disable"
}

// accept serves each connection until the listener closes.
func (p *commitCutter) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.wg.Go(func() { p.serve(c.(*net.TCPConn), s.(*net.TCPConn)) })
	}
}

// serve forwards one connection both ways, and cuts it after a COMMIT
// when armed: the client's side closed at once, the server's drained
// until the server closes it, so that the server has committed.
func (p *commitCutter) serve(client, server *net.TCPConn) {
	defer client.Close()
	defer server.Close()
	var mu sync.Mutex
	cut := false // guarded by mu: nothing more goes to the client
	toClient := make(chan struct{})
	go func() { // joined below: <-toClient
		defer close(toClient)
		buf := make([]byte, 32<<10)
		for {
			n, err := server.Read(buf)
			mu.Lock()
			if n > 0 && !cut {
				_, _ = client.Write(buf[:n])
			}
			mu.Unlock()
			if err != nil {
				_ = client.Close() // the server closed: so does the client's side
				return
			}
		}
	}()
	defer func() {
		_ = server.Close() // ends the copy to the client, if the server has not
		<-toClient
	}()
	// The startup message: a length, then the rest.
	var n [4]byte
	if _, err := io.ReadFull(client, n[:]); err != nil {
		return
	}
	startup := make([]byte, binary.BigEndian.Uint32(n[:])-4)
	if _, err := io.ReadFull(client, startup); err != nil {
		return
	}
	if len(startup) == 12 && binary.BigEndian.Uint32(startup) == cancelRequestCode {
		// Dropped, as a network that lost the connection drops it: a
		// cancel pgx sends as it gives a connection up could otherwise
		// abort the COMMIT it cut, and the test would not know which.
		return
	}
	if _, err := server.Write(append(n[:], startup...)); err != nil {
		return
	}
	for {
		var head [5]byte // type, length
		if _, err := io.ReadFull(client, head[:]); err != nil {
			_ = server.CloseWrite()
			return
		}
		body := make([]byte, binary.BigEndian.Uint32(head[1:])-4)
		if _, err := io.ReadFull(client, body); err != nil {
			_ = server.CloseWrite()
			return
		}
		commit := head[0] == 'Q' && bytes.HasPrefix(bytes.ToLower(body), []byte("commit")) && p.armed.CompareAndSwap(true, false)
		if commit {
			// Cut before the server can answer: its answer is read
			// and dropped.
			mu.Lock()
			cut = true
			mu.Unlock()
			_ = client.Close()
		}
		if _, err := server.Write(append(head[:], body...)); err != nil {
			return
		}
		if commit {
			_ = server.CloseWrite() // the server reads the COMMIT, then the end
			<-toClient              // ... answers it, and closes
			p.cut <- struct{}{}
			return
		}
	}
}

// lose arms p, runs write, which must fail, and waits until the server
// answered the COMMIT p cut.
func (p *commitCutter) lose(t *testing.T, what string, write func() error) {
	t.Helper()
	p.armed.Store(true)
	start := time.Now()
	defer func() { t.Logf("%s lost in %v", what, time.Since(start).Round(time.Millisecond)) }()
	if err := write(); err == nil {
		t.Fatalf("%s through a connection cut after its COMMIT succeeded", what)
	}
	select {
	case <-p.cut:
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: no COMMIT cut", what)
	}
}

func TestRetriesFindWhatALostCommitDid(t *testing.T) {
	t.Parallel()
	p := newCommitCutter(t)
	st, err := newStore(newPoolOn(t, p.dsn(), 4), StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	b := st.backend(ha.BackendConfig{Group: newGroup("lost"), ID: "r0", TTL: 5 * time.Second})
	s, err := b.Begin(ctx, 0, 5*time.Second, "d")
	if err != nil {
		t.Fatal(err)
	}

	// count reads how many rows of table match where, directly: what the
	// lost commits did.
	count := func(table, where string, args ...any) int {
		t.Helper()
		var n int
		if err := st.pool.QueryRow(ctx, st.q.sql("SELECT count(*) FROM {s}."+table+" WHERE "+where), args...).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	p.lose(t, "a claim", func() error { _, _, err := b.Claim(ctx, s.ID, []string{"x", "y"}); return err })
	if n := count("claims", "session = $1", int64(s.ID)); n != 2 {
		t.Fatalf("the lost claim's commit made %d holdings, want 2", n)
	}
	got, absent, err := b.Claim(ctx, s.ID, []string{"x", "y"})
	if err != nil || len(absent) > 0 || len(got) != 2 || !got[0].Mine || !got[1].Mine || got[0].At == 0 || got[0].Revision != got[1].Revision {
		t.Fatalf("the claim's retry = %+v, absent %v, %v; want both names found ours, at the lost commit's position", got, absent, err)
	}

	x := ha.Claim{Name: got[0].Name, Key: got[0].Key, Revision: got[0].Revision, Token: got[0].Token}
	p.lose(t, "a release", func() error { return b.Release(ctx, x) })
	if n := count("claims", "session = $1", int64(s.ID)); n != 1 {
		t.Fatalf("after the lost release's commit %d holdings, want 1", n)
	}
	if err := b.Release(ctx, x); err != nil {
		t.Errorf("the release's retry: %v", err)
	}
	if got, _, err := b.Claim(ctx, s.ID, []string{x.Name}); err != nil || len(got) != 1 || !got[0].Mine || got[0].Revision == x.Revision {
		t.Errorf("a claim of %s after the lost release = %+v, %v; want it free and ours anew", x.Name, got, err)
	}

	// A begin whose answer was lost ends the session it made itself.
	b1 := st.backend(ha.BackendConfig{Group: b.cfg.Group, ID: "r1", TTL: 5 * time.Second})
	p.lose(t, "a begin", func() error { _, err := b1.Begin(ctx, 0, 5*time.Second, "d"); return err })
	if n := count("sessions", "grp = $1 AND member = 'r1'", b.cfg.Group); n != 0 {
		t.Errorf("a begin whose answer was lost left %d sessions", n)
	}
	if _, err := b1.Begin(ctx, 0, 5*time.Second, "d"); err != nil {
		t.Errorf("the begin's retry: %v", err)
	}

	p.lose(t, "an end", func() error { return b.End(ctx, s.ID) })
	if n := count("sessions", "id = $1", int64(s.ID)); n != 0 {
		t.Fatalf("the lost end's commit left the session")
	}
	if err := b.End(ctx, s.ID); !errors.Is(err, ha.ErrSessionEnded) {
		t.Errorf("the end's retry: %v; want ErrSessionEnded", err)
	}
	if _, _, err := b.Claim(ctx, s.ID, []string{"z"}); !errors.Is(err, ha.ErrSessionEnded) {
		t.Errorf("a claim under the session a lost end ended: %v; want ErrSessionEnded", err)
	}
}
