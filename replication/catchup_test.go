package replication

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
)

// chunks returns its chunks one per Read, like a socket the walsender
// writes one message at a time.
type chunks struct{ parts [][]byte }

func (c *chunks) Read(p []byte) (int, error) {
	if len(c.parts) == 0 {
		return 0, io.EOF
	}
	n := copy(p, c.parts[0])
	c.parts[0] = c.parts[0][n:]
	if len(c.parts[0]) == 0 {
		c.parts = c.parts[1:]
	}
	return n, nil
}

func TestCatchUpReaderWaitsOnlyWhileBehind(t *testing.T) {
	small := bytes.Repeat([]byte("m"), 300)
	big := bytes.Repeat([]byte("b"), catchUpShort)
	tests := []struct {
		name      string
		at, end   pglogrepl.LSN
		tls       bool
		parts     [][]byte
		wantWaits uint64
	}{
		{"live: never waits", 0x1000000, 0x1000100, false, [][]byte{small, small, small}, 0},
		{"server end behind the stream (a new timeline): never waits", 0x2000000, 0x1000000, false, [][]byte{small, small}, 0},
		{"exactly the threshold behind: live", 0x1000000, 0x1000000 + catchUpBehind, false, [][]byte{small, small}, 0},
		// the first read has nothing short before it; each later one follows a short read
		{"behind, short reads: waits before each read after a short one", 0x1000000, 0x3000000, false, [][]byte{small, small, small}, 3},
		{"behind, full reads: no wait", 0x1000000, 0x3000000, false, [][]byte{big, big}, 0},
		{"behind on TLS (one record per read): never waits", 0x1000000, 0x3000000, true, [][]byte{small, small, small}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := &chunks{parts: tt.parts}
			var want []byte
			for _, p := range tt.parts {
				want = append(want, p...)
			}
			c, r := newCatchUpReader(src)
			if tt.tls {
				c.onSocket(tls.Client(nil, nil))
			} else {
				c.onSocket(&net.TCPConn{})
			}
			c.observe(tt.at, tt.end)
			got, err := io.ReadAll(r)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("read %d bytes, want the %d written, unchanged", len(got), len(want))
			}
			if w := c.waits.Load(); w != tt.wantWaits {
				t.Errorf("waited %d times, want %d", w, tt.wantWaits)
			}
		})
	}
	var nilReader *catchUpReader
	nilReader.observe(1, 1<<40) // a stream without a connection: no panic
}

// On a TCP socket the wait is the kernel's: SO_RCVLOWAT at catchUpMark
// while catching up, back to 1 when live; a wait that the mark does not end
// ends after catchUpMaxWait with what is queued, or at the read deadline.
func TestCatchUpReaderLowWaterMarkOnTCP(t *testing.T) {
	if !lowWaterWakes {
		t.Skip("no receive low-water mark on this OS: the reader sleeps instead (covered above)")
	}
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
	conn, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
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
