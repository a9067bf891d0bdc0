// A TCP proxy between one replica and etcd (one member or several), whose
// links can be cut and healed to make a partition.

package etcd

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// proxy forwards loopback connections to its targets, one listener per
// target: a replica of a three-member etcd reaches each member through
// one, and a cut cuts them all. Cut makes it a black hole: connections
// stay open, but no byte crosses in either direction until Heal (like a
// network that drops packets, which TCP delivers once it heals).
// Connections opened during a cut wait as well.
type proxy struct {
	lns     []net.Listener // immutable; lns[i] forwards to targets[i]
	targets []string       // immutable

	mu    sync.Mutex
	gate  chan struct{}     // guarded by mu; closed while the link is up
	conns map[net.Conn]bool // guarded by mu; every open connection, both sides
	wg    sync.WaitGroup    // the accept loop and two pipes per connection; joined by close

	// bytes counts what crossed, both ways, for the measurements.
	bytes atomic.Int64
}

func newProxy(t testing.TB, targets ...string) *proxy {
	t.Helper()
	p := &proxy{targets: targets, gate: make(chan struct{}), conns: map[net.Conn]bool{}}
	close(p.gate)
	for range targets {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			p.close()
			t.Fatal(err)
		}
		p.lns = append(p.lns, ln)
	}
	for i := range p.lns {
		p.wg.Add(1)
		go p.accept(i) // joined by close
	}
	t.Cleanup(p.close)
	return p
}

// addr is the address that forwards to the first target.
func (p *proxy) addr() string { return p.lns[0].Addr().String() }

// addrs are the addresses that forward to each target, in order.
func (p *proxy) addrs() []string {
	a := make([]string, len(p.lns))
	for i, ln := range p.lns {
		a[i] = ln.Addr().String()
	}
	return a
}

func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.gate:
		p.gate = make(chan struct{})
	default: // cut already
	}
}

func (p *proxy) heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.gate:
	default:
		close(p.gate)
	}
}

func (p *proxy) open() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.gate
}

// close stops accepting, closes every connection and joins the pipes.
func (p *proxy) close() {
	for _, ln := range p.lns {
		ln.Close()
	}
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	select {
	case <-p.gate:
	default:
		close(p.gate) // free pipes waiting at the gate
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *proxy) accept(i int) {
	defer p.wg.Done()
	for {
		down, err := p.lns[i].Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.targets[i])
		if err != nil {
			down.Close()
			continue
		}
		p.mu.Lock()
		p.conns[down], p.conns[up] = true, true
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(up, down) // joined by close
		go p.pipe(down, up) // joined by close
	}
}

// pipe copies src to dst, holding every chunk at the gate while the link
// is cut.
func (p *proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	defer func() {
		dst.Close()
		src.Close()
		p.mu.Lock()
		delete(p.conns, dst)
		delete(p.conns, src)
		p.mu.Unlock()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			<-p.open()
			p.bytes.Add(int64(n))
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // io.EOF or a closed connection
		}
	}
}
