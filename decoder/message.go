package decoder

import (
	"bytes"
	"math"

	"github.com/jackc/pglogrepl"
)

// Heartbeat is one of the relay's own heartbeats decoded from the slot: a
// pgoutput Message, written by pg_logical_emit_message outside any
// transaction, whose prefix is the one given to SetHeartbeatPrefix.
type Heartbeat struct {
	// LSN is the position of the message's WAL record (its start). Every
	// transaction that committed before it was written is before it in the
	// stream.
	LSN pglogrepl.LSN
	// Sent is the message content read as a decimal int64 (the emitter
	// writes its local Unix time in nanoseconds), or 0 when the content is
	// not such a number.
	Sent int64
}

// SetHeartbeatPrefix makes Decode report the non-transactional Messages
// with exactly this prefix as heartbeats (Heartbeat); "" (the default)
// reports none. Call before the first Decode.
func (d *Decoder) SetHeartbeatPrefix(prefix string) { d.hbPrefix = []byte(prefix) }

// Heartbeat returns the heartbeat decoded by the last Decode call, if that
// call decoded one. Call it from the goroutine that calls Decode; it does
// not block.
func (d *Decoder) Heartbeat() (Heartbeat, bool) { return d.hb, d.hbOK }

// message handles a Message outside any stream block: Int8 flags (1 =
// transactional), Int64 LSN, String prefix, Int32 length, Byte(n) content.
// A transactional Message with the message-event prefix (SetMessagePrefix)
// is an event of the open transaction; a non-transactional one with it is
// refused (messageEvent), handed out at once as a transaction of its own.
// Every other Message is never an error: other applications' (any prefix,
// any content, any size) and transactional ones are counted and ignored,
// and so is one that is malformed, since no outbox event depends on it.
// Nothing is copied, so the content's size costs nothing.
func (d *Decoder) message(walStart pglogrepl.LSN, b []byte) (*Txn, error) {
	if txn, ok, err := d.messageEvent(walStart, 0, b); ok {
		return txn, err
	}
	c := cursor{b: b}
	flags := c.u8()
	lsn := pglogrepl.LSN(c.u64())
	ours := false
	if !c.short && flags == 0 && !d.inTxn && len(d.hbPrefix) > 0 {
		// pgoutput sends a non-transactional message when it decodes its
		// record, never inside the output of a transaction (no streaming).
		rest := b[c.off:]
		if end := bytes.IndexByte(rest, 0); end >= 0 && bytes.Equal(rest[:end], d.hbPrefix) {
			c.off += end + 1
			n := c.u32()
			ours = !c.short && uint64(n) == uint64(c.rest())
		}
	}
	if !ours {
		d.counts.OtherMessages++
		return nil, nil
	}
	d.hb, d.hbOK = Heartbeat{LSN: lsn, Sent: parseNanos(b[c.off:])}, true
	d.counts.Heartbeats++
	return nil, nil
}

// parseNanos reads a non-negative decimal int64, or returns 0.
func parseNanos(b []byte) int64 {
	if len(b) == 0 || len(b) > 19 {
		return 0
	}
	var n int64
	for _, ch := range b {
		if ch < '0' || ch > '9' || n > (math.MaxInt64-int64(ch-'0'))/10 {
			return 0
		}
		n = n*10 + int64(ch-'0')
	}
	return n
}
