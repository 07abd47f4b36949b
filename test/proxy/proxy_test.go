package proxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/test/testkit"
)

// echoServer echoes every connection until the test ends; it reports each
// connection's terminal read error on errs (nil for a clean EOF).
func echoServer(t *testing.T) (addr string, errs <-chan error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan error, 100)
	var conns sync.WaitGroup
	accepting := make(chan struct{})
	// Wait only once the accept loop is gone: an Add racing with Wait is a
	// data race (seen under -race).
	t.Cleanup(func() { ln.Close(); <-accepting; conns.Wait() })
	go func() {
		defer close(accepting)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			go func() {
				defer conns.Done()
				defer c.Close()
				_, err := io.Copy(c, c)
				select {
				case ch <- err:
				default:
				}
			}()
		}
	}()
	return ln.Addr().String(), ch
}

func newProxy(t *testing.T, target string) *Proxy {
	t.Helper()
	p, err := New("127.0.0.1:0", target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// readN reads exactly n bytes or fails after d.
func readN(c net.Conn, n int, d time.Duration) ([]byte, error) {
	c.SetReadDeadline(time.Now().Add(d))
	defer c.SetReadDeadline(time.Time{})
	buf := make([]byte, n)
	_, err := io.ReadFull(c, buf)
	return buf, err
}

// outcome is what a client observes on one connection.
type outcome int

const (
	echoes  outcome = iota // bytes written come back
	silent                 // writes succeed, nothing comes back, the connection stays open
	resets                 // the connection is reset (ECONNRESET)
	refused                // the dial itself is refused (ECONNREFUSED)
)

func (o outcome) String() string { return [...]string{"echoes", "silent", "resets", "refused"}[o] }

// observe sends msg on c (nil: dial addr first) and classifies the result.
func observe(t *testing.T, addr string, c net.Conn, msg string) (outcome, net.Conn) {
	t.Helper()
	if c == nil {
		var err error
		c, err = net.DialTimeout("tcp", addr, time.Second)
		if errors.Is(err, syscall.ECONNREFUSED) {
			return refused, nil
		}
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		t.Cleanup(func() { c.Close() })
	}
	if _, err := c.Write([]byte(msg)); err != nil {
		if errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
			return resets, c
		}
		t.Fatalf("write: %v", err)
	}
	got, err := readN(c, len(msg), 400*time.Millisecond)
	var ne net.Error
	switch {
	case err == nil && string(got) == msg:
		return echoes, c
	case errors.As(err, &ne) && ne.Timeout():
		return silent, c
	case errors.Is(err, syscall.ECONNRESET):
		return resets, c
	}
	t.Fatalf("unexpected result: %q, %v", got, err)
	return 0, nil
}

// Each fault, seen from a connection opened before it and one opened during
// it, and then after Heal: held bytes arrive intact, new connections work.
func TestFaults(t *testing.T) {
	tests := []struct {
		name     string
		fault    func(p *Proxy) error
		existing outcome // connection opened before the fault
		fresh    outcome // connection opened during the fault
	}{
		{"no fault", func(*Proxy) error { return nil }, echoes, echoes},
		{"blackhole", func(p *Proxy) error { p.Blackhole(); return nil }, silent, silent},
		{"reset", func(p *Proxy) error { p.Reset(); return nil }, resets, echoes},
		{"refuse", (*Proxy).Refuse, echoes, refused},
		{"refuse and reset", func(p *Proxy) error { err := p.Refuse(); p.Reset(); return err }, resets, refused},
		{"blackhole twice", func(p *Proxy) error { p.Blackhole(); p.Blackhole(); return nil }, silent, silent},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			target, _ := echoServer(t)
			p := newProxy(t, target)
			before := dial(t, p.Addr())
			if got, _ := observe(t, p.Addr(), before, "warm-up"); got != echoes {
				t.Fatalf("before the fault: %v, want echoes", got)
			}
			if err := tt.fault(p); err != nil {
				t.Fatal(err)
			}
			got, _ := observe(t, p.Addr(), before, "during-old")
			if got != tt.existing {
				t.Errorf("existing connection during the fault: %v, want %v", got, tt.existing)
			}
			gotFresh, fresh := observe(t, p.Addr(), nil, "during-new")
			if gotFresh != tt.fresh {
				t.Errorf("new connection during the fault: %v, want %v", gotFresh, tt.fresh)
			}
			if err := p.Heal(); err != nil {
				t.Fatal(err)
			}
			// Held bytes are delivered after Heal, in order, nothing dropped.
			for _, c := range []struct {
				conn    net.Conn
				outcome outcome
				msg     string
			}{{before, got, "during-old"}, {fresh, gotFresh, "during-new"}} {
				if c.outcome != silent {
					continue
				}
				b, err := readN(c.conn, len(c.msg), 3*time.Second)
				if err != nil || string(b) != c.msg {
					t.Errorf("after Heal the held bytes did not arrive: %q, %v", b, err)
				}
				if o, _ := observe(t, p.Addr(), c.conn, "after"); o != echoes {
					t.Errorf("held connection after Heal: %v, want echoes", o)
				}
			}
			if o, _ := observe(t, p.Addr(), nil, "after-new"); o != echoes {
				t.Errorf("new connection after Heal: %v, want echoes", o)
			}
		})
	}
}

// Reset sends an RST to the target too, so the server sees a reset rather
// than an orderly close.
func TestResetReachesTarget(t *testing.T) {
	target, errs := echoServer(t)
	p := newProxy(t, target)
	c := dial(t, p.Addr())
	if o, _ := observe(t, p.Addr(), c, "x"); o != echoes {
		t.Fatalf("got %v", o)
	}
	if n := p.Reset(); n != 1 {
		t.Fatalf("Reset closed %d connections, want 1", n)
	}
	select {
	case err := <-errs:
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("target saw %v, want ECONNRESET", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("target never saw the connection end")
	}
	if s := p.Stats(); s.Accepted != 1 || s.Active != 0 {
		t.Fatalf("stats %+v, want 1 accepted, 0 active", s)
	}
}

// A connection accepted during a blackhole must not reach the target before
// Heal: the server sees nothing, as behind a partition.
func TestBlackholeHoldsNewConnectionsFromTarget(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	p := newProxy(t, ln.Addr().String())
	p.Blackhole()
	dial(t, p.Addr())
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			accepted <- c
		}
	}()
	select {
	case c := <-accepted:
		c.Close()
		t.Fatal("the target got a connection during the blackhole")
	case <-time.After(300 * time.Millisecond):
	}
	if s := p.Stats(); s.Accepted != 1 || s.Active != 1 {
		t.Fatalf("stats %+v, want the held connection counted", s)
	}
	p.Heal()
	select {
	case c := <-accepted:
		c.Close()
	case <-time.After(3 * time.Second):
		t.Fatal("the held connection never reached the target after Heal")
	}
}

// Streams stay byte-exact while the proxy flaps between blackhole and
// forward many times (run with -race).
func TestFlappingKeepsStreamsIntact(t *testing.T) {
	target, _ := echoServer(t)
	p := newProxy(t, target)
	stop := make(chan struct{})
	flapped := make(chan int)
	go func() {
		n := 0
		for {
			select {
			case <-stop:
				p.Heal()
				flapped <- n
				return
			case <-time.After(time.Duration(rand.IntN(3000)) * time.Microsecond):
			}
			if n%2 == 0 {
				p.Blackhole()
			} else {
				p.Heal()
			}
			n++
		}
	}()
	const clients, size = 4, 1 << 20
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for i := 0; i < clients; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			c, err := net.Dial("tcp", p.Addr())
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			data := make([]byte, size)
			for j := range data {
				data[j] = byte(j*7 + i)
			}
			go func() {
				for off := 0; off < size; off += 4096 {
					if _, err := c.Write(data[off : off+4096]); err != nil {
						return
					}
				}
			}()
			got, err := readN(c, size, 30*time.Second)
			if err != nil {
				errs <- fmt.Errorf("client %d: %w", i, err)
				return
			}
			if !bytes.Equal(got, data) {
				errs <- fmt.Errorf("client %d: stream corrupted", i)
			}
		}(i)
	}
	wg.Wait()
	close(stop)
	if n := <-flapped; n < 10 {
		t.Logf("only %d flaps during the transfer", n)
	}
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// Close ends every connection and refuses new ones; methods after Close fail
// or are no-ops.
func TestClose(t *testing.T) {
	target, _ := echoServer(t)
	p := newProxy(t, target)
	c := dial(t, p.Addr())
	p.Blackhole()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := readN(c, 1, 2*time.Second); err == nil {
		t.Fatal("connection still open after Close")
	}
	if _, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		t.Fatal("dial succeeded after Close")
	}
	if err := p.Heal(); err == nil {
		t.Fatal("Heal after Close succeeded")
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// Refuse then Reset leaves no connection, even with clients dialing all the
// time (a connection accepted while Refuse runs is dropped too).
func TestRefuseThenResetLeavesNothing(t *testing.T) {
	target, _ := echoServer(t)
	p := newProxy(t, target)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var held []net.Conn // like a client library, keep what connects
			defer func() {
				for _, c := range held {
					c.Close()
				}
			}()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if c, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
					held = append(held, c)
				}
			}
		}()
	}
	testkit.WaitFor(t, 5*time.Second, "clients to connect", func() bool { return p.Stats().Accepted > 0 })
	if err := p.Refuse(); err != nil {
		t.Fatal(err)
	}
	p.Reset()
	// A connection accepted while Refuse ran is dropped asynchronously.
	testkit.WaitFor(t, 5*time.Second, "no connection left", func() bool { return p.Stats().Active == 0 })
	st := p.Stats()
	close(stop)
	wg.Wait()
	if st.Active != 0 {
		t.Fatalf("%d connections alive after Refuse and Reset (accepted %d)", st.Active, st.Accepted)
	}
	if st.Accepted == 0 {
		t.Fatal("no connection was made before the cut: the test proves nothing")
	}
}

// Retarget sends new connections to another address (a promoted standby)
// and leaves the current ones alone; Reset then ends those.
func TestRetarget(t *testing.T) {
	a, _ := echoServer(t)
	b, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	// b answers every connection with "B" and closes it.
	go func() {
		for {
			c, err := b.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("B"))
			c.Close()
		}
	}()
	p := newProxy(t, a)
	old := dial(t, p.Addr())
	if got, _ := observe(t, p.Addr(), old, "x"); got != echoes {
		t.Fatalf("before Retarget: %v, want echoes", got)
	}
	p.Retarget(b.Addr().String())
	if p.Target() != b.Addr().String() {
		t.Fatalf("Target() = %s, want %s", p.Target(), b.Addr())
	}
	if got, _ := observe(t, p.Addr(), old, "y"); got != echoes {
		t.Fatalf("a connection made before Retarget: %v, want echoes (untouched)", got)
	}
	c := dial(t, p.Addr())
	if got, err := readN(c, 1, 2*time.Second); err != nil || string(got) != "B" {
		t.Fatalf("a new connection read %q, %v; want B from the new target", got, err)
	}
	if n := p.Reset(); n < 1 {
		t.Fatalf("Reset closed %d connections, want the old one", n)
	}
}

// SetDelay: a round trip through the proxy takes at least twice the delay
// (one way each direction), on a connection made before and one made after
// SetDelay; a large stream comes back intact and in order while delayed and
// is not throttled to one chunk per delay; SetDelay(0) forwards at once again.
func TestSetDelay(t *testing.T) {
	a, _ := echoServer(t)
	p := newProxy(t, a)
	rtt := func(c net.Conn) time.Duration {
		t.Helper()
		t0 := time.Now()
		if _, err := c.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		if _, err := readN(c, 1, 5*time.Second); err != nil {
			t.Fatalf("echo: %v", err)
		}
		return time.Since(t0)
	}
	before := dial(t, p.Addr())
	rtt(before) // connected end to end
	const d = 50 * time.Millisecond
	p.SetDelay(d)
	if p.Delay() != d {
		t.Fatalf("Delay() = %s, want %s", p.Delay(), d)
	}
	after := dial(t, p.Addr())
	for name, c := range map[string]net.Conn{"connection made before SetDelay": before, "connection made after": after} {
		for i := 0; i < 3; i++ {
			if got := rtt(c); got < 2*d {
				t.Fatalf("%s: round trip %s with a delay of %s, want >= %s", name, got, d, 2*d)
			}
		}
	}
	// 4 MiB, 128 chunks of 32 KiB or more: one chunk per delay would take
	// 2*128*50ms = 12.8 s; pipelined it takes about one round trip plus the
	// copying.
	msg := make([]byte, 4<<20)
	for i := range msg {
		msg[i] = byte(rand.IntN(256))
	}
	t0 := time.Now()
	go after.Write(msg)
	got, err := readN(after, len(msg), 30*time.Second)
	if err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("4 MiB through the delayed proxy: %v, intact %v", err, bytes.Equal(got, msg))
	}
	if el := time.Since(t0); el > 6*time.Second {
		t.Fatalf("4 MiB took %s through a %s delay: the delay throttles the stream", el, d)
	}
	p.SetDelay(0)
	rtt(after) // drains what is queued
	fresh := dial(t, p.Addr())
	if got := rtt(fresh); got >= 2*d {
		t.Logf("round trip %s after SetDelay(0) (a loaded machine?)", got)
	}
}
