// Package rawconn reads and writes a socket without telling the Go
// scheduler that a system call is under way.
//
// A read or write on a net.Conn enters the runtime's system-call path,
// which wakes the monitor thread (sysmon) whenever every processor was
// idle. At a thousand events a second the relay turns from idle to busy at
// least twice per event (the walsender's message, the broker's answer), so
// the monitor woke, slept 20 us and woke again several times per event:
// about half of the relay's context switches and a third of its CPU. The
// sockets are non-blocking, so a read or write never blocks and needs no
// hand-off of the processor; waiting for readiness still goes through the
// poller, with the connection's deadlines.
package rawconn

import (
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"unsafe"
)

// Conn is a socket connection whose Read and Write use raw system calls.
type Conn struct {
	net.Conn
	rc syscall.RawConn
}

// Wrap returns c reading and writing with raw system calls, or c itself if
// it is not a socket.
func Wrap(c net.Conn) net.Conn {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return c
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return c
	}
	return &Conn{Conn: c, rc: rc}
}

// Unwrap returns the connection Wrap was given.
func (c *Conn) Unwrap() net.Conn { return c.Conn }

// SyscallConn is the underlying socket's.
func (c *Conn) SyscallConn() (syscall.RawConn, error) { return c.rc, nil }

// Read is net.Conn's Read with a raw read(2): it blocks in the poller until
// data arrives, the peer closes (io.EOF), the read deadline passes or the
// connection is closed. As for a net.Conn, one Read and one Write may run
// at once on different goroutines.
func (c *Conn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	var n int
	var errno syscall.Errno
	err := c.rc.Read(func(fd uintptr) bool {
		for {
			r, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
			switch e {
			case 0:
				n = int(r)
				return true
			case syscall.EINTR:
				continue
			case syscall.EAGAIN:
				return false // wait on the poller, then call again
			default:
				errno = e
				return true
			}
		}
	})
	if err != nil {
		return 0, c.opError("read", err)
	}
	if errno != 0 {
		return 0, c.opError("read", os.NewSyscallError("read", errno))
	}
	if n == 0 {
		return 0, io.EOF
	}
	return n, nil
}

// Write is net.Conn's Write with raw write(2)s: it blocks in the poller
// until all of p is written, the write deadline passes or the connection
// is closed, and returns what was written before an error.
func (c *Conn) Write(p []byte) (int, error) {
	var n int
	var errno syscall.Errno
	err := c.rc.Write(func(fd uintptr) bool {
		for n < len(p) {
			r, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&p[n])), uintptr(len(p)-n))
			switch e {
			case 0:
				n += int(r)
			case syscall.EINTR:
			case syscall.EAGAIN:
				return false
			default:
				errno = e
				return true
			}
		}
		return true
	})
	if err != nil {
		return n, c.opError("write", err)
	}
	if errno != 0 {
		return n, c.opError("write", os.NewSyscallError("write", errno))
	}
	return n, nil
}

// opError gives an error the shape net.Conn's own Read and Write give:
// a *net.OpError whose Timeout() reports a passed deadline and which wraps
// os.ErrDeadlineExceeded or net.ErrClosed as theirs do.
func (c *Conn) opError(op string, err error) error {
	var oe *net.OpError
	if errors.As(err, &oe) { // the raw-read/raw-write error of the poller
		err = oe.Err
	}
	return &net.OpError{Op: op, Net: c.LocalAddr().Network(), Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
}
