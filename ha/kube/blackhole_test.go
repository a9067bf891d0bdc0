// A TCP proxy between one client and the kube-apiserver, which can be cut
// into a black hole and healed, to partition that client alone.

package kube

import (
	"net"
	"sync"
	"testing"
)

// blackHole forwards the connections made to its loopback port to one
// target. While it is cut, no byte crosses it either way, yet every
// connection stays open and new ones are accepted: what a client sees
// when the network drops its packets, or when the process at the other
// end was killed and the kernel has not told anyone. Bytes held at a cut
// cross once it heals, as TCP would retransmit them; bytes held when it
// closes never do.
type blackHole struct {
	ln     net.Listener  // immutable
	target string        // immutable
	closed chan struct{} // closed by close, which frees every pipe

	mu    sync.Mutex
	up    chan struct{}         // guarded by mu; closed while bytes may cross
	conns map[net.Conn]struct{} // guarded by mu; both ends of every open connection

	wg sync.WaitGroup // the accept loop and two pipes per connection; joined by close
}

// newBlackHole starts a proxy to target, open, closed when the test ends.
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

// addr is the host:port a client dials instead of the target's.
func (p *blackHole) addr() string { return p.ln.Addr().String() }

// cut stops every byte from crossing, from now until heal.
func (p *blackHole) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.up:
		p.up = make(chan struct{})
	default: // already cut
	}
}

// heal lets bytes cross again, those held at the cut first.
func (p *blackHole) heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.up:
	default:
		close(p.up)
	}
}

// gate returns a channel that is closed while the proxy is not cut.
func (p *blackHole) gate() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.up
}

// close stops accepting, closes every connection, drops what a cut held,
// and waits for its goroutines. It may be called more than once.
func (p *blackHole) close() {
	p.mu.Lock()
	select {
	case <-p.closed:
		p.mu.Unlock()
		return
	default:
	}
	close(p.closed)
	p.ln.Close()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// accept forwards each accepted connection to a new one to the target.
func (p *blackHole) accept() {
	defer p.wg.Done()
	for {
		down, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			down.Close()
			continue
		}
		p.mu.Lock()
		select {
		case <-p.closed: // close has already closed the others
			p.mu.Unlock()
			down.Close()
			up.Close()
			return
		default:
		}
		p.conns[down], p.conns[up] = struct{}{}, struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pipe(up, down) // joined by close
		go p.pipe(down, up) // joined by close
	}
}

// pipe copies from src to dst, holding each chunk while the proxy is cut;
// when either side ends it closes both.
func (p *blackHole) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	defer func() {
		p.mu.Lock()
		delete(p.conns, src)
		delete(p.conns, dst)
		p.mu.Unlock()
		src.Close()
		dst.Close()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			select {
			case <-p.gate():
			case <-p.closed:
				return
			}
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
