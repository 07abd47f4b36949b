package replication

import (
	"bufio"
	"io"
	"net"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
)

// The walsender flushes its socket after every message, so a reader that
// keeps up makes a read system call (and a wake-up) for every message or
// two, and each send of the walsender wakes it, on the walsender's CPU. In
// a drain of one-row transactions that made the relay (direct producer)
// half as fast as with sarama's producer, which slowed its loop enough to
// read full buffers, and doubled the walsender's CPU per event. While the
// stream is catching up (the server's WAL end well ahead of what was
// received, so what arrives is old anyway), a read that found little
// waits a moment first and lets the socket fill; the reads then take up
// to catchUpBuffer bytes at a time.
// Live traffic (the server's WAL end near the stream) reads at once.
//
// Only on a plain socket, where a read returns all the bytes that arrived:
// a TLS connection returns one record per read, and the walsender writes a
// record per message, so every read would look short and wait.
const (
	// catchUpBehind is how far behind the server's WAL end (IDENTIFY_SYSTEM
	// at the start of a session, then each heartbeat) counts as catching
	// up: several transactions of 100 outbox rows.
	catchUpBehind = 256 << 10
	// catchUpWait is the least pause before a read that follows a short
	// one: other goroutines run meanwhile, and in an idle process the timer
	// fires with the next network event (the runtime's poller sleeps in
	// milliseconds). Measured in drains, 500 us let the walsender fill the
	// socket's receive window and wait on it (6% fewer events/s); 50 us did
	// not.
	catchUpWait = 50 * time.Microsecond
	// catchUpShort is a read that counts as short: a reader this far ahead
	// of the walsender would otherwise read once per message.
	catchUpShort  = 16 << 10
	catchUpBuffer = 64 << 10
)

// catchUpReader sits under pgproto3's reader on the replication connection.
// Only the stream's loop reads through it; behind is set from the loop too,
// but pgconn may read from its background reader, hence the atomics.
type catchUpReader struct {
	r      io.Reader
	plain  atomic.Bool // set once the connection is known not to be TLS
	behind atomic.Bool
	short  atomic.Bool // the last read returned less than catchUpShort
	waits  atomic.Uint64
}

func (c *catchUpReader) Read(p []byte) (int, error) {
	if c.short.Load() && c.behind.Load() && c.plain.Load() {
		c.waits.Add(1)
		time.Sleep(catchUpWait)
	}
	n, err := c.r.Read(p)
	c.short.Store(n < catchUpShort)
	return n, err
}

// onSocket enables the waits if conn is a plain socket (see above).
func (c *catchUpReader) onSocket(conn net.Conn) {
	switch conn.(type) {
	case *net.TCPConn, *net.UnixConn:
		c.plain.Store(true)
	}
}

// observe records where the stream is against the server's WAL end.
func (c *catchUpReader) observe(at, serverEnd pglogrepl.LSN) {
	if c == nil {
		return // a stream tested without a connection
	}
	c.behind.Store(serverEnd > at && serverEnd-at > catchUpBehind)
}

// newCatchUpReader wraps r (the connection) in a reader that batches while
// catching up, under a buffer big enough to take what accumulated.
func newCatchUpReader(r io.Reader) (*catchUpReader, io.Reader) {
	c := &catchUpReader{r: r}
	return c, bufio.NewReaderSize(c, catchUpBuffer)
}
