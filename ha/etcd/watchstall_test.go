// A TCP proxy that reads just enough HTTP/2 to hold what etcd sends on
// the watch streams open at a given moment, while everything else on the
// connection goes on: lease keepalives, other requests, gRPC pings.

package etcd

import (
	"encoding/binary"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/net/http2/hpack"
)

// watchPath is the gRPC method of etcd's watch streams.
const watchPath = "/etcdserverpb.Watch/Watch"

// What the staller reads of HTTP/2 (RFC 9113): the client's preface, the
// 9-byte frame header, and the header blocks of HEADERS and CONTINUATION
// frames, with their flags.
const (
	clientPreface     = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
	frameHeaderLen    = 9
	frameHeaders      = 0x1
	frameContinuation = 0x9
	flagEndHeaders    = 0x4
	flagPadded        = 0x8
	flagPriority      = 0x20
)

// watchStaller forwards loopback connections to target. Stall holds every
// frame etcd sends on the watch streams open at that moment, for as long
// as the connection lasts; other streams, and watch streams opened later,
// flow. A held stream is what a watch stuck on the server, or behind a
// proxy that lost it, looks like to the client: open, answering nothing,
// while the connection stays healthy. (The held frames keep the few bytes
// they take of the connection's flow-control window.)
type watchStaller struct {
	ln     net.Listener // immutable
	target string       // immutable

	// holdNew makes every watch stream opened from now on held as well
	// (stallNew).
	holdNew atomic.Bool

	mu    sync.Mutex
	links map[*h2link]bool // guarded by mu; the open connections
	wg    sync.WaitGroup   // the accept loop and two pipes per connection; joined by close
}

// h2link is one proxied connection.
type h2link struct {
	down, up net.Conn // immutable: to the client, to etcd

	// Guarded by mu, under which down is written too.
	mu      sync.Mutex
	watches map[uint32]bool // streams on which the client called Watch
	held    map[uint32]bool // streams whose frames are held
	queue   [][]byte        // the held frames, in order
	nHeld   int             // frames held since the connection opened
}

func newWatchStaller(t testing.TB, target string) *watchStaller {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &watchStaller{ln: ln, target: target, links: map[*h2link]bool{}}
	s.wg.Add(1)
	go s.accept() // joined by close
	t.Cleanup(s.close)
	return s
}

func (s *watchStaller) addr() string { return s.ln.Addr().String() }

// stall holds the watch streams open now, on every connection.
func (s *watchStaller) stall() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for l := range s.links {
		l.mu.Lock()
		for id := range l.watches {
			l.held[id] = true
		}
		l.mu.Unlock()
	}
}

// stallNew holds every watch stream opened from now on, on every
// connection, from its first frame: a watch on it is never confirmed.
func (s *watchStaller) stallNew() { s.holdNew.Store(true) }

// heldFrames returns how many frames have been held so far.
func (s *watchStaller) heldFrames() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for l := range s.links {
		l.mu.Lock()
		n += l.nHeld
		l.mu.Unlock()
	}
	return n
}

// close stops accepting, closes every connection and joins the pipes.
func (s *watchStaller) close() {
	s.ln.Close()
	s.mu.Lock()
	for l := range s.links {
		l.down.Close()
		l.up.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

func (s *watchStaller) accept() {
	defer s.wg.Done()
	for {
		down, err := s.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", s.target)
		if err != nil {
			down.Close()
			continue
		}
		l := &h2link{down: down, up: up, watches: map[uint32]bool{}, held: map[uint32]bool{}}
		s.mu.Lock()
		s.links[l] = true
		s.mu.Unlock()
		s.wg.Add(2)
		go s.fromClient(l) // joined by close
		go s.fromEtcd(l)   // joined by close
	}
}

func (s *watchStaller) end(l *h2link) {
	l.down.Close()
	l.up.Close()
	s.mu.Lock()
	delete(s.links, l)
	s.mu.Unlock()
}

// fromClient forwards the client's bytes unchanged, decoding the header
// blocks to learn which streams are watches. Every block is decoded, in
// order, to keep the HPACK table in step with the client's encoder.
func (s *watchStaller) fromClient(l *h2link) {
	defer s.wg.Done()
	defer s.end(l)
	preface := make([]byte, len(clientPreface))
	if _, err := io.ReadFull(l.down, preface); err != nil || string(preface) != clientPreface {
		return
	}
	if _, err := l.up.Write(preface); err != nil {
		return
	}
	dec := hpack.NewDecoder(4096, nil)
	var block []byte
	for {
		frame, err := readFrame(l.down)
		if err != nil {
			return
		}
		typ, flags, id := frame[3], frame[4], binary.BigEndian.Uint32(frame[5:9])&(1<<31-1)
		if typ == frameHeaders || typ == frameContinuation {
			block = append(block, headerFragment(typ, flags, frame[frameHeaderLen:])...)
			if flags&flagEndHeaders != 0 {
				fields, err := dec.DecodeFull(block)
				block = block[:0]
				if err != nil {
					return
				}
				for _, f := range fields {
					if f.Name == ":path" && f.Value == watchPath {
						l.mu.Lock()
						l.watches[id] = true
						if s.holdNew.Load() {
							l.held[id] = true
						}
						l.mu.Unlock()
					}
				}
			}
		}
		if _, err := l.up.Write(frame); err != nil {
			return
		}
	}
}

// fromEtcd forwards etcd's frames, but queues those of held streams.
func (s *watchStaller) fromEtcd(l *h2link) {
	defer s.wg.Done()
	defer s.end(l)
	for {
		frame, err := readFrame(l.up)
		if err != nil {
			return
		}
		id := binary.BigEndian.Uint32(frame[5:9]) & (1<<31 - 1)
		l.mu.Lock()
		if l.held[id] {
			l.queue = append(l.queue, frame)
			l.nHeld++
			l.mu.Unlock()
			continue
		}
		_, err = l.down.Write(frame)
		l.mu.Unlock()
		if err != nil {
			return
		}
	}
}

// readFrame reads one HTTP/2 frame, header included.
func readFrame(r io.Reader) ([]byte, error) {
	hdr := make([]byte, frameHeaderLen)
	if _, err := io.ReadFull(r, hdr); err != nil {
		return nil, err
	}
	n := int(hdr[0])<<16 | int(hdr[1])<<8 | int(hdr[2])
	frame := make([]byte, frameHeaderLen+n)
	copy(frame, hdr)
	if _, err := io.ReadFull(r, frame[frameHeaderLen:]); err != nil {
		return nil, err
	}
	return frame, nil
}

// headerFragment returns the header block fragment of a HEADERS or
// CONTINUATION frame's payload: without padding and priority fields.
func headerFragment(typ, flags byte, p []byte) []byte {
	if typ != frameHeaders {
		return p
	}
	pad := 0
	if flags&flagPadded != 0 && len(p) > 0 {
		pad, p = int(p[0]), p[1:]
	}
	if flags&flagPriority != 0 && len(p) >= 5 {
		p = p[5:]
	}
	if pad <= len(p) {
		p = p[:len(p)-pad]
	}
	return p
}
