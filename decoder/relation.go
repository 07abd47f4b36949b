package decoder

import (
	"bytes"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/outboxschema"
)

// role is the outbox field a mapped column feeds.
type role int8

const (
	roleNone role = iota - 1
	roleID
	roleAggregateType // the routing column (columns.route_by)
	roleAggregateID   // the key column (columns.key)
	roleEventType
	rolePayload
	roleHeaders // optional
	// The identity columns (outboxschema.Mapping.EventID, ReplayOf):
	// optional, read only when of their type (uuid, bigint).
	roleEventID
	roleReplayOf
	numRoles
)

// roleKeys are the config keys of the roles, for errors about a mapping.
var roleKeys = [numRoles]string{
	roleID:            outboxschema.KeyColumnsID,
	roleAggregateType: outboxschema.KeyColumnsRouteBy,
	roleAggregateID:   outboxschema.KeyColumnsKey,
	roleEventType:     outboxschema.KeyColumnsType,
	rolePayload:       outboxschema.KeyColumnsPayload,
	roleHeaders:       outboxschema.KeyColumnsHeaders,
}

// tableMap is one configured outbox table and its column mapping.
type tableMap struct {
	m            outboxschema.Mapping
	cols         [numRoles]string // the mapped column of each role, "" for none
	schema, name string
	full         string // schema.name
}

func newTableMap(m outboxschema.Mapping) tableMap {
	t := tableMap{m: m, schema: m.Table.Schema, name: m.Table.Name, full: m.Table.String()}
	t.cols = [numRoles]string{
		roleID:            m.ID,
		roleAggregateType: m.RouteBy,
		roleAggregateID:   m.Key,
		roleEventType:     m.Type,
		rolePayload:       m.Payload,
		roleHeaders:       m.Headers,
		roleEventID:       m.EventID,
		roleReplayOf:      m.ReplayOf,
	}
	return t
}

// Type oids whose text the decoder reads differently.
const (
	oidBytea = 17
	oidInt8  = 20
	oidInt2  = 21
	oidInt4  = 23
	oidUUID  = 2950
)

// relation is what the decoder keeps of a Relation message: for an outbox
// table, where each mapped column sits in the tuple, resolved once here so
// that a row costs no lookup by name.
type relation struct {
	table string // namespace.name
	// outbox is the index of the table's mapping in Decoder.maps, or -1
	// for another table.
	outbox int
	ncols  int
	// idx is the tuple position of each role's column, -1 when the role is
	// not mapped (or the column is missing: then missing is set).
	idx [numRoles]int
	// extra is the tuple position of each Mapping.Additional column.
	extra []int
	// direct, when not nil, is the role of each column in tuple order
	// (roleNone for the others): set when no column feeds two roles and
	// there are no additional columns, so a row's fields are filled as
	// the tuple is read, without the copy through Decoder.cols.
	direct []role
	// idInt: the id column is an integer type, read into Event.ID;
	// otherwise (uuid, text) its text goes to Event.IDText.
	idInt bool
	// payloadBytea: the payload column is bytea, published as its raw
	// bytes (pgoutput sends the hex text \x...).
	payloadBytea bool
	// read are the columns of the message the relay reads (outbox tables
	// only), to tell a Relation that lost one (checkNarrowed).
	read []string
	// missing names the first mapped column the table lacks, or is empty.
	// It is reported on the first Insert, not here: a table without the
	// column is only a problem once a row arrives.
	missing, missingKey string
}

// relation handles Relation: Int32 id, String namespace, String name, Int8
// replica identity, Int16 column count, and per column Int8 flags, String
// name, Int32 type oid, Int32 type modifier. A Relation with a known id
// replaces the old one, as after ALTER TABLE.
func (d *Decoder) relation(lsn pglogrepl.LSN, b []byte) error {
	c := cursor{b: b}
	id := c.u32()
	ns := c.cstring()
	name := c.cstring()
	c.u8() // replica identity
	n := int(c.u16())
	if c.short {
		return protocolError(lsn, "Relation", "truncated header")
	}
	outbox := -1
	for i := range d.maps {
		if string(ns) == d.maps[i].schema && string(name) == d.maps[i].name {
			outbox = i
			break
		}
	}
	rel := &relation{
		table:  string(ns) + "." + string(name),
		outbox: outbox,
		ncols:  n,
	}
	// A column takes at least 10 bytes, so a count the message cannot hold
	// is rejected before it sizes an allocation.
	if n > c.rest()/10 {
		return protocolError(lsn, "Relation", "%d columns do not fit in %d bytes", n, c.rest())
	}
	var tm *tableMap
	if outbox >= 0 {
		tm = &d.maps[outbox]
		rel.table = tm.full
		for r := range rel.idx {
			rel.idx[r] = -1
		}
		rel.extra = make([]int, len(tm.m.Additional))
		for i := range rel.extra {
			rel.extra[i] = -1
		}
	}
	for i := 0; i < n; i++ {
		c.u8() // flags
		col := c.cstring()
		oid := c.u32()
		c.u32() // type modifier
		if c.short {
			return protocolError(lsn, "Relation", "truncated in column %d of %s", i, rel.table)
		}
		if tm == nil {
			continue
		}
		if tm.readColumn(col) {
			rel.read = append(rel.read, string(col))
		}
		for r, want := range tm.cols {
			if want != "" && string(col) == want {
				rel.idx[r] = i
				switch role(r) {
				case roleID:
					rel.idInt = oid == oidInt8 || oid == oidInt4 || oid == oidInt2
				case rolePayload:
					rel.payloadBytea = oid == oidBytea
				case roleEventID:
					// Migration 0006 refuses another type; a column of
					// the name that is not ours is not the identity.
					if oid != oidUUID {
						rel.idx[r] = -1
					}
				case roleReplayOf:
					if oid != oidInt8 {
						rel.idx[r] = -1
					}
				}
			}
		}
		for j, p := range tm.m.Additional {
			if string(col) == p.Column {
				rel.extra[j] = i
			}
		}
	}
	if c.off != len(b) {
		return protocolError(lsn, "Relation", "%d bytes after the columns of %s", len(b)-c.off, rel.table)
	}
	if tm != nil {
		if err := d.checkNarrowed(lsn, tm, rel, d.rels[id]); err != nil {
			return err
		}
		for r, want := range tm.cols {
			// A table without its headers column has no headers (start-up
			// validation refuses a configured one that is missing).
			if want != "" && rel.idx[r] < 0 && !role(r).optional() {
				rel.missing, rel.missingKey = want, roleKeys[r]
				break
			}
		}
		for j, p := range tm.m.Additional {
			if rel.missing == "" && rel.extra[j] < 0 {
				rel.missing, rel.missingKey = p.Column, outboxschema.KeyColumnsAdditional
			}
		}
		if need := n; cap(d.cols) < need {
			d.cols = make([]field, need)
		}
		rel.direct = directRoles(rel, n)
	}
	d.rels[id] = rel
	return nil
}

// optional reports whether a table may lack the role's column: the headers
// column, and the identity columns of a table not migrated yet.
func (r role) optional() bool { return r == roleHeaders || r == roleEventID || r == roleReplayOf }

// directRoles returns relation.direct for rel, or nil when a column feeds
// two roles or the mapping places additional columns.
func directRoles(rel *relation, n int) []role {
	if len(rel.extra) > 0 {
		return nil
	}
	direct := make([]role, n)
	for i := range direct {
		direct[i] = roleNone
	}
	for r, i := range rel.idx {
		if i < 0 {
			continue
		}
		if direct[i] != roleNone {
			return nil
		}
		direct[i] = role(r)
	}
	return direct
}

// cursor reads big-endian protocol fields from a message body. A read past
// the end sets short and returns zero values, so a parser can read a whole
// fixed part and check once.
type cursor struct {
	b     []byte
	off   int
	short bool
}

func (c *cursor) rest() int { return len(c.b) - c.off }

func (c *cursor) u8() byte {
	if c.rest() < 1 {
		c.short = true
		return 0
	}
	v := c.b[c.off]
	c.off++
	return v
}

func (c *cursor) u16() uint16 {
	if c.rest() < 2 {
		c.short = true
		return 0
	}
	v := uint16(c.b[c.off])<<8 | uint16(c.b[c.off+1])
	c.off += 2
	return v
}

func (c *cursor) u32() uint32 {
	if c.rest() < 4 {
		c.short = true
		return 0
	}
	b := c.b[c.off : c.off+4]
	c.off += 4
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

func (c *cursor) u64() uint64 {
	hi := c.u32()
	lo := c.u32()
	return uint64(hi)<<32 | uint64(lo)
}

// next returns the next n bytes, aliasing the message.
func (c *cursor) next(n uint32) []byte {
	if c.short || uint64(n) > uint64(c.rest()) {
		c.short = true
		return nil
	}
	v := c.b[c.off : c.off+int(n)]
	c.off += int(n)
	return v
}

// cstring returns the next NUL-terminated string without its NUL, aliasing
// the message.
func (c *cursor) cstring() []byte {
	if c.short {
		return nil
	}
	i := bytes.IndexByte(c.b[c.off:], 0)
	if i < 0 {
		c.short = true
		return nil
	}
	v := c.b[c.off : c.off+i]
	c.off += i + 1
	return v
}
