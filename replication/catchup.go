package replication

import (
	"bufio"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
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
// first lets the socket fill; the reads then take up to catchUpBuffer
// bytes at a time. Live traffic (the server's WAL end near the stream)
// reads at once.
//
// On TCP (Linux) the kernel does the waiting: with SO_RCVLOWAT at
// catchUpMark the poller wakes the reader only once that much is queued,
// one wake-up per ~160 rows instead of one per few, and a timer lowers the
// mark after catchUpMaxWait so the tail of a backlog (or a walsender busy
// decoding other tables) is not held. Measured against a 50 us sleep
// after a short read (500k events of 100 rows/txn, alternating runs):
// context switches 0.2-0.3x, relay CPU per event 0.67-0.80x, events/s
// 1.1-1.17x; 1-row transactions 0.7-0.8x the CPU at the same speed. On a
// Unix socket, whose readiness ignores the mark, the reader sleeps
// catchUpWait before the read instead.
//
// Only on a plain socket, where a read returns all the bytes that arrived:
// a TLS connection returns one record per read, and the walsender writes a
// record per message, so every read would look short and wait.
const (
	// catchUpBehind is how far behind the server's WAL end (IDENTIFY_SYSTEM
	// at the start of a session, then each heartbeat) counts as catching
	// up: several transactions of 100 outbox rows.
	catchUpBehind = 256 << 10
	// catchUpWait is the pause before a read that follows a short one on a
	// Unix socket. Measured in drains, 500 us let the walsender fill the
	// socket's receive window and wait on it (6% fewer events/s); 50 us did
	// not.
	catchUpWait = 50 * time.Microsecond
	// catchUpShort is a read that counts as short: a reader this far ahead
	// of the walsender would otherwise read once per message.
	catchUpShort  = 16 << 10
	catchUpBuffer = 256 << 10
	// catchUpMark is the receive low-water mark while catching up: half
	// the buffer, so the walsender never waits on a full window meanwhile
	// (Linux grows the receive buffer to hold the mark). 128 KiB against
	// 32: read system calls per event halved and the relay's CPU per event
	// 0.89x (medians of 6 alternating 300k-event drains of 100-row
	// transactions, 2026-12-03); 256 KiB saved little more and drained
	// slower.
	catchUpMark = 128 << 10
	// catchUpMaxWait bounds a wait for the mark: at a drain's ~40 MB/s the
	// mark fills in about 3 ms.
	catchUpMaxWait = 4 * time.Millisecond
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

	raw     syscall.RawConn // a TCP socket whose mark can be set, else nil
	timer   *time.Timer     // lowers the mark after maxWait
	maxWait time.Duration   // catchUpMaxWait; tests lengthen it
	mu      sync.Mutex      // the mark: the reader and the timer set it
	mark    int             // SO_RCVLOWAT now
}

func (c *catchUpReader) Read(p []byte) (int, error) {
	behind := c.behind.Load()
	if behind && c.short.Load() && c.plain.Load() {
		c.waits.Add(1)
		if c.raw != nil {
			c.fill()
		} else {
			time.Sleep(catchUpWait)
		}
	} else if !behind && c.raw != nil {
		c.setMark(1) // live: wake on the first byte again
	}
	n, err := c.r.Read(p)
	c.short.Store(n < catchUpShort)
	return n, err
}

// fill waits, without reading, until catchUpMark bytes are queued on the
// socket, catchUpMaxWait passed or the connection's read deadline did (the
// read after it then fails as it would have). The read itself goes through
// pgconn's reader as always.
func (c *catchUpReader) fill() {
	c.setMark(catchUpMark)
	c.timer.Reset(c.maxWait)
	waited := false
	_ = c.raw.Read(func(uintptr) bool {
		if waited {
			return true // readable, or the mark was lowered with bytes queued
		}
		waited = true
		return false // park on the poller until the socket is readable
	})
	c.timer.Stop()
}

// lower is the timer's: a wait past catchUpMaxWait takes what is queued.
// Lowering SO_RCVLOWAT wakes the poller if bytes are there (Linux checks
// the queue against the new mark at once). A timer that fires after its
// wait ended is harmless: every wait sets the mark first.
func (c *catchUpReader) lower() { c.setMark(1) }

func (c *catchUpReader) setMark(v int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mark == v {
		return
	}
	c.mark = v
	_ = c.raw.Control(func(fd uintptr) { setLowWater(fd, v) })
}

// onSocket enables the waits if conn is a plain socket (see above).
func (c *catchUpReader) onSocket(conn net.Conn) {
	if w, ok := conn.(interface{ Unwrap() net.Conn }); ok {
		conn = w.Unwrap() // rawconn: the socket beneath
	}
	switch conn := conn.(type) {
	case *net.TCPConn:
		c.plain.Store(true)
		if !lowWaterWakes {
			return // the reader sleeps instead
		}
		raw, err := conn.SyscallConn()
		if err != nil {
			return // no socket (a test's zero conn): the reader sleeps
		}
		c.raw, c.mark, c.maxWait = raw, 1, catchUpMaxWait
		c.timer = time.AfterFunc(time.Hour, c.lower)
		c.timer.Stop()
	case *net.UnixConn:
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
