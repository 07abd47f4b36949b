package relay

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

type observed struct{ *prometheus.Registry }

func (observed) Health() Health {
	return Health{Ready: true, Reason: "ok", Role: map[string]any{"role": "leader"}}
}

// The server bounds what one client can hold: every timeout set, headers
// capped.
func TestServerLimits(t *testing.T) {
	s := NewServer("127.0.0.1:0", false, observed{prometheus.NewRegistry()}, zerolog.Nop())
	for _, tt := range []struct {
		name string
		got  time.Duration
	}{
		{"ReadHeaderTimeout", s.srv.ReadHeaderTimeout},
		{"ReadTimeout", s.srv.ReadTimeout},
		{"WriteTimeout", s.srv.WriteTimeout},
		{"IdleTimeout", s.srv.IdleTimeout},
	} {
		if tt.got <= 0 || tt.got > 2*time.Minute {
			t.Errorf("%s = %s, want 0 < t <= 2m", tt.name, tt.got)
		}
	}
	if s.srv.MaxHeaderBytes <= 0 || s.srv.MaxHeaderBytes > 64<<10 {
		t.Errorf("MaxHeaderBytes = %d, want 1..64KiB (net/http's default is 1MiB)", s.srv.MaxHeaderBytes)
	}
}

// startShortServer runs a NewServer whose timeouts are cut to short (each
// one that is set) on a free port, and returns its address.
func startShortServer(t *testing.T, profiling bool, short time.Duration) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	s := NewServer(addr, profiling, observed{prometheus.NewRegistry()}, zerolog.Nop())
	for _, d := range []*time.Duration{&s.srv.ReadHeaderTimeout, &s.srv.ReadTimeout, &s.srv.WriteTimeout, &s.srv.IdleTimeout} {
		if *d > 0 {
			*d = short
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			return addr
		}
		if time.Now().After(deadline) {
			t.Fatalf("server not listening on %s: %v", addr, err)
		}
		time.Sleep(10 * time.Millisecond) // polling for the listener, not synchronising goroutines
	}
}

// A slowloris client is cut off: whatever part of a request it holds back,
// the server closes the connection within the timeouts.
func TestSlowClientsAreCut(t *testing.T) {
	const short = 300 * time.Millisecond
	addr := startShortServer(t, false, short)
	for _, tt := range []struct {
		name string
		send func(c net.Conn, r *bufio.Reader) error
	}{
		{"partial header", func(c net.Conn, _ *bufio.Reader) error {
			_, err := io.WriteString(c, "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
			return err
		}},
		{"header trickled byte by byte", func(c net.Conn, _ *bufio.Reader) error {
			go func() { // the server must cut it although bytes keep coming
				for _, b := range []byte("GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa") {
					if _, err := c.Write([]byte{b}); err != nil {
						return
					}
					time.Sleep(50 * time.Millisecond)
				}
			}()
			return nil
		}},
		{"body held back", func(c net.Conn, _ *bufio.Reader) error {
			_, err := io.WriteString(c, "POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nab")
			return err
		}},
		{"idle keep-alive", func(c net.Conn, r *bufio.Reader) error {
			if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
				return err
			}
			resp, err := http.ReadResponse(r, nil)
			if err != nil {
				return err
			}
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return err
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			r := bufio.NewReader(c)
			if err := tt.send(c, r); err != nil {
				t.Fatal(err)
			}
			// Wait (bounded) for the server to close the connection.
			start := time.Now()
			c.SetReadDeadline(start.Add(10 * short))
			_, err = io.Copy(io.Discard, r)
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatalf("connection still open after %s: the server does not cut this client", time.Since(start).Round(time.Millisecond))
			}
		})
	}
}

// A header block over the cap is refused with 431, not buffered.
func TestHugeHeaderRefused(t *testing.T) {
	addr := startShortServer(t, false, 2*time.Second)
	req, _ := http.NewRequest("GET", "http://"+addr+"/healthz", nil)
	req.Header.Set("X-Big", strings.Repeat("a", 100<<10))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("100 KiB header: status %d, want 431", resp.StatusCode)
	}
}

// The pprof routes stream for the requested seconds (30 by default), longer
// than the write and read timeouts of the other routes: they are exempt.
func TestProfileOutlivesTimeouts(t *testing.T) {
	const short = 300 * time.Millisecond
	addr := startShortServer(t, true, short)
	for _, path := range []string{"/debug/pprof/profile?seconds=1", "/debug/pprof/allocs?seconds=1"} {
		start := time.Now()
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK || len(body) == 0 {
			t.Fatalf("%s: status %d, %d bytes, %v: %s", path, resp.StatusCode, len(body), err, body)
		}
		if d := time.Since(start); d < time.Second {
			t.Fatalf("%s answered after %s: not a 1 s profile", path, d)
		}
	}
	// Other routes keep their timeouts.
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
}
