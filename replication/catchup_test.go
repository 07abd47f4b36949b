package replication

import (
	"bytes"
	"crypto/tls"
	"io"
	"net"
	"testing"

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
