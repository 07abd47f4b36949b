package decoder

import (
	"bytes"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/outboxschema"
)

// role is the outbox field a relation column feeds.
type role int8

const (
	roleNone role = iota - 1
	roleID
	roleAggregateType
	roleAggregateID
	roleEventType
	rolePayload
	roleHeaders // optional
	numRoles
)

// roleNames are the outbox column names, indexed by role. Which of them are
// required is outboxschema.RequiredColumns.
var roleNames = [numRoles]string{
	roleID:            outboxschema.ColID,
	roleAggregateType: outboxschema.ColAggregateType,
	roleAggregateID:   outboxschema.ColAggregateID,
	roleEventType:     outboxschema.ColEventType,
	rolePayload:       outboxschema.ColPayload,
	roleHeaders:       outboxschema.ColHeaders,
}

// relation is what the decoder keeps of a Relation message.
type relation struct {
	table  string // namespace.name
	outbox bool
	// roles has one entry per column, in tuple order: the outbox field the
	// column feeds, or roleNone. Other tables only use its length.
	roles []role
	// missing names the first required outbox column the table lacks, or is
	// empty. It is reported on the first Insert, not here: a table without
	// the column is only a problem once a row arrives.
	missing string
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
	outbox := string(ns) == d.schema && string(name) == d.name
	rel := &relation{
		table:  string(ns) + "." + string(name),
		outbox: outbox,
	}
	// A column takes at least 10 bytes, so a count the message cannot hold
	// is rejected before it sizes an allocation.
	if n > c.rest()/10 {
		return protocolError(lsn, "Relation", "%d columns do not fit in %d bytes", n, c.rest())
	}
	rel.roles = make([]role, n)
	for i := range rel.roles {
		c.u8() // flags
		col := c.cstring()
		c.u32() // type oid
		c.u32() // type modifier
		if c.short {
			return protocolError(lsn, "Relation", "truncated in column %d of %s", i, rel.table)
		}
		rel.roles[i] = roleNone
		if outbox {
			rel.roles[i] = roleOf(col)
		}
	}
	if c.off != len(b) {
		return protocolError(lsn, "Relation", "%d bytes after the columns of %s", len(b)-c.off, rel.table)
	}
	if outbox {
		rel.missing = missingColumn(rel.roles)
	}
	d.rels[id] = rel
	return nil
}

func roleOf(col []byte) role {
	for r, name := range roleNames {
		if string(col) == name {
			return role(r)
		}
	}
	return roleNone
}

// missingColumn returns the first required outbox column absent from roles.
func missingColumn(roles []role) string {
	var have [numRoles]bool
	for _, r := range roles {
		if r != roleNone {
			have[r] = true
		}
	}
	for _, name := range outboxschema.RequiredColumns {
		for r, n := range roleNames {
			if n == name && !have[r] {
				return name
			}
		}
	}
	return ""
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
