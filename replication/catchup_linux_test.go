//go:build linux

package replication

import (
	"bytes"
	"errors"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/rawconn"
)

// On a TCP socket the wait is the kernel's: SO_RCVLOWAT at catchUpMark
// while catching up, back to 1 when live; a wait that the mark does not end
// ends after catchUpMaxWait with what is queued, or at the read deadline.
func TestCatchUpReaderLowWaterMarkOnTCP(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	w, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	accepted, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	conn := rawconn.Wrap(accepted) // as connectReplication dials it
	defer conn.Close()
	c, r := newCatchUpReader(conn)
	c.onSocket(conn)
	if c.raw == nil {
		t.Fatal("a TCP socket got no low-water mark")
	}
	mark := func() int {
		var v int
		var serr error
		if err := c.raw.Control(func(fd uintptr) {
			v, serr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVLOWAT)
		}); err != nil {
			t.Fatal(err)
		}
		if serr != nil {
			t.Fatal(serr)
		}
		return v
	}
	small := bytes.Repeat([]byte("m"), 300)
	buf := make([]byte, catchUpBuffer)
	read := func() (int, time.Duration, error) {
		start := time.Now()
		n, err := r.Read(buf)
		return n, time.Since(start), err
	}

	c.observe(0x1000000, 0x3000000) // behind
	if _, err := w.Write(small); err != nil {
		t.Fatal(err)
	}
	if n, _, err := read(); err != nil || n != len(small) {
		t.Fatalf("first read: %d bytes, %v; want the %d written (no wait before the first read)", n, err, len(small))
	}
	if c.waits.Load() != 0 {
		t.Fatalf("waited %d times before the first read", c.waits.Load())
	}
	// A short read came before: the next waits for the mark, which 300
	// bytes never reach, so the timer ends the wait.
	if _, err := w.Write(small); err != nil {
		t.Fatal(err)
	}
	n, took, err := read()
	if err != nil || n != len(small) {
		t.Fatalf("tail under the mark: %d bytes, %v; want the %d queued", n, err, len(small))
	}
	if took < catchUpMaxWait || took > 5*time.Second {
		t.Fatalf("tail under the mark read after %s, want after the %s wait (the mark held it) and not much later", took, catchUpMaxWait)
	}
	if c.waits.Load() != 1 {
		t.Fatalf("waited %d times, want 1", c.waits.Load())
	}
	if got := mark(); got != 1 {
		t.Fatalf("SO_RCVLOWAT after the timer: %d, want 1", got)
	}

	// Without the timer only the mark ends a wait: it is set while
	// waiting, 300 bytes do not reach it, a mark's worth does.
	c.maxWait = time.Hour
	type result struct {
		n   int
		err error
	}
	done := make(chan result, 1)
	go func() { n, _, err := read(); done <- result{n, err} }()
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for end := time.Now().Add(5 * time.Second); !ok(); time.Sleep(time.Millisecond) {
			if time.Now().After(end) {
				t.Fatal(what)
			}
		}
	}
	waitFor("SO_RCVLOWAT never became catchUpMark in a catching-up wait", func() bool { return mark() == catchUpMark })
	if _, err := w.Write(small); err != nil {
		t.Fatal(err)
	}
	select {
	case res := <-done:
		t.Fatalf("300 bytes ended a wait for a %d-byte mark (read %d, %v)", catchUpMark, res.n, res.err)
	case <-time.After(100 * time.Millisecond):
	}
	if _, err := w.Write(bytes.Repeat([]byte("b"), catchUpMark)); err != nil {
		t.Fatal(err)
	}
	select {
	case res := <-done:
		if res.err != nil || res.n < catchUpMark {
			t.Fatalf("read after the mark was reached: %d bytes, %v; want at least %d", res.n, res.err, catchUpMark)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the mark was reached and the wait went on")
	}
	// One short read, so that the next one waits again.
	if _, err := w.Write(small); err != nil {
		t.Fatal(err)
	}
	if n, _, err := read(); err != nil || n != len(small) {
		t.Fatalf("read after a full one: %d bytes, %v; want the %d written at once", n, err, len(small))
	}

	// The read deadline ends a wait with nothing queued: the stream's loop
	// relies on it (its poll, and the end of its context).
	if err := conn.SetReadDeadline(time.Now().Add(50 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	go func() { n, _, err := read(); done <- result{n, err} }()
	select {
	case res := <-done:
		if !errors.Is(res.err, os.ErrDeadlineExceeded) {
			t.Fatalf("read past the deadline: %d bytes, %v; want the deadline error", res.n, res.err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a wait for the mark outlived the connection's read deadline")
	}
	if err := conn.SetReadDeadline(time.Time{}); err != nil {
		t.Fatal(err)
	}

	// Live again: the first byte wakes the reader.
	c.observe(0x3000000, 0x3000100)
	if _, err := w.Write(small); err != nil {
		t.Fatal(err)
	}
	if n, _, err := read(); err != nil || n != len(small) {
		t.Fatalf("live read: %d bytes, %v", n, err)
	}
	if got := mark(); got != 1 {
		t.Fatalf("SO_RCVLOWAT when live: %d, want 1", got)
	}
}
