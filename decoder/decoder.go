// Package decoder turns pgoutput (protocol version 1, or 2 with streaming:
// stream.go) messages into outbox transactions.
//
// It is pure: no goroutines, no clock, and no I/O except the temporary files
// of streamed transactions too large for memory (SetSpill). The replication
// loop hands it the walData of every XLogData in log order. On Commit,
// Decode returns the transaction with its outbox events; a transaction over
// the chunk limits (SetChunk) or streamed (stream.go) comes out in chunks
// (Txn.Partial, Next). The caller registers every transaction and chunk
// with the checkpoint tracker, including those without events, so that
// checkpoints keep log order. Then it publishes the events.
//
// The parsing is written by hand instead of calling pglogrepl.Parse, which
// allocates a struct per message and per column. Here an event allocates only
// the bytes it keeps.
package decoder

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/outboxschema"
)

// Event is one outbox row, ready to publish. Every byte slice and string is
// owned by the Event (copied out of walData), so it outlives the Decode call
// and may be handed to another goroutine. The Payload and the Values of
// Headers, and the Headers slices of the events of a transaction, may share
// backing arrays (with each other and with other events, of this
// transaction or another), each capped so that an append to one can never
// overwrite another; the Decoder never writes to them once handed out.
type Event struct {
	ID            int64 // outbox.id
	AggregateType string
	AggregateID   string // never empty
	EventType     string
	// Payload is the payload column's text exactly as pgoutput sent it (for
	// jsonb, Postgres's own rendering), not re-encoded; for bytea, the raw
	// bytes. nil (and Err nil) only for a NULL payload of a table whose
	// mapping has TombstoneOnNull: a record with a null value.
	Payload []byte
	// Headers holds the top-level keys of the headers column in the order of
	// the text pgoutput sent. jsonb stores keys sorted (shorter first), so that
	// is the order you get, not the order the producer wrote. Headers is nil when
	// the column is NULL or the table has no headers column, and empty but
	// non-nil for {}. The mapping's additional columns follow
	// (columns.additional), each with its header name and the column's text
	// (Value nil for NULL).
	Headers []Header
	// Read through a column mapping (NewMapped): ID is the id column's
	// value when it is an integer, else 0 and IDText is its text (uuid,
	// text); AggregateID is the key column's text, AggregateType the
	// route_by column's and EventType the type column's ("" when none is
	// mapped). Schema and Table name the row's outbox table; TableIndex is
	// the index of its mapping in the list given to NewMapped (0 with New).
	IDText        string
	Schema, Table string
	TableIndex    int
	// LSN is the WAL position of the Insert (or of the Message): the
	// walStart passed to Decode.
	LSN pglogrepl.LSN
	// Source is where the event comes from: an outbox row (SourceRow, the
	// zero value) or a logical decoding message (SourceMessage, see
	// SetMessagePrefix; ID is then 0 and MessageID is the event id).
	Source Source
	// MessageID is the "id" of a SourceMessage event's envelope: its
	// event_id. "" for rows.
	MessageID string
	// EventID is the row's event_id column (the relay's own table,
	// migration 0006): a UUID's text, the event's identity instead of its
	// id. "" when the column is NULL (a row written before the migration)
	// or the table has none. Record builders take the identity from
	// Identity, not from here.
	EventID string
	// ReplayOf is the row's dlq_replay_of column: the id of the
	// dead-lettered row whose event this row republishes (outbox-relay dlq
	// replay), 0 for none.
	ReplayOf int64
	// Err is set when the row cannot become an event (a poison row): a
	// required column NULL, empty, missing or not text, an integer id
	// column whose text is not a 64-bit integer, an event_id that is not a
	// UUID's text or a dlq_replay_of not a row id, a bytea payload that is
	// not hex, headers that are not a JSON object or hold a key the
	// header-name rule refuses (outboxschema.CheckHeaderName), or a
	// refused message event (RowError).
	// The other fields then hold what could be read (text columns as sent,
	// Headers nil), so the caller can dead-letter the row or stop on it; the
	// stream goes on.
	Err *RowError
}

// IdentityKind says which field is an event's identity (Identity).
type IdentityKind uint8

const (
	IdentityID       IdentityKind = iota // Event.ID, in decimal
	IdentityIDText                       // Event.IDText: a mapped table's uuid or text id
	IdentityEventID                      // Event.EventID: the row's event_id column
	IdentityReplayOf                     // Event.ReplayOf, in decimal: a dlq replay copy of a row that had no event_id
	IdentityMessage                      // Event.MessageID: a message event's envelope id
)

// Identity says which field is ev's identity, the event_id header of its
// record: the envelope id of a message event; else the row's event_id
// column when not NULL; else, for a dlq replay copy, the replayed row's
// id (the identity of a row without event_id); else the id column's
// value. It does not allocate; any goroutine.
func (ev *Event) Identity() IdentityKind {
	switch {
	case ev.Source == SourceMessage:
		return IdentityMessage
	case ev.EventID != "":
		return IdentityEventID
	case ev.ReplayOf != 0:
		return IdentityReplayOf
	case ev.IDText != "":
		return IdentityIDText
	default:
		return IdentityID
	}
}

// AppendIdentity appends ev's identity (Identity) to b. It allocates only
// to grow b; any goroutine.
func (ev *Event) AppendIdentity(b []byte) []byte {
	switch ev.Identity() {
	case IdentityMessage:
		return append(b, ev.MessageID...)
	case IdentityEventID:
		return append(b, ev.EventID...)
	case IdentityReplayOf:
		return strconv.AppendInt(b, ev.ReplayOf, 10)
	case IdentityIDText:
		return append(b, ev.IDText...)
	default:
		return strconv.AppendInt(b, ev.ID, 10)
	}
}

// Header is one top-level key of the headers JSON object. A JSON string value
// is unquoted and unescaped (its UTF-8 text). Any other value (number, true,
// false, null, object, array) is given as its compact JSON text, and numbers
// keep their original text ("1.50" stays "1.50").
type Header struct {
	Key   string
	Value []byte
}

// Txn is one committed transaction, or a chunk of one (Partial). The Decoder
// does not touch it again once returned: the caller owns it.
type Txn struct {
	Xid        uint32
	BeginLSN   pglogrepl.LSN // final LSN announced by Begin
	CommitLSN  pglogrepl.LSN
	EndLSN     pglogrepl.LSN // TransactionEndLSN from Commit: the unit to checkpoint
	CommitTime time.Time     // UTC
	Events     []Event       // in log order; empty when the transaction had no outbox rows
	// Partial marks a chunk of a transaction larger than the chunk limits
	// (SetChunk): more events of it follow, EndLSN is zero and CommitLSN is
	// the final LSN announced by Begin (the same value Commit carries). The
	// last chunk comes on Commit with Partial false.
	Partial bool
}

// Counts are running totals since New. Read them with Decoder.Counts, from
// the goroutine that calls Decode.
type Counts struct {
	Txns           uint64 // transactions whole or at their last chunk, with or without events (a refused non-transactional message event counts as one)
	Events         uint64 // events in the returned Txns
	OtherTableRows uint64 // Inserts into tables other than the outbox
	OtherMessages  uint64 // messages ignored: Update, Delete, Truncate, Type, Origin, Message (not a heartbeat), unknown
	Heartbeats     uint64 // the relay's own heartbeat Messages (SetHeartbeatPrefix); not events
	MessageEvents  uint64 // of Events: from Messages with the message-event prefix (SetMessagePrefix)
	StreamedTxns   uint64 // of Txns: streamed before their commit (Stream Commit)
	StreamAborts   uint64 // streamed transactions aborted whole (Stream Abort); nothing of them is handed out
	SpilledTxns    uint64 // streamed transactions whose events went to a temporary file
}

// Decoder holds the state of one replication stream: the relations seen so
// far and the open transaction. It is used by a single goroutine (the
// replication loop's handler) and is not safe for concurrent use. None of its
// methods wait on another goroutine or the network; only Decode, Next and
// Close touch the disk, for streamed transactions (SetSpill).
//
// After Decode returns an error, the position in the stream is lost: stop,
// and resume from the slot with a new Decoder.
type Decoder struct {
	maps     []tableMap // the outbox tables and their mappings
	reserved []string   // header keys reserved besides outboxschema.ReservedHeader
	tbl      *tableMap  // the table of the row being built, for errors

	rels map[uint32]*relation
	// publication names the stream's publication in errors (SetPublication);
	// expect are the columns each outbox table had when it was checked
	// (Expect), by table index, nil entries for none.
	publication string
	expect      []*expectation
	// pos is the highest WALStart seen: the stream decodes the WAL in
	// order, so every later message was decoded at or past it (pgoutput
	// sends Relation messages with WALStart 0).
	pos pglogrepl.LSN

	inTxn  bool
	txn    Txn // the open transaction; Events grows until Commit hands it off
	counts Counts

	// Scratch reused across rows, so that a row allocates only what its
	// Event keeps.
	fields [numRoles]field // the outbox columns of the current row, pointing into walData
	cols   []field         // every column of the current outbox row
	bin    []byte          // a bytea payload of the current row, decoded
	extras []field         // the additional columns of the current row
	vals   bytes.Buffer    // header values of the current row, back to back
	// toTxn: the current row is an Insert of the open transaction (not
	// streamed, not Row): its payload, header values and Headers come
	// from slabs, shared with the transaction's other events.
	toTxn bool
	slabs slabs
	// The AggregateIDs of the events of d.txn built with toTxn, back to
	// back: handout makes them one string, and each event's a part of it.
	ids    []byte
	idFix  []idSpan        // where each of those events' AggregateID sits in ids
	idSpan idSpan          // the current row's, start -1 when none
	hdrs   []hdrSpan       // the keys of the current row and where their values sit in vals
	raw    json.RawMessage // one header value as read
	rd     bytes.Reader

	// aggregate_type and event_type take few distinct values, so they are
	// interned: most rows need no allocation for them.
	intern map[string]interned
	// The strings of the previous row, tried before the intern map:
	// consecutive rows mostly repeat them, and comparing bytes is cheaper
	// than hashing them.
	last struct {
		aggType, eventType string
		keys               [8]lastKey // the headers column's first keys
	}

	// Chunk limits: an open transaction is handed out in pieces once it
	// buffers this many events or payload bytes, so memory stays bounded
	// for transactions of any size. Zero means no limit.
	chunkEvents int
	chunkBytes  int
	buffered    int     // payload bytes in txn.Events
	sizeHint    int     // events of the last transaction handed out: the next one's starting capacity
	spare       []Event // handed back by Recycle (length 0): the next transaction's Events

	// Streaming (stream.go): the open streamed transactions by top-level
	// xid, the one whose block is open, and the committed one being
	// handed out in chunks.
	open     map[uint32]*spool
	cur      *spool
	replay   *replay
	spillDir string
	spillMem int    // in-memory budget of all spools, bytes of records
	memUsed  int    // bytes of records in memory
	rec      []byte // scratch record

	hbPrefix  []byte    // the heartbeat Message prefix; nil: none
	msg       msgState  // message events (envelope.go)
	hb        Heartbeat // decoded by the last Decode call, if hbOK
	hbOK      bool
	streamMsg bool // the last message was Stream Start, Stop, Commit or Abort (StreamMessage)
}

// Interning stops at this many strings, or at strings this long, so that a
// table with many distinct values cannot grow the map without bound.
const (
	maxInterned   = 1024
	maxInternSize = 128
)

// New returns a Decoder for the outbox table named "schema.name", e.g.
// "public.outbox", as parsed by outboxschema.ParseTable (a name without a
// schema means schema public). Names are compared exactly as pgoutput sends
// them: the unquoted, case-sensitive names stored in the catalog. Make one
// Decoder per replication stream (replay makes one for Row); New may be
// called from any goroutine and does not block.
func New(table string) (*Decoder, error) {
	t, err := outboxschema.ParseTable(table)
	if err != nil {
		return nil, fmt.Errorf("outbox table: %w", err)
	}
	return NewMapped([]outboxschema.Mapping{outboxschema.DefaultMapping(t)}, nil)
}

// NewMapped returns a Decoder for one or more outbox tables, each read
// through its column mapping (validated by the caller: Mapping.Validate).
// Event.TableIndex is the index of the row's table in maps. reserved are
// header keys a row's headers column may not use besides
// outboxschema.ReservedHeader's (compared ignoring case), e.g. "id" for the
// debezium record format. Same rules as New.
func NewMapped(maps []outboxschema.Mapping, reserved []string) (*Decoder, error) {
	if len(maps) == 0 {
		return nil, errors.New("outbox table: no table to read")
	}
	d := &Decoder{
		rels:     make(map[uint32]*relation),
		intern:   make(map[string]interned),
		reserved: reserved,
	}
	for _, m := range maps {
		if m.ID == "" || m.Key == "" || m.Payload == "" {
			return nil, fmt.Errorf("outbox table %s: the mapping needs the id, key and payload columns", m.Table)
		}
		d.maps = append(d.maps, newTableMap(m))
	}
	d.tbl = &d.maps[0]
	return d, nil
}

// Decode consumes the walData of one XLogData message. It returns a non-nil
// *Txn on Commit, including for transactions with no outbox rows (the
// caller needs them to keep the checkpoint order); on an Insert or a
// message event that brings the open transaction to a chunk limit (a
// Partial chunk, SetChunk); on Stream Commit (the first chunk: call Next
// for the others); and for a non-transactional Message with the
// message-event prefix (a transaction of its own holding the refused
// event). Otherwise nil. walStart is the XLogData's WALStart; it becomes
// Event.LSN and appears in errors.
//
// walData is not retained: the caller may reuse its buffer once Decode
// returns. An outbox row that cannot become an event is not an error: it
// comes out as an Event with Err set, in its place in the transaction.
// Errors wrap ErrProtocol (malformed or out-of-order messages) or ErrSpill
// (the temporary file of a streamed transaction); the stream cannot
// continue after one (see Decoder).
//
// Decode is called from the replication loop's goroutine only. It waits on
// nothing but, for a streamed transaction past its memory budget, the
// disk.
func (d *Decoder) Decode(walStart pglogrepl.LSN, walData []byte) (*Txn, error) {
	if len(walData) == 0 {
		return nil, protocolError(walStart, "message", "empty walData")
	}
	body := walData[1:]
	d.hbOK, d.streamMsg = false, false
	d.pos = max(d.pos, walStart)
	if d.replay != nil {
		return nil, protocolError(walStart, "message", "the chunks of streamed transaction %d were not all taken (Next)", d.replay.txn.Xid)
	}
	// Inside a stream block, changes carry their (sub)transaction's xid.
	var xid uint32
	if d.cur != nil {
		switch walData[0] {
		case 'R', 'Y', 'I', 'U', 'D', 'T', 'M':
			if len(body) < 4 {
				return nil, protocolError(walStart, "streamed message", "truncated: %d bytes, no xid", len(body))
			}
			c := cursor{b: body}
			xid = c.u32()
			body = body[4:]
		}
	}
	switch walData[0] {
	case 'B':
		if d.cur != nil {
			return nil, protocolError(walStart, "Begin", "the stream block of transaction %d is open", d.cur.xid)
		}
		return nil, d.begin(walStart, body)
	case 'C':
		return d.commit(walStart, body)
	case 'R':
		return nil, d.relation(walStart, body)
	case 'I':
		if d.cur != nil {
			return nil, d.streamedInsert(walStart, xid, body)
		}
		if err := d.insert(walStart, body); err != nil {
			return nil, err
		}
		return d.maybeChunk(), nil
	case 'M':
		if d.cur != nil {
			// Transactional: never a heartbeat; maybe a message event.
			if _, ok, err := d.messageEvent(walStart, xid, body); ok {
				return nil, err
			}
			d.counts.OtherMessages++
			return nil, nil
		}
		return d.message(walStart, body)
	case 'S':
		d.streamMsg = true
		return nil, d.streamStart(walStart, body)
	case 'E':
		d.streamMsg = true
		return nil, d.streamStop(walStart, body)
	case 'c':
		d.streamMsg = true
		return d.streamCommit(walStart, body)
	case 'A':
		d.streamMsg = true
		return nil, d.streamAbort(walStart, body)
	default:
		// Update, Delete, Truncate, Type, Origin, and anything newer:
		// none of them can create an outbox event.
		d.counts.OtherMessages++
		return nil, nil
	}
}

// SetChunk sets the chunk limits (see Txn.Partial); zero disables one. Call
// before the first Decode.
func (d *Decoder) SetChunk(events, bytes int) {
	d.chunkEvents, d.chunkBytes = events, bytes
}

// maybeChunk hands out the open transaction's events when a chunk limit is
// reached. pgoutput v1 sends a transaction only after it committed, so its
// events may be published before Commit arrives; only the checkpoint must
// wait for the end LSN.
func (d *Decoder) maybeChunk() *Txn {
	n := len(d.txn.Events)
	if n == 0 || (d.chunkEvents == 0 || n < d.chunkEvents) && (d.chunkBytes == 0 || d.buffered < d.chunkBytes) {
		return nil
	}
	part := d.txn
	part.CommitLSN = part.BeginLSN
	part.Partial = true
	d.handout(part.Events)
	d.txn.Events = nil
	d.hint(n)
	d.buffered = 0
	d.counts.Events += uint64(n)
	return &part
}

// InTxn reports whether the Decoder is between a Begin and its Commit. The
// replication loop's goroutine calls it before confirming an idle keepalive
// position: that is only safe between transactions. It does not block.
//
// Between stream blocks it is false although streamed transactions may be
// open: the server resends in full every transaction that commits after the
// confirmed position, as PostgreSQL's own subscriber relies on.
func (d *Decoder) InTxn() bool { return d.inTxn || d.cur != nil || d.replay != nil }

// StreamMessage reports whether the message the last Decode took was a
// streaming one (Stream Start, Stop, Commit or Abort): the streamed
// transactions' Counts and Spilled may have changed. The loop's goroutine.
func (d *Decoder) StreamMessage() bool { return d.streamMsg }

// Counts returns the running totals. Call it from the goroutine that calls
// Decode (e.g. to update metrics after each message); it does not block.
func (d *Decoder) Counts() Counts { return d.counts }

// begin handles Begin: Int64 final LSN, Int64 commit time, Int32 xid.
func (d *Decoder) begin(lsn pglogrepl.LSN, b []byte) error {
	if len(b) != 20 {
		return protocolError(lsn, "Begin", "%d bytes, want 20", len(b))
	}
	if d.inTxn {
		return protocolError(lsn, "Begin", "transaction %d is still open", d.txn.Xid)
	}
	c := cursor{b: b}
	d.ids, d.idFix = d.ids[:0], d.idFix[:0]
	d.txn = Txn{
		BeginLSN:   pglogrepl.LSN(c.u64()),
		CommitTime: pgTime(c.u64()),
		Xid:        c.u32(),
	}
	d.inTxn = true
	return nil
}

// commit handles Commit: Int8 flags, Int64 commit LSN, Int64 end LSN, Int64
// commit time.
func (d *Decoder) commit(lsn pglogrepl.LSN, b []byte) (*Txn, error) {
	if len(b) != 25 {
		return nil, protocolError(lsn, "Commit", "%d bytes, want 25", len(b))
	}
	if !d.inTxn {
		return nil, protocolError(lsn, "Commit", "no transaction is open")
	}
	c := cursor{b: b}
	c.u8() // flags, unused
	txn := d.txn
	txn.CommitLSN = pglogrepl.LSN(c.u64())
	txn.EndLSN = pglogrepl.LSN(c.u64())
	txn.CommitTime = pgTime(c.u64())

	d.handout(txn.Events)
	d.txn = Txn{} // the caller owns txn.Events now
	d.hint(len(txn.Events))
	d.buffered = 0
	d.inTxn = false
	d.counts.Txns++
	d.counts.Events += uint64(len(txn.Events))
	return &txn, nil
}

// pgEpoch is 2000-01-01 in Unix microseconds: Postgres timestamps count from
// there.
const pgEpoch = 946_684_800_000_000

func pgTime(us uint64) time.Time {
	return time.UnixMicro(int64(us) + pgEpoch).UTC()
}

// field is one outbox column of the row being decoded: its tuple data kind
// ('n', 'u', 't', 'b', or 0 when the table has no such column) and its bytes,
// which alias walData until Decode returns.
type field struct {
	kind byte
	data []byte
}

// insert handles Insert: Int32 relation id, Byte1('N'), TupleData.
func (d *Decoder) insert(lsn pglogrepl.LSN, b []byte) error {
	if !d.inTxn {
		return protocolError(lsn, "Insert", "no transaction is open")
	}
	d.toTxn, d.idSpan = true, idSpan{start: -1}
	ev, ok, err := d.row(lsn, b)
	d.toTxn = false
	if err != nil || !ok {
		return err
	}
	d.addEvent(ev)
	return nil
}

// addEvent appends ev, built with toTxn (d.idSpan set), to the open
// transaction.
func (d *Decoder) addEvent(ev Event) {
	if d.idSpan.start >= 0 {
		d.idSpan.ev = len(d.txn.Events)
		d.idFix = append(d.idFix, d.idSpan)
	}
	if d.txn.Events == nil {
		switch {
		case cap(d.spare) >= d.sizeHint:
			d.txn.Events, d.spare = d.spare, nil
		case d.sizeHint > 1:
			// Sized like the last transaction: appending one by one grew
			// (and copied) the slice about ten times for 100 events.
			d.txn.Events = make([]Event, 0, d.sizeHint)
		}
	}
	d.txn.Events = append(d.txn.Events, ev)
	d.buffered += len(ev.Payload)
}

// idSpan is where the AggregateID of event ev of d.txn sits in d.ids
// (start:end), its EventID (end:evEnd, empty for none) and a message
// event's MessageID (evEnd:msgEnd, empty for none).
type idSpan struct{ ev, start, end, evEnd, msgEnd int }

// handout sets the AggregateIDs of evs, the events of d.txn being handed
// out, from d.ids: one allocation for all of them instead of one each.
func (d *Decoder) handout(evs []Event) {
	if len(d.idFix) > 0 {
		all := string(d.ids)
		for _, f := range d.idFix {
			evs[f.ev].AggregateID = all[f.start:f.end]
			if f.evEnd > f.end {
				evs[f.ev].EventID = all[f.end:f.evEnd]
			}
			if f.msgEnd > f.evEnd {
				evs[f.ev].MessageID = all[f.evEnd:f.msgEnd]
			}
		}
	}
	d.ids, d.idFix = d.ids[:0], d.idFix[:0]
	if cap(d.ids) > maxIDScratch { // one huge transaction's keys are not kept for ever
		d.ids = nil
	}
}

// maxIDScratch bounds the scratch capacity kept for AggregateIDs.
const maxIDScratch = 1 << 20

// Recycle hands back the Events of a Txn the caller is done with, so that
// the next transaction's events are built in it instead of a new slice (in
// a drain of 100-row transactions that was 20 KB per transaction). After
// it, neither evs nor a pointer into it may be used: only the slice is
// reused, not what its events refer to (payloads, headers), which stay
// valid. Call it from the goroutine that calls Decode; optional.
func (d *Decoder) Recycle(evs []Event) {
	if cap(evs) == 0 || cap(evs) > maxSizeHint || cap(evs) <= cap(d.spare) {
		return
	}
	clear(evs) // what the events referred to is not kept alive by the spare
	d.spare = evs[:0]
}

// maxSizeHint bounds the capacity an Events slice starts with.
const maxSizeHint = 1024

// hint records the size of a transaction (or chunk) just handed out as the
// capacity of the next one's Events; one without events (another table's,
// a heartbeat's) leaves it.
func (d *Decoder) hint(n int) {
	if n == 0 {
		return
	}
	if d.chunkEvents > 0 {
		n = min(n, d.chunkEvents)
	}
	d.sizeHint = min(n, maxSizeHint)
}

// streamedInsert handles an Insert inside a stream block, made by
// (sub)transaction xid: its event goes to the block's spool.
func (d *Decoder) streamedInsert(lsn pglogrepl.LSN, xid uint32, b []byte) error {
	ev, ok, err := d.row(lsn, b)
	if err != nil || !ok {
		return err
	}
	return d.spoolEvent(lsn, xid, &ev)
}

// row parses an Insert's body; ok is false for another table's row.
func (d *Decoder) row(lsn pglogrepl.LSN, b []byte) (ev Event, ok bool, err error) {
	c := cursor{b: b}
	relID := c.u32()
	marker := c.u8()
	n := int(c.u16())
	if c.short {
		return Event{}, false, protocolError(lsn, "Insert", "truncated header")
	}
	if marker != 'N' {
		return Event{}, false, protocolError(lsn, "Insert", "tuple marker %q, want 'N'", marker)
	}
	rel := d.rels[relID]
	if rel == nil {
		return Event{}, false, protocolError(lsn, "Insert", "relation id %d is unknown: its Relation message was never seen", relID)
	}
	if n != rel.ncols {
		return Event{}, false, protocolError(lsn, "Insert", "%d columns, but relation %s has %d", n, rel.table, rel.ncols)
	}

	// Other tables' rows are walked too, so that a malformed one is caught.
	outbox := rel.outbox >= 0
	direct := outbox && rel.direct != nil
	if direct {
		d.fields = [numRoles]field{}
	}
	for i := 0; i < n; i++ {
		kind := c.u8()
		var data []byte
		switch kind {
		case 'n', 'u':
		case 't', 'b':
			data = c.next(c.u32())
		default:
			if !c.short {
				return Event{}, false, protocolError(lsn, "Insert", "column %d of %s: tuple data kind %q", i, rel.table, kind)
			}
		}
		if c.short {
			return Event{}, false, protocolError(lsn, "Insert", "truncated in column %d of %s", i, rel.table)
		}
		switch {
		case direct:
			if r := rel.direct[i]; r != roleNone {
				d.fields[r] = field{kind: kind, data: data}
			}
		case outbox:
			d.cols[i] = field{kind: kind, data: data}
		}
	}
	if c.off != len(b) {
		return Event{}, false, protocolError(lsn, "Insert", "%d bytes after the tuple", len(b)-c.off)
	}

	if !outbox {
		d.counts.OtherTableRows++
		return Event{}, false, nil
	}
	d.extras = d.extras[:0]
	if !direct {
		for r, i := range rel.idx {
			if i >= 0 {
				d.fields[r] = d.cols[i]
			} else {
				d.fields[r] = field{}
			}
		}
		for _, i := range rel.extra {
			if i >= 0 {
				d.extras = append(d.extras, d.cols[i])
			} else {
				d.extras = append(d.extras, field{})
			}
		}
	}
	ev, rowErr := d.event(rel, lsn)
	if rowErr != nil {
		ev = d.poison(ev, rowErr)
	}
	return ev, true, nil
}

// poison returns the Event of a row that cannot become one: Err, ID and LSN,
// and every other required column that arrived as text, copied, so that a
// dead letter carries as much of the row as there is.
func (d *Decoder) poison(ev Event, err *RowError) Event {
	ev.Err = err
	ev.ID = err.ID
	ev.IDText = err.IDText
	if f := d.fields[roleEventID]; f.kind == 't' && len(f.data) == uuidLen && ev.EventID == "" {
		ev.EventID = string(f.data) // its dead letter names it by its identity
	}
	if f := d.fields[roleAggregateType]; f.kind == 't' {
		ev.AggregateType = d.str(f.data)
	}
	if f := d.fields[roleAggregateID]; f.kind == 't' {
		ev.AggregateID = string(f.data)
	}
	if f := d.fields[roleEventType]; f.kind == 't' {
		ev.EventType = d.str(f.data)
	}
	if f := d.fields[rolePayload]; f.kind == 't' {
		ev.Payload = append([]byte(nil), f.data...)
	}
	return ev
}

// event builds an Event from d.fields and d.extras, copying every byte it
// keeps. rel.outbox indexes d.maps (Row passes the default mapping's).
func (d *Decoder) event(rel *relation, lsn pglogrepl.LSN) (Event, *RowError) {
	tm := &d.maps[max(rel.outbox, 0)]
	d.tbl = tm
	ev := Event{LSN: lsn, Schema: tm.schema, Table: tm.name, TableIndex: max(rel.outbox, 0)}

	// Parse the id first, so that every later error can name the row.
	if rel.missing != "" {
		// The id column itself may be the missing one; if not, name the row.
		if f := d.fields[roleID]; f.kind == 't' {
			if rel.idInt {
				ev.ID, _ = strconv.ParseInt(string(f.data), 10, 64)
			} else {
				ev.IDText = string(f.data)
			}
		}
		return ev, &RowError{
			Table:  tm.full,
			ID:     ev.ID,
			IDText: ev.IDText,
			LSN:    lsn,
			Column: rel.missing,
			Reason: "is missing from the table (" + rel.missingKey + ")",
			hint:   hintMissing,
		}
	}
	text, why := d.text(roleID)
	if why != nil {
		return ev, d.rowError(ev, roleID, why)
	}
	if rel.idInt {
		id, err := strconv.ParseInt(string(text), 10, 64)
		if err != nil {
			return ev, d.rowError(ev, roleID, &reason{fmt.Sprintf("%q is not a 64-bit integer", text), hintProducer})
		}
		ev.ID = id
	} else {
		if len(text) == 0 {
			return ev, d.rowError(ev, roleID, &reason{"is empty", hintProducer})
		}
		ev.IDText = string(text)
	}
	// The identity columns: NULL (or absent) is the common case of a
	// dlq_replay_of, and of event_id for rows older than migration 0006.
	var eventID []byte
	switch f := d.fields[roleEventID]; f.kind {
	case 0, 'n':
	case 't':
		if len(f.data) != uuidLen {
			return ev, d.rowError(ev, roleEventID, &reason{fmt.Sprintf("%q is not a UUID's text", f.data), hintProducer})
		}
		eventID = f.data
	default:
		_, why := fieldText(f)
		return ev, d.rowError(ev, roleEventID, why)
	}
	switch f := d.fields[roleReplayOf]; f.kind {
	case 0, 'n':
	case 't':
		v, err := strconv.ParseInt(string(f.data), 10, 64)
		if err != nil || v <= 0 {
			return ev, d.rowError(ev, roleReplayOf, &reason{fmt.Sprintf("%q is not a row id", f.data), hintProducer})
		}
		ev.ReplayOf = v
	default:
		_, why := fieldText(f)
		return ev, d.rowError(ev, roleReplayOf, why)
	}

	var aggType, eventType []byte
	if rel.idx[roleAggregateType] >= 0 {
		if aggType, why = d.text(roleAggregateType); why != nil {
			return ev, d.rowError(ev, roleAggregateType, why)
		}
	}
	aggID, why := d.text(roleAggregateID)
	if why != nil {
		return ev, d.rowError(ev, roleAggregateID, why)
	}
	if len(aggID) == 0 {
		// It is the Kafka key: an empty key loses per-aggregate ordering.
		return ev, d.rowError(ev, roleAggregateID, &reason{"is empty", hintProducer})
	}
	if rel.idx[roleEventType] >= 0 {
		if eventType, why = d.text(roleEventType); why != nil {
			return ev, d.rowError(ev, roleEventType, why)
		}
	}
	payload, why := d.text(rolePayload)
	null := false
	switch {
	case why == nil && rel.payloadBytea:
		if payload, why = d.unhex(payload); why != nil {
			return ev, d.rowError(ev, rolePayload, why)
		}
	case why != nil && d.fields[rolePayload].kind == 'n' && tm.m.TombstoneOnNull:
		null = true
	case why != nil:
		return ev, d.rowError(ev, rolePayload, why)
	}

	hasHeaders := false
	switch f := d.fields[roleHeaders]; f.kind {
	case 0, 'n': // no headers column, or SQL NULL
		d.hdrs = d.hdrs[:0]
		d.vals.Reset()
	case 't':
		if r := d.parseHeaders(f.data); r != nil {
			return ev, d.rowError(ev, roleHeaders, r)
		}
		for _, h := range d.hdrs {
			if h.refused {
				return ev, d.headerNameError(ev, h.key)
			}
		}
		hasHeaders = true
	default:
		_, why := d.text(roleHeaders)
		return ev, d.rowError(ev, roleHeaders, why)
	}
	// The additional columns' values follow the headers' in d.vals.
	nh := len(d.hdrs)
	for i, f := range d.extras {
		switch f.kind {
		case 't':
			start := d.vals.Len()
			d.vals.Write(f.data)
			d.hdrs = append(d.hdrs, hdrSpan{key: tm.m.Additional[i].Header, start: start, end: d.vals.Len()})
		case 'n':
			d.hdrs = append(d.hdrs, hdrSpan{key: tm.m.Additional[i].Header, start: -1})
		default:
			_, why := fieldText(f)
			e := d.rowError(ev, roleNone, why)
			e.Column = tm.m.Additional[i].Column
			return ev, e
		}
	}

	ev.AggregateType = d.strLast(aggType, &d.last.aggType)
	if d.toTxn {
		// Set at handout, from one string for the whole transaction,
		// and so is the event_id: no allocation of their own.
		start := len(d.ids)
		d.ids = append(d.ids, aggID...)
		d.ids = append(d.ids, eventID...)
		d.idSpan = idSpan{start: start, end: start + len(aggID), evEnd: len(d.ids)}
	} else {
		ev.AggregateID = string(aggID)
		if eventID != nil {
			ev.EventID = string(eventID)
		}
	}
	ev.EventType = d.strLast(eventType, &d.last.eventType)

	// One piece for the payload and all header values: an allocation of
	// its own, or from the blocks of the transaction's events (slabs).
	vals := d.vals.Bytes()
	var buf []byte
	if d.toTxn {
		buf = d.slabs.take(len(payload) + len(vals))
	} else {
		buf = make([]byte, len(payload)+len(vals))
	}
	p := copy(buf, payload)
	copy(buf[p:], vals)
	if !null {
		ev.Payload = buf[:p:p]
	}
	if hasHeaders || len(d.extras) > 0 {
		if d.toTxn {
			ev.Headers = d.slabs.headers(len(d.hdrs))
		} else {
			ev.Headers = make([]Header, len(d.hdrs))
		}
		for i, h := range d.hdrs {
			ev.Headers[i].Key = h.key
			if h.start >= 0 {
				ev.Headers[i].Value = buf[p+h.start : p+h.end : p+h.end]
			}
		}
		if !hasHeaders {
			ev.Headers = ev.Headers[nh:]
		}
	}
	return ev, nil
}

// unhex decodes bytea's text output (hex format, \\x...) into the scratch
// buffer d.bin (walData is the caller's and is not written to).
func (d *Decoder) unhex(b []byte) ([]byte, *reason) {
	if len(b) < 2 || b[0] != '\\' || b[1] != 'x' {
		return nil, &reason{"is bytea in escape format, not hex", "SET bytea_output = 'hex' (the default) on the server"}
	}
	var err error
	if d.bin, err = hex.AppendDecode(d.bin[:0], b[2:]); err != nil {
		return nil, &reason{"is not valid bytea hex text: " + err.Error(), hintProducer}
	}
	return d.bin, nil
}

// text returns the text bytes of a required outbox column, or why there are
// none.
func (d *Decoder) text(r role) ([]byte, *reason) { return fieldText(d.fields[r]) }

func fieldText(f field) ([]byte, *reason) {
	switch f.kind {
	case 't':
		return f.data, nil
	case 'n':
		return nil, &reason{"is NULL", hintProducer}
	case 'u':
		return nil, &reason{"is an unchanged TOAST value, which an Insert never carries", hintToast}
	case 'b':
		return nil, &reason{"is in binary format, which is not supported", hintBinary}
	default: // unreachable: the relation has the column, so the tuple set it
		return nil, &reason{"was not sent", hintProducer}
	}
}

// str returns b as a string, interned while the intern map has room.
func (d *Decoder) str(b []byte) string {
	if e, ok := d.intern[string(b)]; ok { // no allocation for the lookup
		return e.s
	}
	s := string(b)
	if len(d.intern) < maxInterned && len(s) <= maxInternSize {
		d.intern[s] = interned{s: s}
	}
	return s
}

// strLast is str, trying *last first, and keeps the result in *last.
func (d *Decoder) strLast(b []byte, last *string) string {
	if *last == string(b) { // no allocation for the comparison
		return *last
	}
	s := d.str(b)
	*last = s
	return s
}

// lastKey is a headers column key of the previous row and its verdict.
type lastKey struct {
	s       string
	refused bool
	ok      bool
}

// interned is a value of the intern map: the string, and whether the
// header-name rule refuses it (refusedKey) once it was used as a key.
type interned struct {
	s   string
	key keyCheck
}

type keyCheck uint8

const (
	keyUnchecked keyCheck = iota
	keyFree
	keyRefused
)

// headerKey is str for a key of the headers column, and reports whether
// the header-name rule refuses it (refusedKey), with the verdict kept in
// the intern map: the few distinct keys are judged once, not once per row.
func (d *Decoder) headerKey(b []byte) (key string, refused bool) {
	e, ok := d.intern[string(b)]
	if ok && e.key != keyUnchecked {
		return e.s, e.key == keyRefused
	}
	if !ok {
		e.s = string(b)
	}
	e.key = keyFree
	if d.refusedKey(e.s) {
		e.key = keyRefused
	}
	if ok || len(d.intern) < maxInterned && len(e.s) <= maxInternSize {
		d.intern[e.s] = e
	}
	return e.s, e.key == keyRefused
}

func (d *Decoder) rowError(ev Event, r role, why *reason) *RowError {
	e := &RowError{
		Table:  d.tbl.full,
		ID:     ev.ID,
		IDText: ev.IDText,
		LSN:    ev.LSN,
		Reason: why.text,
		hint:   why.hint,
	}
	if r >= 0 {
		e.Column = d.tbl.cols[r]
	}
	return e
}

// refusedKey reports whether the header-name rule refuses a key of the
// headers column or of a message's headers: the one rule outbox.Write and
// check apply too (outboxschema.CheckHeaderName), with the Decoder's extra
// reserved keys.
func (d *Decoder) refusedKey(k string) bool {
	return outboxschema.CheckHeaderName(k, d.reserved...) != nil
}

// headerNameError is the RowError of a row whose headers column holds key,
// a name the rule refuses: a reserved one (ReservedHeader set: the relay's
// own header would be followed by the row's forged one), or a bad one.
func (d *Decoder) headerNameError(ev Event, key string) *RowError {
	r, reserved := headerNameReason(key, d.reserved, hintReserved, hintBadName)
	e := d.rowError(ev, roleHeaders, r)
	if reserved {
		e.ReservedHeader = key
	}
	return e
}

// headerNameReason says why the rule refuses key (a refused one), with
// the hint for a reserved or a bad name; reserved tells which.
func headerNameReason(key string, extra []string, hintReserved, hintBad string) (r *reason, reserved bool) {
	var he *outboxschema.HeaderNameError
	if err := outboxschema.CheckHeaderName(key, extra...); !errors.As(err, &he) {
		return &reason{"has the key " + quoteKey(key) + ", which the header-name rule refuses", hintBad}, false // unreachable
	}
	if he.Reserved != "" {
		own := outboxschema.ReservedNames()
		if len(extra) > 0 {
			own += ", " + strings.Join(extra, ", ")
		}
		return &reason{"has the reserved key " + quoteKey(key) + ": the relay sets " + own +
			" and every " + outboxschema.DeadLetterPrefix + "* header itself (keys compared ignoring case)", hintReserved}, true
	}
	return &reason{"has the key " + quoteKey(key) + ", a bad header name: it " + he.Problem, hintBad}, false
}

// quoteKey quotes a header key for an error, cut to 64 bytes: a writer's
// key can be as long as the column.
func quoteKey(k string) string {
	if len(k) <= 64 {
		return strconv.Quote(k)
	}
	return strconv.Quote(strings.ToValidUTF8(k[:64], "")) + "..."
}

// uuidLen is the length of a UUID's text, as PostgreSQL writes it.
const uuidLen = 36

// reason is why a column cannot become part of an event, and what to do.
type reason struct{ text, hint string }
