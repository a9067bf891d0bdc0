// A TCP proxy that black-holes: it forwards a client's connections to the
// server until hole is called, and from then on forwards nothing, either
// way, on the connections it has or any new one, while keeping them all
// open: a partition, as neither end sees a reset or an end.

package postgres

import (
	"io"
	"net"
	"sync"
	"testing"
)

// holeProxy forwards connections to target until holed.
type holeProxy struct {
	ln     net.Listener
	target string
	holed  chan struct{} // closed by hole: nothing is forwarded any more
	done   chan struct{} // closed by close: the pipes end
	once   sync.Once     // closes holed
	pipes  sync.WaitGroup

	mu    sync.Mutex
	conns []net.Conn // guarded by mu: every connection, of both ends, closed by close
}

// startHoleProxy listens on a free port of 127.0.0.1 and forwards to
// target; the test's cleanup closes it and every connection it made.
func startHoleProxy(t *testing.T, target string) *holeProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &holeProxy{ln: ln, target: target, holed: make(chan struct{}), done: make(chan struct{})}
	p.pipes.Go(p.accept) // ends when close closes the listener
	t.Cleanup(p.close)
	return p
}

// addr is the proxy's address, host:port.
func (p *holeProxy) addr() string { return p.ln.Addr().String() }

// hole stops every forwarding, now and for good.
func (p *holeProxy) hole() { p.once.Do(func() { close(p.holed) }) }

// accept takes each connection and forwards it to a new one to the
// target, until the listener is closed.
func (p *holeProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.keep(c) {
			return
		}
		select {
		case <-p.holed:
			continue // accepted, never answered
		default:
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		if !p.keep(s) {
			return
		}
		p.pipes.Go(func() { p.pipe(s, c) }) // joined by close
		p.pipes.Go(func() { p.pipe(c, s) }) // joined by close
	}
}

// keep records c for close; false (c closed) once the proxy is closed.
func (p *holeProxy) keep(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.done:
		_ = c.Close()
		return false
	default:
	}
	p.conns = append(p.conns, c)
	return true
}

// pipe copies from src to dst until either ends or the proxy is holed;
// holed, it drops what it read and waits for the proxy's close, leaving
// both ends open.
func (p *holeProxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		select {
		case <-p.holed:
			<-p.done
			return
		default:
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if err == io.EOF {
				if tc, ok := dst.(*net.TCPConn); ok {
					_ = tc.CloseWrite()
				}
			}
			return
		}
	}
}

// close closes the listener and every connection, and waits for the
// proxy's goroutines.
func (p *holeProxy) close() {
	p.mu.Lock()
	close(p.done)
	conns := p.conns
	p.conns = nil
	p.mu.Unlock()
	_ = p.ln.Close()
	for _, c := range conns {
		_ = c.Close()
	}
	p.pipes.Wait()
}
