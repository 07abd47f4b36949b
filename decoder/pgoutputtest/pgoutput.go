// Package pgoutputtest builds pgoutput protocol version 1 messages byte by
// byte, after pglogrepl's message_test.go, for tests of the decoder and of
// what consumes it. Each function returns the walData of one XLogData.
package pgoutputtest

import (
	"encoding/binary"
	"time"

	"github.com/jackc/pglogrepl"
)

var be = binary.BigEndian

const pgEpochMicros = 946_684_800_000_000

var CommitTime = time.Date(2026, 3, 14, 15, 9, 26, 535_897_000, time.UTC)

func pgTime(t time.Time) uint64 { return uint64(t.UnixMicro() - pgEpochMicros) }

func cstr(b []byte, s string) []byte { return append(append(b, s...), 0) }

func Begin(final pglogrepl.LSN, xid uint32) []byte {
	b := []byte{'B'}
	b = be.AppendUint64(b, uint64(final))
	b = be.AppendUint64(b, pgTime(CommitTime))
	return be.AppendUint32(b, xid)
}

func Commit(lsn, end pglogrepl.LSN) []byte {
	b := []byte{'C', 0}
	b = be.AppendUint64(b, uint64(lsn))
	b = be.AppendUint64(b, uint64(end))
	return be.AppendUint64(b, pgTime(CommitTime))
}

// relation announces a table whose columns are all text, except id (int8,
// part of the key) and the identity columns of migration 0006: event_id
// (uuid) and dlq_replay_of (int8).
func Relation(id uint32, ns, name string, cols ...string) []byte {
	b := []byte{'R'}
	b = be.AppendUint32(b, id)
	b = cstr(b, ns)
	b = cstr(b, name)
	b = append(b, 'd') // replica identity default
	b = be.AppendUint16(b, uint16(len(cols)))
	for _, c := range cols {
		flags, oid := byte(0), uint32(25) // text
		switch c {
		case "id":
			flags, oid = 1, 20 // int8, key
		case "event_id":
			oid = OIDUUID
		case "dlq_replay_of":
			oid = OIDInt8
		}
		b = append(b, flags)
		b = cstr(b, c)
		b = be.AppendUint32(b, oid)
		b = be.AppendUint32(b, 0xFFFFFFFF) // typmod -1
	}
	return b
}

// Col is one column of TupleData.
type Col struct {
	Kind byte   // 't' text, 'b' binary, 'n' NULL, 'u' unchanged TOAST
	Data string // of 't' and 'b'
}

func Text(s string) Col { return Col{'t', s} }
func Bin(s string) Col  { return Col{'b', s} }

var (
	Null  = Col{Kind: 'n'}
	Toast = Col{Kind: 'u'}
)

func tuple(b []byte, cols []Col) []byte {
	b = be.AppendUint16(b, uint16(len(cols)))
	for _, c := range cols {
		b = append(b, c.Kind)
		if c.Kind == 't' || c.Kind == 'b' {
			b = be.AppendUint32(b, uint32(len(c.Data)))
			b = append(b, c.Data...)
		}
	}
	return b
}

func Insert(relid uint32, cols ...Col) []byte {
	b := []byte{'I'}
	b = be.AppendUint32(b, relid)
	b = append(b, 'N')
	return tuple(b, cols)
}

func Update(relid uint32, cols ...Col) []byte {
	b := []byte{'U'}
	b = be.AppendUint32(b, relid)
	b = append(b, 'N')
	return tuple(b, cols)
}

func Delete(relid uint32, key ...Col) []byte {
	b := []byte{'D'}
	b = be.AppendUint32(b, relid)
	b = append(b, 'K')
	return tuple(b, key)
}

func Truncate(relids ...uint32) []byte {
	b := []byte{'T'}
	b = be.AppendUint32(b, uint32(len(relids)))
	b = append(b, 0) // options
	for _, id := range relids {
		b = be.AppendUint32(b, id)
	}
	return b
}

func Origin(lsn pglogrepl.LSN, name string) []byte {
	b := []byte{'O'}
	b = be.AppendUint64(b, uint64(lsn))
	return cstr(b, name)
}

func Type(oid uint32, ns, name string) []byte {
	b := []byte{'Y'}
	b = be.AppendUint32(b, oid)
	b = cstr(b, ns)
	return cstr(b, name)
}

func Message(transactional bool, lsn pglogrepl.LSN, prefix, content string) []byte {
	b := []byte{'M', 0}
	if transactional {
		b[1] = 1
	}
	b = be.AppendUint64(b, uint64(lsn))
	b = cstr(b, prefix)
	b = be.AppendUint32(b, uint32(len(content)))
	return append(b, content...)
}

// The usual outbox table and a row of it.

const (
	OutboxID = 16385
	OrdersID = 16390
)

var OutboxCols = []string{"id", "aggregate_type", "aggregate_id", "event_type", "payload", "headers"}

func OutboxRelation() []byte { return Relation(OutboxID, "public", "outbox", OutboxCols...) }

// row is an outbox row in outboxCols order.
func Row(id, aggType, aggID, eventType, payload string, headers Col) []Col {
	return []Col{Text(id), Text(aggType), Text(aggID), Text(eventType), Text(payload), headers}
}

// IdentityCols are the outbox columns after migration 0006, which adds
// event_id and dlq_replay_of.
var IdentityCols = append(append([]string(nil), OutboxCols...), "event_id", "dlq_replay_of")

// IdentityRelation announces the outbox table with IdentityCols.
func IdentityRelation() []byte { return Relation(OutboxID, "public", "outbox", IdentityCols...) }

// IdentityRow is an outbox row in IdentityCols order.
func IdentityRow(id, aggType, aggID, eventType, payload string, headers, eventID, replayOf Col) []Col {
	return append(Row(id, aggType, aggID, eventType, payload, headers), eventID, replayOf)
}

// Protocol version 2 streaming (PostgreSQL 14+, streaming 'on'): an
// in-progress transaction comes in blocks between StreamStart and
// StreamStop, every change inside carrying its (sub)transaction's xid
// (Streamed), and ends with StreamCommit or StreamAbort.

// StreamStart opens a block of the top-level transaction xid; first marks
// its first block.
func StreamStart(xid uint32, first bool) []byte {
	b := be.AppendUint32([]byte{'S'}, xid)
	if first {
		return append(b, 1)
	}
	return append(b, 0)
}

// StreamStop closes the current block.
func StreamStop() []byte { return []byte{'E'} }

// StreamCommit commits the streamed transaction xid.
func StreamCommit(xid uint32, lsn, end pglogrepl.LSN) []byte {
	b := be.AppendUint32([]byte{'c'}, xid)
	b = append(b, 0) // flags
	b = be.AppendUint64(b, uint64(lsn))
	b = be.AppendUint64(b, uint64(end))
	return be.AppendUint64(b, pgTime(CommitTime))
}

// StreamAbort aborts subxid of the streamed transaction xid; subxid == xid
// aborts all of it.
func StreamAbort(xid, subxid uint32) []byte {
	b := be.AppendUint32([]byte{'A'}, xid)
	return be.AppendUint32(b, subxid)
}

// Streamed returns msg (a Relation, Insert, Update, Delete, Truncate, Type
// or Message built above) as sent inside a stream block: the xid of the
// (sub)transaction that made the change follows the message type.
func Streamed(xid uint32, msg []byte) []byte {
	b := append([]byte{msg[0]}, be.AppendUint32(nil, xid)...)
	return append(b, msg[1:]...)
}

// TypedCol is a column of RelationTyped: its name and type oid.
type TypedCol struct {
	Name string
	OID  uint32
}

// Type oids for RelationTyped.
const (
	OIDBytea = 17
	OIDInt8  = 20
	OIDInt4  = 23
	OIDText  = 25
	OIDJSON  = 114
	OIDUUID  = 2950
	OIDJSONB = 3802
)

// RelationTyped announces a table whose columns have the given types.
func RelationTyped(id uint32, ns, name string, cols ...TypedCol) []byte {
	b := []byte{'R'}
	b = be.AppendUint32(b, id)
	b = cstr(b, ns)
	b = cstr(b, name)
	b = append(b, 'd')
	b = be.AppendUint16(b, uint16(len(cols)))
	for _, c := range cols {
		b = append(b, 0)
		b = cstr(b, c.Name)
		b = be.AppendUint32(b, c.OID)
		b = be.AppendUint32(b, 0xFFFFFFFF)
	}
	return b
}
