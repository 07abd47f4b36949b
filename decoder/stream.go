package decoder

import (
	"bufio"
	"io"
	"os"

	"github.com/jackc/pglogrepl"
)

// Streaming (pgoutput protocol version 2 with streaming 'on', PostgreSQL
// 14+). Once a transaction's decoded changes exceed the server's
// logical_decoding_work_mem, the server sends them before the transaction
// ends, in blocks between Stream Start and Stream Stop, blocks of several
// transactions interleaved, and every change inside a block carries the
// xid of the (sub)transaction that made it. Stream Commit or Stream Abort
// (of the whole transaction or of one subtransaction) follows later, outside
// any block. Ordinary transactions still arrive whole between blocks.
//
// A streamed transaction may still abort, so nothing of it is handed out
// before its Stream Commit: its outbox events are kept in a spool (in
// memory within the spill budget, then in an unlinked temporary file). At
// Stream Commit they come out in order, chunked like an ordinary
// transaction (Decode returns the first chunk, Next the others), every
// chunk with the commit LSN and the last with the end LSN. After a
// reconnect the server streams every uncommitted transaction again from
// its start: Close the decoder and begin with a new one.

// SpillStats describes the streamed transactions not yet committed.
type SpillStats struct {
	OpenTxns int   // streamed transactions without Stream Commit or Abort yet
	Events   int   // outbox events they hold
	Bytes    int64 // bytes of those events as records, in memory and on disk
	MemBytes int   // of which in memory
}

// SetSpill sets where streamed transactions' events go once they exceed
// memBytes in memory altogether: unlinked temporary files in dir ("" is
// os.TempDir()). Call before the first Decode.
func (d *Decoder) SetSpill(dir string, memBytes int) {
	d.spillDir, d.spillMem = dir, memBytes
}

// Spilled returns what the open streamed transactions hold. Call from the
// goroutine that calls Decode; it does not block.
func (d *Decoder) Spilled() SpillStats {
	st := SpillStats{OpenTxns: len(d.open), MemBytes: d.memUsed}
	for _, s := range d.open {
		st.Events += s.n
		st.Bytes += s.size
	}
	return st
}

// Close discards every open streamed transaction and removes its file.
// Call it when the stream ends (the server resends them to the next
// session). Idempotent; the Decoder must not be used afterwards.
func (d *Decoder) Close() {
	for xid, s := range d.open {
		s.close()
		delete(d.open, xid)
	}
	d.memUsed = 0
	d.endReplay()
}

// Next returns the next chunk of a streamed transaction whose Stream Commit
// the last Decode returned the first chunk of, or nil when there is none.
// The caller calls it until nil after every Decode that returned a Txn. An
// error (reading the spill file) is fatal to the stream, like a Decode
// error. Call from the goroutine that calls Decode.
func (d *Decoder) Next() (*Txn, error) {
	if d.replay == nil {
		return nil, nil
	}
	return d.nextChunk()
}

// streamStart handles Stream Start: Int32 xid, Int8 first segment.
func (d *Decoder) streamStart(lsn pglogrepl.LSN, b []byte) error {
	if len(b) != 5 {
		return protocolError(lsn, "Stream Start", "%d bytes, want 5", len(b))
	}
	if err := d.between(lsn, "Stream Start"); err != nil {
		return err
	}
	c := cursor{b: b}
	xid, first := c.u32(), c.u8() == 1
	s := d.open[xid]
	switch {
	case first && s != nil:
		return protocolError(lsn, "Stream Start", "first block of transaction %d, which is already streaming", xid)
	case !first && s == nil:
		// Its earlier events would be missing: never guess.
		return protocolError(lsn, "Stream Start", "a later block of transaction %d, whose first block was never seen", xid)
	case first:
		s = &spool{xid: xid}
		if d.open == nil {
			d.open = make(map[uint32]*spool)
		}
		d.open[xid] = s
	}
	d.cur = s
	return nil
}

// streamStop handles Stream Stop (no fields).
func (d *Decoder) streamStop(lsn pglogrepl.LSN, b []byte) error {
	if len(b) != 0 {
		return protocolError(lsn, "Stream Stop", "%d bytes, want 0", len(b))
	}
	if d.cur == nil {
		return protocolError(lsn, "Stream Stop", "no stream block is open")
	}
	d.cur = nil
	return nil
}

// between refuses a message that must come outside any transaction or
// stream block.
func (d *Decoder) between(lsn pglogrepl.LSN, msg string) error {
	if d.cur != nil {
		return protocolError(lsn, msg, "the stream block of transaction %d is open", d.cur.xid)
	}
	if d.inTxn {
		return protocolError(lsn, msg, "transaction %d is still open", d.txn.Xid)
	}
	return nil
}

// streamAbort handles Stream Abort: Int32 xid, Int32 subxid (and, with
// protocol 4's parallel streaming, Int64 abort LSN and Int64 abort time,
// which are not needed).
func (d *Decoder) streamAbort(lsn pglogrepl.LSN, b []byte) error {
	if len(b) != 8 && len(b) != 24 {
		return protocolError(lsn, "Stream Abort", "%d bytes, want 8", len(b))
	}
	if err := d.between(lsn, "Stream Abort"); err != nil {
		return err
	}
	c := cursor{b: b}
	xid, subxid := c.u32(), c.u32()
	s := d.open[xid]
	if s == nil {
		// The server sends an abort for every streamed subtransaction; a
		// transaction it never streamed to this session has nothing here.
		return nil
	}
	if subxid == xid {
		d.drop(s)
		d.counts.StreamAborts++
		return nil
	}
	freed, err := s.truncateSub(subxid)
	if err != nil {
		return d.spillError(lsn, "Stream Abort", s.xid, err)
	}
	d.memUsed -= freed
	return nil
}

func (d *Decoder) drop(s *spool) {
	if s.f == nil {
		d.memUsed -= len(s.mem)
	}
	s.close()
	delete(d.open, s.xid)
}

// streamCommit handles Stream Commit: Int32 xid, Int8 flags, Int64 commit
// LSN, Int64 end LSN, Int64 commit time. It returns the first chunk.
func (d *Decoder) streamCommit(lsn pglogrepl.LSN, b []byte) (*Txn, error) {
	if len(b) != 29 {
		return nil, protocolError(lsn, "Stream Commit", "%d bytes, want 29", len(b))
	}
	if err := d.between(lsn, "Stream Commit"); err != nil {
		return nil, err
	}
	c := cursor{b: b}
	xid := c.u32()
	c.u8() // flags, unused
	s := d.open[xid]
	if s == nil {
		return nil, protocolError(lsn, "Stream Commit", "transaction %d was never streamed", xid)
	}
	r, err := s.reader()
	if err != nil {
		return nil, d.spillError(lsn, "Stream Commit", xid, err)
	}
	commitLSN := pglogrepl.LSN(c.u64())
	d.replay = &replay{
		s: s, r: r, left: s.n,
		txn: Txn{Xid: xid, BeginLSN: commitLSN, CommitLSN: commitLSN, EndLSN: pglogrepl.LSN(c.u64()), CommitTime: pgTime(c.u64())},
	}
	if s.f == nil {
		d.memUsed -= len(s.mem) // the reader holds it until the replay ends
	}
	delete(d.open, xid)
	d.counts.StreamedTxns++
	return d.nextChunk()
}

// replay is a committed streamed transaction being handed out in chunks.
type replay struct {
	s    *spool
	r    *bufio.Reader
	left int // records not read yet
	txn  Txn // CommitLSN, EndLSN, CommitTime, Xid
	buf  []byte
}

// nextChunk reads the next chunk of d.replay: at most the chunk limits, the
// last one (Partial false, EndLSN set) ending the replay.
func (d *Decoder) nextChunk() (*Txn, error) {
	rp := d.replay
	out := rp.txn
	out.Partial = true
	out.EndLSN = 0
	size := 0
	for rp.left > 0 && (d.chunkEvents == 0 || len(out.Events) < d.chunkEvents) && (d.chunkBytes == 0 || size < d.chunkBytes) {
		ev, buf, err := readEvent(rp.r, rp.buf)
		rp.buf = buf
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			xid := rp.txn.Xid
			d.endReplay()
			return nil, d.spillError(rp.txn.CommitLSN, "Stream Commit", xid, err)
		}
		rp.left--
		if ev.TableIndex < len(d.maps) {
			ev.Schema, ev.Table = d.maps[ev.TableIndex].schema, d.maps[ev.TableIndex].name
		}
		out.Events = append(out.Events, ev)
		size += len(ev.Payload)
	}
	if rp.left == 0 {
		out.Partial = false
		out.EndLSN = rp.txn.EndLSN
		d.endReplay()
		d.counts.Txns++
	}
	d.counts.Events += uint64(len(out.Events))
	return &out, nil
}

func (d *Decoder) endReplay() {
	if d.replay != nil {
		d.replay.s.close()
		d.replay = nil
	}
}

// spool adds ev, made by (sub)transaction xid, to the open block's
// transaction, spilling to disk once the in-memory budget is spent.
func (d *Decoder) spoolEvent(lsn pglogrepl.LSN, xid uint32, ev *Event) error {
	s := d.cur
	s.mark(xid)
	d.rec = encodeEvent(d.rec[:0], ev)
	if s.f == nil && d.memUsed+len(d.rec) > d.spillMem {
		// Over budget: this transaction goes to disk.
		held := len(s.mem)
		if err := s.spill(d.spillDirOrTemp()); err != nil {
			return d.spillError(lsn, "Insert", s.xid, err)
		}
		d.memUsed -= held
		d.counts.SpilledTxns++
	}
	if err := s.append(d.rec); err != nil {
		return d.spillError(lsn, "Insert", s.xid, err)
	}
	if s.f == nil {
		d.memUsed += len(d.rec)
	}
	return nil
}

func (d *Decoder) spillDirOrTemp() string {
	if d.spillDir == "" {
		return os.TempDir()
	}
	return d.spillDir
}
