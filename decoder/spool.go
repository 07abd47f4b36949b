package decoder

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/jackc/pglogrepl"
)

// spool holds the outbox events of one streamed, uncommitted transaction
// as records (encodeEvent), in the order the server sent them: in memory
// while the decoder's spill budget allows, then in an unlinked temporary
// file. The file has no name from the moment it is created, so nothing is
// left behind by a crash; close releases it.
type spool struct {
	xid  uint32
	mem  []byte
	f    *os.File
	w    *bufio.Writer // buffers appends to f
	size int64         // bytes of records
	n    int           // records
	// subs marks where each subtransaction's first record starts, in
	// stream order, so that its abort truncates the spool there (as
	// PostgreSQL's apply worker does): changes after it belong to it or to
	// subtransactions nested in it, which abort with it.
	subs []subMark
}

type subMark struct {
	xid  uint32
	size int64
	n    int
}

// mark records that subxid's first record comes next.
func (s *spool) mark(subxid uint32) {
	if subxid == s.xid {
		return
	}
	for _, m := range s.subs {
		if m.xid == subxid {
			return
		}
	}
	s.subs = append(s.subs, subMark{subxid, s.size, s.n})
}

// truncateSub drops subxid's records and everything after them; a subxid
// with no records changes nothing. It returns the bytes dropped from
// memory.
func (s *spool) truncateSub(subxid uint32) (freed int, err error) {
	for i, m := range s.subs {
		if m.xid != subxid {
			continue
		}
		s.subs = s.subs[:i]
		s.n = m.n
		if s.f == nil {
			freed = len(s.mem) - int(m.size)
			s.mem = s.mem[:m.size]
		} else {
			if err := s.w.Flush(); err != nil {
				return 0, err
			}
			if err := s.f.Truncate(m.size); err != nil {
				return 0, err
			}
			if _, err := s.f.Seek(m.size, io.SeekStart); err != nil {
				return 0, err
			}
		}
		s.size = m.size
		return freed, nil
	}
	return 0, nil
}

// spill moves the records to a new unlinked file in dir.
func (s *spool) spill(dir string) error {
	f, err := os.CreateTemp(dir, fmt.Sprintf("outbox-relay-xid%d-*.spill", s.xid))
	if err != nil {
		return err
	}
	if err := os.Remove(f.Name()); err != nil {
		f.Close()
		return err
	}
	s.f, s.w = f, bufio.NewWriterSize(f, 64<<10)
	if _, err := s.w.Write(s.mem); err != nil {
		return err
	}
	s.mem = nil
	return nil
}

func (s *spool) append(rec []byte) error {
	if s.f == nil {
		s.mem = append(s.mem, rec...)
	} else if _, err := s.w.Write(rec); err != nil {
		return err
	}
	s.size += int64(len(rec))
	s.n++
	return nil
}

// reader returns the records from the start. The spool takes no more
// appends afterwards.
func (s *spool) reader() (*bufio.Reader, error) {
	if s.f == nil {
		return bufio.NewReader(bytes.NewReader(s.mem)), nil
	}
	if err := s.w.Flush(); err != nil {
		return nil, err
	}
	if _, err := s.f.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	return bufio.NewReaderSize(io.LimitReader(s.f, s.size), 64<<10), nil
}

// close releases the file, if any; idempotent.
func (s *spool) close() {
	if s.f != nil {
		s.f.Close()
		s.f, s.w = nil, nil
	}
	s.mem = nil
}

// Records: a uvarint length, then the Event's fields (encodeEvent).

var errRecord = errors.New("spill record is corrupt")

func appendBytes(b, v []byte, keepNil bool) []byte {
	if keepNil {
		if v == nil {
			return binary.AppendUvarint(b, 0)
		}
		b = binary.AppendUvarint(b, uint64(len(v))+1)
	} else {
		b = binary.AppendUvarint(b, uint64(len(v)))
	}
	return append(b, v...)
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// encodeEvent appends ev as one length-prefixed record to b.
func encodeEvent(b []byte, ev *Event) []byte {
	start := len(b)
	b = append(b, make([]byte, binary.MaxVarintLen64)...) // room for the length, fixed up below
	body := len(b)
	b = binary.BigEndian.AppendUint64(b, uint64(ev.LSN))
	b = binary.AppendVarint(b, ev.ID)
	b = appendString(b, ev.IDText)
	b = binary.AppendUvarint(b, uint64(ev.TableIndex))
	b = appendString(b, ev.AggregateType)
	b = appendString(b, ev.AggregateID)
	b = appendString(b, ev.EventType)
	b = appendBytes(b, ev.Payload, true)
	if ev.Headers == nil {
		b = binary.AppendUvarint(b, 0)
	} else {
		b = binary.AppendUvarint(b, uint64(len(ev.Headers))+1)
		for _, h := range ev.Headers {
			b = appendString(b, h.Key)
			b = appendBytes(b, h.Value, true)
		}
	}
	if e := ev.Err; e == nil {
		b = append(b, 0)
	} else {
		b = append(b, 1)
		b = appendString(b, e.Table)
		b = binary.AppendVarint(b, e.ID)
		b = appendString(b, e.IDText)
		b = binary.BigEndian.AppendUint64(b, uint64(e.LSN))
		b = appendString(b, e.Column)
		b = appendString(b, e.Reason)
		b = appendString(b, e.ReservedHeader)
		b = appendString(b, e.hint)
		b = appendString(b, e.Prefix)
		b = appendString(b, e.MessageID)
	}
	b = append(b, byte(ev.Source))
	b = appendString(b, ev.MessageID)
	b = appendString(b, ev.EventID)
	b = binary.AppendVarint(b, ev.ReplayOf)
	// Move the body right behind its actual length prefix.
	n := len(b) - body
	var lenBuf [binary.MaxVarintLen64]byte
	l := binary.PutUvarint(lenBuf[:], uint64(n))
	copy(b[start:], lenBuf[:l])
	copy(b[start+l:], b[body:])
	return b[:start+l+n]
}

// readEvent reads one record from r into a new Event; io.EOF at the end.
// buf is scratch, returned for reuse.
func readEvent(r *bufio.Reader, buf []byte) (Event, []byte, error) {
	n, err := binary.ReadUvarint(r)
	if err != nil {
		return Event{}, buf, err // io.EOF between records
	}
	if n > 1<<31 {
		return Event{}, buf, errRecord
	}
	if uint64(cap(buf)) < n {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	if _, err := io.ReadFull(r, buf); err != nil {
		return Event{}, buf, fmt.Errorf("%w: %v", errRecord, err)
	}
	c := recCursor{b: buf}
	var ev Event
	ev.LSN = pglogrepl.LSN(c.u64())
	ev.ID = c.varint()
	ev.IDText = string(c.bytes(false))
	ev.TableIndex = int(c.uvarint())
	ev.AggregateType = string(c.bytes(false))
	ev.AggregateID = string(c.bytes(false))
	ev.EventType = string(c.bytes(false))
	payload := c.bytes(true)
	nh := c.uvarint()
	type span struct {
		key        string
		start, end int
		null       bool
	}
	var (
		spans []span
		vals  []byte
	)
	if nh > 0 {
		if nh-1 > uint64(len(buf)) {
			return Event{}, buf, errRecord
		}
		spans = make([]span, 0, nh-1)
		for i := uint64(0); i < nh-1 && !c.bad; i++ {
			k := string(c.bytes(false))
			v := c.bytes(true)
			spans = append(spans, span{k, len(vals), len(vals) + len(v), v == nil})
			vals = append(vals, v...)
		}
	}
	if c.u8() == 1 {
		e := &RowError{}
		e.Table = string(c.bytes(false))
		e.ID = c.varint()
		e.IDText = string(c.bytes(false))
		e.LSN = pglogrepl.LSN(c.u64())
		e.Column = string(c.bytes(false))
		e.Reason = string(c.bytes(false))
		e.ReservedHeader = string(c.bytes(false))
		e.hint = string(c.bytes(false))
		e.Prefix = string(c.bytes(false))
		e.MessageID = string(c.bytes(false))
		ev.Err = e
	}
	ev.Source = Source(c.u8())
	ev.MessageID = string(c.bytes(false))
	ev.EventID = string(c.bytes(false))
	ev.ReplayOf = c.varint()
	if c.bad || c.off != len(buf) {
		return Event{}, buf, errRecord
	}
	// One allocation for the payload and the header values, as Decode makes.
	if payload != nil || nh > 0 {
		all := make([]byte, len(payload)+len(vals))
		p := copy(all, payload)
		copy(all[p:], vals)
		if payload != nil {
			ev.Payload = all[:p:p]
		}
		if nh > 0 {
			ev.Headers = make([]Header, len(spans))
			for i, s := range spans {
				ev.Headers[i].Key = s.key
				if !s.null {
					ev.Headers[i].Value = all[p+s.start : p+s.end : p+s.end]
				}
			}
		}
	}
	return ev, buf, nil
}

type recCursor struct {
	b   []byte
	off int
	bad bool
}

func (c *recCursor) u8() byte {
	if c.bad || c.off >= len(c.b) {
		c.bad = true
		return 0
	}
	c.off++
	return c.b[c.off-1]
}

func (c *recCursor) u64() uint64 {
	if c.bad || len(c.b)-c.off < 8 {
		c.bad = true
		return 0
	}
	c.off += 8
	return binary.BigEndian.Uint64(c.b[c.off-8:])
}

func (c *recCursor) uvarint() uint64 {
	if c.bad {
		return 0
	}
	v, n := binary.Uvarint(c.b[c.off:])
	if n <= 0 {
		c.bad = true
		return 0
	}
	c.off += n
	return v
}

func (c *recCursor) varint() int64 {
	if c.bad {
		return 0
	}
	v, n := binary.Varint(c.b[c.off:])
	if n <= 0 {
		c.bad = true
		return 0
	}
	c.off += n
	return v
}

// bytes reads a length-prefixed field; with keepNil a zero length means
// nil and others are one more than the length.
func (c *recCursor) bytes(keepNil bool) []byte {
	n := c.uvarint()
	if c.bad {
		return nil
	}
	if keepNil {
		if n == 0 {
			return nil
		}
		n--
	}
	if n > uint64(len(c.b)-c.off) {
		c.bad = true
		return nil
	}
	v := c.b[c.off : c.off+int(n) : c.off+int(n)]
	c.off += int(n)
	if v == nil {
		v = []byte{}
	}
	return v
}
