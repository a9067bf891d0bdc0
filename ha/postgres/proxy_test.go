// A TCP proxy between one replica's pool and the server that can turn
// into a black hole and heal: a partition of that replica alone.

package postgres

import (
	"fmt"
	"net"
	"sync"
	"testing"

	"github.com/bgctl/controller/ha/postgres/internal/pgtest"
	"github.com/jackc/pgx/v5/pgxpool"
)

// blackHole forwards every connection made to its loopback port to the
// server at target. Cut, it lets nothing through either way, neither
// bytes nor a connection's close, yet keeps every connection open and
// accepts new ones: what a client sees when the network drops its
// packets, and the server the same of its client. Reads on both sides
// block. Healed, what the cut held crosses in order, as TCP would
// retransmit it; a close held comes after the bytes before it.
type blackHole struct {
	ln     net.Listener  // immutable
	target string        // immutable
	closed chan struct{} // closed by close: every pipe ends

	mu    sync.Mutex
	up    chan struct{}         // guarded by mu; closed while the link is up, replaced by cut
	conns map[net.Conn]struct{} // guarded by mu; both ends of every connection open

	wg sync.WaitGroup // the accept loop and two pipes per connection; joined by close
}

// newBlackHole starts a proxy to target (host:port), up; the test's
// cleanup closes it.
func newBlackHole(t testing.TB, target string) *blackHole {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &blackHole{ln: ln, target: target, closed: make(chan struct{}), up: make(chan struct{}), conns: map[net.Conn]struct{}{}}
	close(p.up)
	p.wg.Add(1)
	go p.accept() // joined by close
	t.Cleanup(p.close)
	return p
}

// dsn is the URL of the test server's database postgres through the
// proxy.
func (p *blackHole) dsn() string {
	return fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable", p.ln.Addr())
}

// cut holds everything from now until heal.
func (p *blackHole) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.up:
		p.up = make(chan struct{})
	default: // cut already
	}
}

// heal lets what was held cross, and everything after it.
func (p *blackHole) heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.up:
	default:
		close(p.up)
	}
}

// pass waits until the link is up; false when the proxy closed first.
func (p *blackHole) pass() bool {
	p.mu.Lock()
	up := p.up
	p.mu.Unlock()
	select {
	case <-up:
		return true
	case <-p.closed:
		return false
	}
}

// close stops accepting, closes every connection, drops what a cut
// held, and waits for its goroutines. Later calls do nothing.
func (p *blackHole) close() {
	p.mu.Lock()
	select {
	case <-p.closed:
		p.mu.Unlock()
		return
	default:
	}
	close(p.closed)
	_ = p.ln.Close()
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// accept forwards each connection accepted to a new one to the target.
func (p *blackHole) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = client.Close() // as a server that is down would
			continue
		}
		p.mu.Lock()
		select {
		case <-p.closed: // close has closed the others already
			p.mu.Unlock()
			_ = client.Close()
			_ = server.Close()
			return
		default:
		}
		p.conns[client], p.conns[server] = struct{}{}, struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pipe(server, client) // joined by close
		go p.pipe(client, server) // joined by close
	}
}

// pipe copies src to dst, each chunk, and src's end, only while the link
// is up; at src's end it closes both.
func (p *blackHole) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	defer func() {
		p.mu.Lock()
		delete(p.conns, src)
		delete(p.conns, dst)
		p.mu.Unlock()
		_ = src.Close()
		_ = dst.Close()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if !p.pass() {
			return
		}
		if n > 0 {
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return // the end, held until the link was up
		}
	}
}

// proxiedPool returns a pool of at most conns connections to srv through
// a black hole of its own, both closed when t ends.
func proxiedPool(t testing.TB, srv *pgtest.Server, conns int32) (*pgxpool.Pool, *blackHole) {
	t.Helper()
	p := newBlackHole(t, fmt.Sprintf("127.0.0.1:%d", srv.Port))
	return newPoolOn(t, p.dsn(), conns), p
}
