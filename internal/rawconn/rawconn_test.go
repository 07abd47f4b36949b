package rawconn

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// pair returns a wrapped client connection and the server's end of it.
func pair(t *testing.T, network string) (client net.Conn, server net.Conn) {
	t.Helper()
	addr := "127.0.0.1:0"
	if network == "unix" {
		addr = filepath.Join(t.TempDir(), "s")
	}
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			t.Error(err)
		}
		accepted <- c
	}()
	c, err := net.Dial(network, ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	w := Wrap(c)
	if _, ok := w.(*Conn); !ok {
		t.Fatalf("Wrap(%T) = %T, want *Conn", c, w)
	}
	s := <-accepted
	t.Cleanup(func() { _ = w.Close(); _ = s.Close() })
	return w, s
}

func TestRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		network string
		size    int
	}{
		{"tcp", 1},
		{"tcp", 100},
		{"tcp", 8 << 20}, // beyond the socket buffers: writes meet EAGAIN and wait
		{"unix", 8 << 20},
	} {
		c, s := pair(t, tc.network)
		want := make([]byte, tc.size)
		_, _ = rand.Read(want)
		// Both directions at once: the wrapped side writes while the other
		// reads slowly, then reads what the other side echoes.
		go func() {
			buf := make([]byte, 1000)
			got := make([]byte, 0, tc.size)
			for len(got) < tc.size {
				n, err := s.Read(buf)
				if err != nil {
					t.Errorf("%s %d: server read: %v", tc.network, tc.size, err)
					return
				}
				got = append(got, buf[:n]...)
			}
			_, _ = s.Write(got)
		}()
		n, err := c.Write(want)
		if err != nil || n != tc.size {
			t.Fatalf("%s %d: Write = %d, %v", tc.network, tc.size, n, err)
		}
		got := make([]byte, tc.size)
		if _, err := io.ReadFull(c, got); err != nil {
			t.Fatalf("%s %d: read back: %v", tc.network, tc.size, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%s %d: bytes differ", tc.network, tc.size)
		}
	}
}

func TestErrorsAsNet(t *testing.T) {
	t.Run("read deadline", func(t *testing.T) {
		c, _ := pair(t, "tcp")
		_ = c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
		_, err := c.Read(make([]byte, 10))
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() || !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("Read past the deadline = %v, want a net.Error with Timeout() and os.ErrDeadlineExceeded", err)
		}
		var oe *net.OpError
		if !errors.As(err, &oe) || oe.Op != "read" {
			t.Fatalf("Read error = %#v, want a *net.OpError of op read", err)
		}
	})
	t.Run("write deadline", func(t *testing.T) {
		c, _ := pair(t, "tcp") // nobody reads: the buffers fill
		_ = c.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
		n, err := c.Write(make([]byte, 64<<20))
		if !errors.Is(err, os.ErrDeadlineExceeded) || n == 0 || n == 64<<20 {
			t.Fatalf("Write past the deadline = %d, %v; want part written and os.ErrDeadlineExceeded", n, err)
		}
	})
	t.Run("closed while reading", func(t *testing.T) {
		c, _ := pair(t, "tcp")
		time.AfterFunc(20*time.Millisecond, func() { _ = c.Close() })
		_, err := c.Read(make([]byte, 10))
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Read on a closed conn = %v, want net.ErrClosed", err)
		}
	})
	t.Run("peer closed", func(t *testing.T) {
		c, s := pair(t, "tcp")
		_, _ = s.Write([]byte("last"))
		_ = s.Close()
		got, err := io.ReadAll(c)
		if err != nil || string(got) != "last" {
			t.Fatalf("ReadAll after the peer closed = %q, %v; want \"last\", nil (io.EOF ends it)", got, err)
		}
		_, err = c.Read(make([]byte, 1))
		if err != io.EOF {
			t.Fatalf("Read after EOF = %v, want io.EOF", err)
		}
	})
	t.Run("peer reset on write", func(t *testing.T) {
		c, s := pair(t, "tcp")
		_ = s.(*net.TCPConn).SetLinger(0)
		_ = s.Close() // RST
		var err error
		for i := 0; i < 100 && err == nil; i++ {
			_, err = c.Write([]byte("x"))
			time.Sleep(time.Millisecond)
		}
		var oe *net.OpError
		if !errors.As(err, &oe) || oe.Op != "write" || !errors.Is(err, syscall.EPIPE) && !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("Write to a reset peer = %v, want a *net.OpError of op write with EPIPE or ECONNRESET", err)
		}
	})
}

func TestWrapLeavesOthers(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if w := Wrap(a); w != a {
		t.Fatalf("Wrap(net.Pipe) = %T, want the pipe itself", w)
	}
}
