// A TCP proxy between one client and a kube-apiserver, which can be cut
// into a black hole and healed, to partition that client alone, or moved
// to another kube-apiserver, as a load balancer moves a client.

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
// closes never do. Moved, it closes every connection and sends the new
// ones to another target.
type blackHole struct {
	ln     net.Listener  // immutable
	up     *valve        // immutable; open while bytes may cross
	closed chan struct{} // closed by close, which frees every pipe

	mu     sync.Mutex
	target string                // guarded by mu; where new connections go
	moves  int                   // guarded by mu; how many times move changed target
	conns  map[net.Conn]struct{} // guarded by mu; both ends of every open connection

	wg sync.WaitGroup // the accept loop and two pipes per connection; joined by close
}

// newBlackHole starts a proxy to target, open, closed when the test ends.
func newBlackHole(t testing.TB, target string) *blackHole {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &blackHole{ln: ln, target: target, closed: make(chan struct{}), up: newValve(), conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept() // joined by close
	t.Cleanup(p.close)
	return p
}

// addr is the host:port a client dials instead of the target's.
func (p *blackHole) addr() string { return p.ln.Addr().String() }

// move sends every new connection to target from now on, and closes
// every open one, as a load balancer that moves a client to another
// server: the client sees its connections end and dials again.
func (p *blackHole) move(target string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target = target
	p.moves++
	for c := range p.conns {
		c.Close() // its pipes end and forget it
	}
}

// cut stops every byte from crossing, from now until heal.
func (p *blackHole) cut() { p.up.shut() }

// heal lets bytes cross again, those held at the cut first.
func (p *blackHole) heal() { p.up.release() }

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
		p.mu.Lock()
		target, moves := p.target, p.moves
		p.mu.Unlock()
		up, err := net.Dial("tcp", target)
		if err != nil {
			down.Close() // a dead server: the client sees its connection end
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
		if p.moves != moves { // dialled the target move left
			p.mu.Unlock()
			down.Close()
			up.Close()
			continue
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
			case <-p.up.gate():
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
