package decoder

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pglogrepl"
)

// Source says where an Event comes from.
type Source uint8

const (
	// SourceRow: an Insert into the outbox table.
	SourceRow Source = iota
	// SourceMessage: a transactional logical decoding message
	// (pg_logical_emit_message(true, prefix, envelope)) with the prefix
	// given to SetMessagePrefix.
	SourceMessage
)

// Envelope keys of a message event: a JSON object
//
//	{"id": "...", "aggregate_type": "...", "aggregate_id": "...", "event_type": "...",
//	 "payload": <any JSON value>, "headers": {"k": "v", ...}}
//
// The four first are required JSON strings (id and aggregate_id not
// empty); payload is published as its JSON text, byte for byte as written
// (absent: the text null); headers, optional, are read like a row's
// headers column. Other keys are ignored; a key given twice is refused.
const (
	EnvelopeID            = "id"
	EnvelopeAggregateType = "aggregate_type"
	EnvelopeAggregateID   = "aggregate_id"
	EnvelopeEventType     = "event_type"
	EnvelopePayload       = "payload"
	EnvelopeHeaders       = "headers"
)

// msgState is the message-event part of a Decoder.
type msgState struct {
	prefix []byte // nil: message events off
	limit  int    // content bytes; 0: no limit
	seen   []string
}

// SetMessagePrefix makes Decode turn every transactional Message whose
// prefix is exactly prefix into an Event of its transaction, in WAL order
// with the transaction's rows (messages.prefix); "" (the default) turns
// message events off. Content longer than limit bytes (0: no limit) is
// refused unread (the relay gives kafka.max_message_bytes). A
// non-transactional Message with the prefix is refused too: it is decoded
// even when its writer's transaction rolls back. A refused message comes
// out as an Event with Err set, like a bad row. Call before the first
// Decode.
func (d *Decoder) SetMessagePrefix(prefix string, limit int) {
	d.msg.prefix, d.msg.limit = nil, limit
	if prefix != "" {
		d.msg.prefix = []byte(prefix)
	}
}

// Hints of a refused message.
const (
	hintMsgProducer = "fix the producer that wrote it (outbox.WriteMessage writes valid envelopes)"
	hintMsgTxn      = "write it with pg_logical_emit_message(true, ...) inside the business transaction (outbox.WriteMessage does)"
	hintMsgSize     = "make the event smaller, or raise kafka.max_message_bytes (and the broker's and topic's limits)"
	hintMsgReserved = "rename the key in the producer that writes the envelope (e.g. x-event_id); the relay sets these headers itself from the envelope's fields"
	hintMsgBadName  = "rename the key in the producer that writes the envelope: a header name is not empty, has no whitespace at either end and no control or invisible character (docs/outbox-table.md#headers)"
)

// messageEvent handles a Message (its body after any xid) when its prefix
// is the message-event prefix: ok is then true. xid is the (sub)transaction
// of a streamed one (inside a stream block). A non-transactional one
// outside any transaction comes back as a Txn of its own, ending at the
// message's LSN, holding the refused event.
func (d *Decoder) messageEvent(walStart pglogrepl.LSN, xid uint32, b []byte) (txn *Txn, ok bool, err error) {
	if d.msg.prefix == nil {
		return nil, false, nil
	}
	c := cursor{b: b}
	flags := c.u8()
	lsn := pglogrepl.LSN(c.u64())
	prefix := c.cstring()
	if c.short || !bytes.Equal(prefix, d.msg.prefix) {
		return nil, false, nil
	}
	n := c.u32()
	if c.short || uint64(n) != uint64(c.rest()) {
		return nil, true, protocolError(walStart, "Message", "prefix %q: content length %d, but %d bytes follow", prefix, n, c.rest())
	}
	content := b[c.off:]
	transactional := flags&1 == 1
	if transactional && d.cur == nil && !d.inTxn {
		return nil, true, protocolError(walStart, "Message", "a transactional message with prefix %q outside any transaction", prefix)
	}
	var ev Event
	if transactional {
		// An event of the open transaction takes its bytes from the slabs
		// and its ids at handout, as a row does.
		d.toTxn, d.idSpan = d.cur == nil && d.inTxn, idSpan{start: -1}
		ev = d.envelope(walStart, content)
		d.toTxn = false
	} else {
		// Refused whatever it holds; what can be read of it names it.
		ev = d.envelope(walStart, content)
		if ev.Payload == nil { // over the limit: not kept
			content = nil
		}
		ev = d.refuseMessage(ev, content, "transactional",
			"is false: a non-transactional message is decoded even when the transaction that wrote it rolls back, so it is never published as an event",
			hintMsgTxn)
	}
	d.counts.MessageEvents++
	switch {
	case d.cur != nil:
		return nil, true, d.spoolEvent(walStart, xid, &ev)
	case d.inTxn:
		d.addEvent(ev)
		return d.maybeChunk(), true, nil
	default:
		d.counts.Txns++
		d.counts.Events++
		return &Txn{BeginLSN: lsn, CommitLSN: lsn, EndLSN: lsn, Events: []Event{ev}}, true, nil
	}
}

// envelope builds the Event of a transactional message's content.
func (d *Decoder) envelope(lsn pglogrepl.LSN, content []byte) Event {
	if ev, bad := d.envelopeBounds(lsn, content); bad {
		return ev
	}
	if ev, ok := d.scanEnvelope(lsn, content); ok {
		return ev
	}
	return d.envelopeJSON(lsn, content)
}

// envelopeBounds refuses content over the size limit or not UTF-8: the
// checks before either decode.
func (d *Decoder) envelopeBounds(lsn pglogrepl.LSN, content []byte) (Event, bool) {
	ev := Event{LSN: lsn, Source: SourceMessage}
	if d.msg.limit > 0 && len(content) > d.msg.limit {
		return d.refuseMessage(ev, nil, "content",
			fmt.Sprintf("is %d bytes, over the limit of %d (kafka.max_message_bytes); the dead letter cannot carry it", len(content), d.msg.limit),
			hintMsgSize), true
	}
	if !utf8.Valid(content) {
		return d.refuseMessage(ev, content, "content", "is not valid UTF-8", hintMsgProducer), true
	}
	return Event{}, false
}

// envelopeJSON is envelope through encoding/json, after the size and UTF-8
// checks: it takes every envelope scanEnvelope does not accept, and words
// the refusals.
func (d *Decoder) envelopeJSON(lsn pglogrepl.LSN, content []byte) Event {
	ev := Event{LSN: lsn, Source: SourceMessage}
	bad := func(field, text string) Event { return d.refuseMessage(ev, content, field, text, hintMsgProducer) }
	d.rd.Reset(content)
	dec := json.NewDecoder(&d.rd)
	tok, err := dec.Token()
	if err != nil {
		return bad("content", invalidJSON(err).text)
	}
	if tok != json.Delim('{') {
		return bad("content", "is "+jsonKind(tok)+", not a JSON object (the envelope: id, aggregate_type, aggregate_id, event_type, payload, headers)")
	}
	var (
		payload, hdrs   json.RawMessage
		hasPay, hasHdrs bool
		got             [4]bool // required fields read
		id, aggID       string
	)
	required := [4]string{EnvelopeID, EnvelopeAggregateType, EnvelopeAggregateID, EnvelopeEventType}
	d.msg.seen = d.msg.seen[:0]
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return bad("content", invalidJSON(err).text)
		}
		key, _ := tok.(string)
		for _, k := range d.msg.seen {
			if k == key {
				return bad(cutKey(key), "appears twice in the envelope")
			}
		}
		if len(d.msg.seen) < 64 {
			d.msg.seen = append(d.msg.seen, key)
		}
		switch key {
		case EnvelopePayload:
			if err := dec.Decode(&payload); err != nil {
				return bad("content", invalidJSON(err).text)
			}
			hasPay = true
		case EnvelopeHeaders:
			if err := dec.Decode(&hdrs); err != nil {
				return bad("content", invalidJSON(err).text)
			}
			hasHdrs = true
		default:
			if err := dec.Decode(&d.raw); err != nil {
				return bad("content", invalidJSON(err).text)
			}
			for i, r := range required {
				if key != r {
					continue
				}
				if d.raw[0] != '"' {
					return bad(key, "is "+rawKind(d.raw)+", not a JSON string")
				}
				var s string
				if err := json.Unmarshal(d.raw, &s); err != nil {
					return bad(key, invalidJSON(err).text)
				}
				got[i] = true
				switch i { // kept as soon as read, for a dead letter
				case 0:
					ev.MessageID, id = s, s
				case 1:
					ev.AggregateType = d.str([]byte(s))
				case 2:
					ev.AggregateID, aggID = s, s
				case 3:
					ev.EventType = d.str([]byte(s))
				}
			}
		}
	}
	if _, err := dec.Token(); err != nil { // the closing '}'
		return bad("content", invalidJSON(err).text)
	}
	if _, err := dec.Token(); err != io.EOF {
		return bad("content", "has data after the JSON object")
	}
	for i, ok := range got {
		if !ok {
			return bad(required[i], "is missing (required: id, aggregate_type, aggregate_id, event_type)")
		}
	}
	if id == "" {
		return bad(EnvelopeID, "is empty")
	}
	if aggID == "" {
		// It is the Kafka key: an empty key loses per-aggregate ordering.
		return bad(EnvelopeAggregateID, "is empty")
	}
	hasHeaders := hasHdrs && !bytes.Equal(hdrs, []byte("null"))
	if hasHeaders {
		if r := d.parseHeaders(hdrs); r != nil {
			return bad(EnvelopeHeaders, r.text)
		}
		for _, h := range d.hdrs {
			if h.refused {
				r, reserved := headerNameReason(h.key, d.reserved, hintMsgReserved, hintMsgBadName)
				ev = d.refuseMessage(ev, content, EnvelopeHeaders, r.text, r.hint)
				if reserved {
					ev.Err.ReservedHeader = h.key
				}
				return ev
			}
		}
	}
	if !hasPay {
		payload = json.RawMessage("null")
	}
	// One allocation for the payload and all header values, as for a row.
	var vals []byte
	if hasHeaders {
		vals = d.vals.Bytes()
	}
	buf := make([]byte, len(payload)+len(vals))
	p := copy(buf, payload)
	copy(buf[p:], vals)
	ev.Payload = buf[:p:p]
	if hasHeaders {
		ev.Headers = make([]Header, len(d.hdrs))
		for i, h := range d.hdrs {
			ev.Headers[i] = Header{Key: h.key, Value: buf[p+h.start : p+h.end : p+h.end]}
		}
	}
	return ev
}

// refuseMessage returns ev (with what could be read of the envelope)
// refused: Err names the field, and the Payload is a copy of content (nil
// when content is nil), so that a dead letter carries the whole message.
func (d *Decoder) refuseMessage(ev Event, content []byte, field, text, hint string) Event {
	ev.Err = &RowError{Prefix: string(d.msg.prefix), MessageID: ev.MessageID, LSN: ev.LSN, Column: field, Reason: text, hint: hint}
	ev.Headers = nil
	ev.Payload = nil
	if content != nil {
		ev.Payload = append([]byte{}, content...)
	}
	return ev
}

// rawKind names the JSON type of a raw value, for errors.
func rawKind(raw json.RawMessage) string {
	switch raw[0] {
	case '{':
		return "a JSON object"
	case '[':
		return "a JSON array"
	case 't', 'f':
		return "a JSON boolean"
	case 'n':
		return "JSON null"
	case '"':
		return "a JSON string"
	default:
		return "a JSON number"
	}
}

// cutKey bounds an envelope key named in an error.
func cutKey(k string) string {
	if len(k) <= 64 {
		return k
	}
	return strings.ToValidUTF8(k[:64], "") + "..."
}

// messageError is the text of a RowError about a message event.
func (e *RowError) messageError() string {
	id := ""
	if e.MessageID != "" {
		id = " id=" + strconv.Quote(cutKey(e.MessageID))
	}
	s := fmt.Sprintf("outbox message (prefix %q)%s at LSN %s: field %q: %s", e.Prefix, id, e.LSN, e.Column, e.Reason)
	if e.hint != "" {
		s += "; " + e.hint
	}
	return s
}
