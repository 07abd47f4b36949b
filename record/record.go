// Package record is the one builder from a decoded outbox event to its
// Kafka record: the key, value and headers of either record format (this
// relay's own, or Debezium's with compat: debezium), the topic (Route), the
// dead letter of an event that cannot be published (Letter), and the
// poison decision (Decide). The relay's pipeline, outbox-relay replay and
// outbox-relay dlq replay all build their records here, so a record is the
// same whichever of them wrote it. Everything here is pure: no I/O, no
// goroutines, no locks.
package record

import (
	"strings"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/deadletter"
	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/outboxschema"
	"github.com/outbox-relay/outbox-relay/sink"
)

// Record formats (the compat key).
const (
	// FormatOwn is this relay's record: key aggregate_id, headers event_id,
	// event_type, aggregate_type, aggregate_id, pg_lsn, outbox_id (rows
	// with an integer id), the marks outbox_replayed_from and
	// outbox_replay when they apply, then the row's.
	FormatOwn = ""
	// FormatDebezium is what Debezium's outbox EventRouter writes by
	// default: key the key column, value the payload, header id, then the
	// configured placements (compat: debezium).
	FormatDebezium = "debezium"
)

// HeaderDebeziumID is the one header the EventRouter always sets: the event id.
const HeaderDebeziumID = "id"

// Reserved reports whether key is a header key the relay sets itself in
// format f (compared ignoring case): a placement or a headers column key
// may not use it, or a consumer could not tell the forged value from the
// relay's.
func Reserved(f string) func(string) bool {
	return func(key string) bool {
		if outboxschema.ReservedHeader(key) {
			return true
		}
		return f == FormatDebezium && strings.EqualFold(key, HeaderDebeziumID)
	}
}

// ReservedExtra are the keys Reserved adds to outboxschema.ReservedHeader
// in format f, for the decoder (decoder.NewMapped) to refuse.
func ReservedExtra(f string) []string {
	if f == FormatDebezium {
		return []string{HeaderDebeziumID}
	}
	return nil
}

// Own is the Kafka record in the relay's own format (FormatOwn) for ev: key
// aggregate_id, value the payload bytes, the relay's headers (event_id =
// ev's identity (decoder.Event.Identity), event_type, aggregate_type,
// aggregate_id, pg_lsn = commitLSN, outbox_id = the row's integer id,
// outbox_replayed_from = dlq on a dlq replay copy) then the row's, and
// timestamp at. Topic and Done are the caller's (Route). Its
// headers take two allocations; To takes them from a transaction's Slab.
// Any goroutine; it does not block.
func Own(ev *decoder.Event, commitLSN string, at time.Time) sink.Message {
	var m sink.Message
	To(&m, nil, ev, commitLSN, at)
	return m
}

// To sets the Key, Value, Headers and Timestamp of m as Own would, with
// the headers' memory from s (nil: allocated), leaving m's other fields:
// the pipeline builds each record in its delivery, no copy of a whole
// sink.Message. Any goroutine that owns m and s; it does not block.
func To(m *sink.Message, s *Slab, ev *decoder.Event, commitLSN string, at time.Time) {
	m.Headers, m.Key = headers(s, ev, commitLSN, "")
	m.Value, m.Timestamp = ev.Payload, at
}

// Replayed is Own for a record `outbox-relay replay` publishes: the same
// record with the header outbox_replay = startedAt (the replay's start,
// RFC 3339), so a consumer can tell a replayed copy from the first
// delivery; event_id is the event's own. Any goroutine; it does not block.
func Replayed(ev *decoder.Event, commitLSN string, at time.Time, startedAt string) sink.Message {
	var m sink.Message
	m.Headers, m.Key = headers(nil, ev, commitLSN, startedAt)
	m.Value, m.Timestamp = ev.Payload, at
	return m
}

// Debezium is the Kafka record Debezium's outbox EventRouter writes
// for ev by default (compat: debezium): key the key column's text, value
// the payload bytes (nil, a null value, for a NULL payload), header id the
// event id's text, then the row's headers and the placed columns
// (columns.additional), timestamp at. Any goroutine; it does not block.
func Debezium(ev *decoder.Event, at time.Time) sink.Message {
	n := len(ev.AggregateID) + len(ev.IDText) + len(ev.MessageID) + len(ev.EventID) + 20
	buf := make([]byte, 0, n)
	buf = append(buf, ev.AggregateID...)
	key := buf[:len(buf):len(buf)]
	buf = ev.AppendIdentity(buf) // a mapped table's: its id column's
	id := buf[len(key):len(buf):len(buf)]
	h := make([]sink.Header, 1, 1+len(ev.Headers))
	h[0] = sink.Header{Key: hdrDebeziumID, Value: id}
	for _, x := range ev.Headers {
		h = append(h, sink.Header{Key: []byte(x.Key), Value: x.Value})
	}
	return sink.Message{Key: key, Value: ev.Payload, Headers: h, Timestamp: at}
}

var hdrDebeziumID = []byte(HeaderDebeziumID)

// RowLetter turns m, the record of outbox row id that could not be
// published, into its dead letter under policy pol: the dead-letter topic,
// the same key (bounded), the payload and the row's headers unless the
// event was too large or they would not fit kafka.max_message_bytes, and
// the dlq.* headers (deadletter.Letter.Record). m's Done is not copied.
// Any goroutine; it does not block.
//
// idText is the id of a row whose id column is not an integer ("" else).
func RowLetter(table string, pol Policy, id int64, idText string, lsn pglogrepl.LSN, m sink.Message, reason string, attempts int, cause error, now time.Time) (sink.Message, *deadletter.Letter) {
	return Letter(&deadletter.Letter{Table: table, ID: id, IDText: idText}, pol, lsn, m, reason, attempts, cause, now)
}

// Letter is RowLetter for the event l names (Table and ID or IDText of a
// row, or EventID and Prefix of a message); it fills in the rest of l.
func Letter(l *deadletter.Letter, pol Policy, lsn pglogrepl.LSN, m sink.Message, reason string, attempts int, cause error, now time.Time) (sink.Message, *deadletter.Letter) {
	// The relay's headers lead; a row's own cannot use their keys (the
	// decoder refuses it), so they end at the first other key.
	n := 0
	for n < len(m.Headers) && n < maxOwnHeaders && outboxschema.ReservedHeader(string(m.Headers[n].Key)) {
		n++
	}
	if pol.Format == FormatDebezium {
		n = min(1, len(m.Headers)) // id
	}
	l.LSN, l.Topic, l.Key, l.Value = lsn, m.Topic, m.Key, m.Value
	l.Headers, l.RowHeaders, l.Reason = m.Headers[:n], m.Headers[n:], reason
	l.Err, l.Attempts, l.TooLarge, l.MaxBytes, l.At = cause.Error(), attempts, reason == "message_too_large", pol.MaxMessageBytes, now
	key, value, headers := l.Record(now)
	return sink.Message{Topic: pol.Topic, Key: key, Value: value, Headers: headers, Timestamp: m.Timestamp}, l
}

// Shrink cuts m, the dead letter of l, down further after the dead-letter
// topic refused it for its size (Letter.Shrink: the same steps, to half its
// size) and returns the smaller record, with m's topic, timestamp, Done and
// Ref. ok is false when m was already the least dead letter.
func Shrink(l *deadletter.Letter, m sink.Message) (out sink.Message, ok bool) {
	if !l.Shrink(deadletter.RecordSize(m.Key, m.Value, m.Headers)) {
		return m, false
	}
	m.Key, m.Value, m.Headers = l.Record(l.At)
	return m, true
}
