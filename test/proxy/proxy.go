// Package proxy is a TCP proxy for fault-injection tests. It forwards every
// connection made to its listen address to a target address and can, on
// command, fail the path the ways real networks do:
//
//   - Blackhole: connections stay open but no byte moves in either
//     direction. The proxy stops reading, so the senders' writes succeed
//     until the kernel buffers fill and then block, and nothing arrives: a
//     partition as TCP sees it. New connections are accepted but not
//     forwarded (the target sees nothing). Heal delivers the held bytes, in
//     order, like TCP retransmission after a short partition: a byte is never
//     dropped from the middle of a stream.
//   - Reset: every current connection is closed with an RST on both sides
//     (SO_LINGER 0), as after a middlebox or peer restart. New connections
//     are forwarded as usual.
//   - Refuse: the listener is closed, so new connections get ECONNREFUSED;
//     current connections are untouched. Refuse, then Reset, is "host down":
//     in the other order a client could reconnect in between.
//   - Heal: forward again (re-listening on the same address after Refuse).
//   - Retarget: new connections go to another address (a promoted standby,
//     as a DNS name or virtual IP moves in a failover); current ones are
//     untouched until Reset.
//   - SetDelay: every chunk of bytes is delivered a fixed time after the
//     proxy read it, in each direction, on current and new connections: a
//     longer wire. A request/response round trip grows by twice the delay;
//     the stream stays pipelined (bandwidth is not limited) and in order.
//
// It is used by the chaos suite (test/chaos) and meant for reuse by other
// tests that need a controllable network path.
package proxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// Stats counts connections.
type Stats struct {
	Accepted int // connections accepted since New
	Active   int // connections currently open (forwarding or held)
}

// Proxy forwards TCP connections from Addr() to a target. All methods are
// safe for concurrent use.
type Proxy struct {
	addr string // listen address, fixed (re-bound after Refuse)

	mu       sync.Mutex
	target   string
	ln       net.Listener  // nil while refusing or after Close
	open     chan struct{} // closed while forwarding; a fresh channel while blackholed
	links    map[*link]struct{}
	accepted int
	closed   bool
	delay    time.Duration // one-way, per direction (SetDelay)
	wg       sync.WaitGroup
}

// DialTimeout bounds each dial of the target.
const DialTimeout = 5 * time.Second

// New listens on listen (e.g. "127.0.0.1:0") and forwards each accepted
// connection to target.
func New(listen, target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("proxy listen on %s: %w", listen, err)
	}
	open := make(chan struct{})
	close(open)
	p := &Proxy{addr: ln.Addr().String(), target: target, ln: ln, open: open, links: map[*link]struct{}{}}
	p.wg.Add(1)
	go p.serve(ln)
	return p, nil
}

// Addr is the address clients connect to.
func (p *Proxy) Addr() string { return p.addr }

// Target is the address new connections are forwarded to.
func (p *Proxy) Target() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.target
}

// Retarget forwards connections accepted from now on to target; current
// connections keep their peer (Reset ends them).
func (p *Proxy) Retarget(target string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target = target
}

// SetDelay makes every byte read from now on arrive d later on the other
// side, in both directions (so a round trip through the proxy grows by 2*d);
// 0 forwards at once again. Bytes already queued keep their delivery time
// and their order. A negative d is taken as 0.
func (p *Proxy) SetDelay(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.delay = max(d, 0)
}

// Delay is the one-way delay SetDelay set.
func (p *Proxy) Delay() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.delay
}

// Stats returns the connection counts.
func (p *Proxy) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return Stats{Accepted: p.accepted, Active: len(p.links)}
}

// Blackhole stops moving bytes on every connection, current and new, until
// Heal.
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.open:
		p.open = make(chan struct{})
	default: // already blackholed
	}
}

// Reset closes every current connection with an RST to both peers and
// returns how many there were.
func (p *Proxy) Reset() int {
	p.mu.Lock()
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
		delete(p.links, l) // gone for Stats at once, not when its goroutines end
	}
	p.mu.Unlock()
	for _, l := range links {
		l.close(true)
	}
	return len(links)
}

// Refuse closes the listener: new connections are refused until Heal.
func (p *Proxy) Refuse() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errors.New("proxy is closed")
	}
	if p.ln == nil {
		return nil
	}
	err := p.ln.Close()
	p.ln = nil
	return err
}

// Heal ends Blackhole (held bytes are delivered) and Refuse (the address is
// listened on again; it retries for a few seconds if the port is briefly
// busy).
func (p *Proxy) Heal() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errors.New("proxy is closed")
	}
	select {
	case <-p.open:
	default:
		close(p.open)
	}
	if p.ln != nil {
		return nil
	}
	var err error
	for deadline := time.Now().Add(5 * time.Second); ; {
		var ln net.Listener
		if ln, err = net.Listen("tcp", p.addr); err == nil {
			p.ln = ln
			p.wg.Add(1)
			go p.serve(ln)
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("proxy re-listen on %s: %w", p.addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Close stops listening, resets every connection and waits for the proxy's
// goroutines to end.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	var err error
	if p.ln != nil {
		err = p.ln.Close()
		p.ln = nil
	}
	p.mu.Unlock()
	p.Reset()
	p.wg.Wait()
	return err
}

func (p *Proxy) serve(ln net.Listener) {
	defer p.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return // closed by Refuse or Close
		}
		l := &link{client: c.(*net.TCPConn), done: make(chan struct{})}
		p.mu.Lock()
		if p.closed || p.ln != ln {
			// Refused or closed while this one was being accepted: a
			// Refuse followed by Reset must leave no connection behind.
			p.mu.Unlock()
			l.close(true)
			return
		}
		p.accepted++
		p.links[l] = struct{}{}
		p.wg.Add(1)
		p.mu.Unlock()
		go p.handle(l)
	}
}

// gate returns the channel that is closed while bytes may move.
func (p *Proxy) gate() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.open
}

// wait blocks while the proxy is blackholed; false if l closed meanwhile.
func (p *Proxy) wait(l *link) bool {
	select {
	case <-p.gate():
		select {
		case <-l.done:
			return false
		default:
			return true
		}
	case <-l.done:
		return false
	}
}

func (p *Proxy) handle(l *link) {
	defer p.wg.Done()
	defer func() {
		p.mu.Lock()
		delete(p.links, l)
		p.mu.Unlock()
	}()
	// A connection accepted during a blackhole reaches the target only after
	// Heal, as a SYN would after a partition.
	if !p.wait(l) {
		return
	}
	c, err := net.DialTimeout("tcp", p.Target(), DialTimeout)
	if err != nil {
		l.close(true) // the client sees a reset, as from a dead backend
		return
	}
	if !l.setServer(c.(*net.TCPConn)) {
		return
	}
	var both sync.WaitGroup
	both.Add(2)
	go func() { defer both.Done(); p.pump(l, l.server, l.client) }()
	go func() { defer both.Done(); p.pump(l, l.client, l.server) }()
	both.Wait()
	l.close(false)
}

// pump copies src to dst while the proxy forwards. EOF is passed on as a
// half-close; any other error resets the whole link. While a delay is set
// (SetDelay) the chunks go through a delayed writer instead; once one was
// started it carries the rest of the stream, so bytes never overtake.
func (p *Proxy) pump(l *link, dst, src *net.TCPConn) {
	var dw *delayedWriter
	defer func() {
		if dw != nil {
			dw.finish()
		}
	}()
	buf := make([]byte, 32<<10)
	for {
		if !p.wait(l) {
			return
		}
		n, err := src.Read(buf)
		if d := p.Delay(); dw == nil && d > 0 {
			dw = p.startDelayed(l, dst)
		}
		if n > 0 {
			if dw != nil {
				if !dw.put(chunk{data: buf[:n], due: time.Now().Add(p.Delay())}) {
					return
				}
				buf = make([]byte, 32<<10) // the queued chunk keeps the old one
			} else {
				if !p.wait(l) { // bytes read just before a blackhole are held, not dropped
					return
				}
				if _, werr := dst.Write(buf[:n]); werr != nil {
					l.close(true)
					return
				}
			}
		}
		if errors.Is(err, io.EOF) {
			if dw != nil {
				dw.put(chunk{eof: true, due: time.Now().Add(p.Delay())})
				return
			}
			_ = dst.CloseWrite()
			return
		}
		if err != nil {
			l.close(true)
			return
		}
	}
}

// chunk is bytes read at some time, to be written at due (eof: half-close).
type chunk struct {
	data []byte
	due  time.Time
	eof  bool
}

// delayedWriter writes queued chunks to dst at their due times, in order.
type delayedWriter struct {
	q    chan chunk
	done chan struct{}
	l    *link
}

func (p *Proxy) startDelayed(l *link, dst *net.TCPConn) *delayedWriter {
	// 256 chunks of up to 32 KiB: enough in flight for a 1 ms wire at
	// loopback speed, and bounded.
	w := &delayedWriter{q: make(chan chunk, 256), done: make(chan struct{}), l: l}
	go func() {
		defer close(w.done)
		for c := range w.q {
			if wait := time.Until(c.due); wait > 0 {
				t := time.NewTimer(wait)
				select {
				case <-t.C:
				case <-l.done:
					t.Stop()
					return
				}
			}
			if !p.wait(l) {
				return
			}
			if c.eof {
				_ = dst.CloseWrite()
				return
			}
			if _, err := dst.Write(c.data); err != nil {
				l.close(true)
				return
			}
		}
	}()
	return w
}

// put queues a chunk; false if the link closed meanwhile.
func (w *delayedWriter) put(c chunk) bool {
	select {
	case w.q <- c:
		return true
	case <-w.l.done:
		return false
	}
}

// finish lets the writer deliver what is queued and waits for it (or for
// the link to close).
func (w *delayedWriter) finish() {
	close(w.q)
	select {
	case <-w.done:
	case <-w.l.done:
	}
}

// link is one proxied connection: the accepted client side and the dialed
// server side.
type link struct {
	client *net.TCPConn
	done   chan struct{}
	once   sync.Once
	mu     sync.Mutex
	server *net.TCPConn // nil until dialed
}

// setServer records the dialed side; false (and the conn closed) if the link
// was closed meanwhile.
func (l *link) setServer(c *net.TCPConn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.done:
		_ = c.SetLinger(0)
		_ = c.Close()
		return false
	default:
		l.server = c
		return true
	}
}

// close closes both sides once; rst sends an RST instead of a FIN.
func (l *link) close(rst bool) {
	l.once.Do(func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		close(l.done)
		for _, c := range []*net.TCPConn{l.client, l.server} {
			if c == nil {
				continue
			}
			if rst {
				_ = c.SetLinger(0)
			}
			_ = c.Close()
		}
	})
}
