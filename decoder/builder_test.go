package decoder_test

import (
	"encoding/binary"
	"time"

	"github.com/jackc/pglogrepl"
)

// Builders for pgoutput protocol version 1 messages, byte by byte, after
// pglogrepl's message_test.go. Each returns the walData of one XLogData.

var be = binary.BigEndian

const pgEpochMicros = 946_684_800_000_000

var commitTime = time.Date(2026, 3, 14, 15, 9, 26, 535_897_000, time.UTC)

func pgTime(t time.Time) uint64 { return uint64(t.UnixMicro() - pgEpochMicros) }

func cstr(b []byte, s string) []byte { return append(append(b, s...), 0) }

func begin(final pglogrepl.LSN, xid uint32) []byte {
	b := []byte{'B'}
	b = be.AppendUint64(b, uint64(final))
	b = be.AppendUint64(b, pgTime(commitTime))
	return be.AppendUint32(b, xid)
}

func commit(lsn, end pglogrepl.LSN) []byte {
	b := []byte{'C', 0}
	b = be.AppendUint64(b, uint64(lsn))
	b = be.AppendUint64(b, uint64(end))
	return be.AppendUint64(b, pgTime(commitTime))
}

// relation announces a table whose columns are all text, except id (int8,
// part of the key).
func relation(id uint32, ns, name string, cols ...string) []byte {
	b := []byte{'R'}
	b = be.AppendUint32(b, id)
	b = cstr(b, ns)
	b = cstr(b, name)
	b = append(b, 'd') // replica identity default
	b = be.AppendUint16(b, uint16(len(cols)))
	for _, c := range cols {
		flags, oid := byte(0), uint32(25) // text
		if c == "id" {
			flags, oid = 1, 20 // int8, key
		}
		b = append(b, flags)
		b = cstr(b, c)
		b = be.AppendUint32(b, oid)
		b = be.AppendUint32(b, 0xFFFFFFFF) // typmod -1
	}
	return b
}

// tv is one column of TupleData.
type tv struct {
	kind byte
	data string
}

func text(s string) tv { return tv{'t', s} }
func bin(s string) tv  { return tv{'b', s} }

var (
	null  = tv{kind: 'n'}
	toast = tv{kind: 'u'}
)

func tuple(b []byte, cols []tv) []byte {
	b = be.AppendUint16(b, uint16(len(cols)))
	for _, c := range cols {
		b = append(b, c.kind)
		if c.kind == 't' || c.kind == 'b' {
			b = be.AppendUint32(b, uint32(len(c.data)))
			b = append(b, c.data...)
		}
	}
	return b
}

func insert(relid uint32, cols ...tv) []byte {
	b := []byte{'I'}
	b = be.AppendUint32(b, relid)
	b = append(b, 'N')
	return tuple(b, cols)
}

func update(relid uint32, cols ...tv) []byte {
	b := []byte{'U'}
	b = be.AppendUint32(b, relid)
	b = append(b, 'N')
	return tuple(b, cols)
}

func del(relid uint32, key ...tv) []byte {
	b := []byte{'D'}
	b = be.AppendUint32(b, relid)
	b = append(b, 'K')
	return tuple(b, key)
}

func truncate(relids ...uint32) []byte {
	b := []byte{'T'}
	b = be.AppendUint32(b, uint32(len(relids)))
	b = append(b, 0) // options
	for _, id := range relids {
		b = be.AppendUint32(b, id)
	}
	return b
}

func origin(lsn pglogrepl.LSN, name string) []byte {
	b := []byte{'O'}
	b = be.AppendUint64(b, uint64(lsn))
	return cstr(b, name)
}

func typ(oid uint32, ns, name string) []byte {
	b := []byte{'Y'}
	b = be.AppendUint32(b, oid)
	b = cstr(b, ns)
	return cstr(b, name)
}

func message(transactional bool, lsn pglogrepl.LSN, prefix, content string) []byte {
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
	outboxID = 16385
	ordersID = 16390
)

var outboxCols = []string{"id", "aggregate_type", "aggregate_id", "event_type", "payload", "headers"}

func outboxRelation() []byte { return relation(outboxID, "public", "outbox", outboxCols...) }

// row is an outbox row in outboxCols order.
func row(id, aggType, aggID, eventType, payload string, headers tv) []tv {
	return []tv{text(id), text(aggType), text(aggID), text(eventType), text(payload), headers}
}
