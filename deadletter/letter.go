// Package deadletter is where poison events go: an event that can never be
// published as it is (too large, an invalid topic, a record the broker
// rejects, a row that cannot become an event). It builds the dead-letter
// record's key, value and headers (Letter.Record; package record makes the
// Letter of a failed record and the sink.Message around it), marks the
// outbox row so an operator finds it with SQL (Store), and serves the
// operator's list, replay and resolve.
package deadletter

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/outboxschema"
	"github.com/outbox-relay/outbox-relay/sink"
)

// Header keys a dead-letter record carries besides the event's own headers.
const (
	HeaderOriginalTopic  = "dlq.original_topic"  // "" when the event could not be routed
	HeaderReason         = "dlq.reason"          // e.g. message_too_large, bad_row
	HeaderError          = "dlq.error"           // the last error, as logged
	HeaderAttempts       = "dlq.attempts"        // publish attempts before dead-lettering
	HeaderSourceLSN      = "dlq.source_lsn"      // WAL position of the outbox insert
	HeaderTable          = "dlq.table"           // schema.table of the outbox row; "" for a message event
	HeaderEventID        = "dlq.event_id"        // the outbox row id, also when the row could not be decoded; a message event's envelope id
	HeaderMessagePrefix  = "dlq.message_prefix"  // a message event's prefix (messages.prefix); absent for rows
	HeaderPayloadOmitted = "dlq.payload_omitted" // "true" when the payload stayed in the row
	HeaderHeadersOmitted = "dlq.headers_omitted" // "true" when the row's own headers stayed in the row
	HeaderKeyTruncated   = "dlq.key_truncated"   // the original key's length in bytes, when the key was cut (BoundField)
	HeaderFailedAt       = "dlq.failed_at"       // RFC 3339, when the relay gave up
	// A relay header whose value was cut (BoundField) is announced as
	// dlq.<name>_truncated with the original length, e.g.
	// dlq.aggregate_id_truncated.
	headerTruncatedSuffix = "_truncated"
)

// Reasons for dead-lettering besides sink's publish error reasons.
const (
	ReasonBadRow         = "bad_row"         // the row cannot become an event (decoder.RowError)
	ReasonReservedHeader = "reserved_header" // its headers column holds a key the relay sets itself (outboxschema.ReservedHeader)
	ReasonBadMessage     = "bad_message"     // a message with the messages prefix cannot become an event (decoder.RowError with Prefix)
	ReasonInvalidTopic   = "invalid_topic"   // the topic template makes an invalid name
	ReasonTopicLimit     = "topic_limit"     // the topic would be one more than kafka.max_topics
	// ReasonTopicNotAllowed: the topic is not in kafka.topic_allowlist.
	ReasonTopicNotAllowed = "topic_not_allowed"
)

// maxErrorText bounds the error text kept in a header and in last_error.
const maxErrorText = 2000

// Letter is one poison event on its way to the dead-letter topic.
type Letter struct {
	Table  string
	ID     int64  // 0 if the row's id could not be read
	IDText string // the id of a table whose id is not an integer (uuid, text); then ID is 0
	// EventID and Prefix are set instead of Table and ID for a message
	// event (messages.prefix): its envelope id ("" if unreadable) and
	// prefix. There is no row to mark: the dead letter is the only copy.
	EventID    string
	Prefix     string
	LSN        pglogrepl.LSN
	Topic      string // the topic it was meant for; "" if it could not be routed
	Key        []byte
	Value      []byte
	Headers    []sink.Header // the relay's own headers of the event (event_id, ...)
	RowHeaders []sink.Header // the headers the row's headers column gave the event
	Reason     string
	Err        string
	Attempts   int
	// TooLarge: the event itself was too large for Kafka. The record goes
	// without payload and without the row's headers, whatever MaxBytes
	// says (the broker's limit may be below kafka.max_message_bytes); the
	// row keeps both.
	TooLarge bool
	// MaxBytes is kafka.max_message_bytes: the record is cut to fit it
	// (Record). Zero means no limit.
	MaxBytes int
	// At is when the relay gave up on the event (dlq.failed_at): the now
	// of its first Record, kept for a letter cut down again (Shrink).
	At time.Time
	// cut counts the steps Shrink took: 1 drops the row's headers, 2 the
	// payload too, 3 cuts dlq.error to shortError bytes, cutLeast drops it.
	cut int
}

const (
	cutLeast   = 4
	shortError = 256
)

// Shrink cuts the letter down further after the dead-letter topic refused
// its record, of size bytes (RecordSize), for its size: the topic's
// max.message.bytes is below kafka.max_message_bytes. It takes the steps
// Record takes for MaxBytes, one more at a time, until the record is
// smaller: the row's headers, then the payload, then dlq.error cut to 256
// bytes, then dropped. It returns false when there is nothing left to drop
// (the least letter: key, the relay's headers and the dlq.* ones): only
// the topic's limit can change then. A message event's payload is never
// dropped here: its dead letter is the only copy (the slot passes it).
func (l *Letter) Shrink(size int) bool {
	for l.cut < cutLeast {
		l.cut++
		if k, v, h := l.Record(l.At); RecordSize(k, v, h) < size {
			return true
		}
	}
	return false
}

// Cuts is how many steps Shrink took; CutTo takes the same steps on a
// letter made again (after an exactly-once rewind, the dead letter is built
// anew from the event).
func (l *Letter) Cuts() int { return l.cut }

// CutTo sets the letter's cut to n steps (at most the least letter).
func (l *Letter) CutTo(n int) { l.cut = min(max(n, 0), cutLeast) }

// MaxField bounds the key of a dead letter and the value of each of the
// relay's headers: a longer one is cut (BoundField). Applied to every dead
// letter, so the same aggregate always has the same dead-letter key.
const MaxField = 128

// boundPrefix is how much of a cut value BoundField keeps before the hash.
const boundPrefix = MaxField - len(boundMark) - 2*sha256.Size

const boundMark = "~sha256:"

// BoundField returns b if it is at most MaxField bytes. A longer b becomes
// its first 56 bytes (cut back to whole UTF-8 characters), "~sha256:" and
// the hex SHA-256 of the whole of b: at most MaxField bytes, the same for
// the same b (so a dead letter's key, and its partition, are stable per
// aggregate), and findable in SQL:
// encode(sha256(convert_to(aggregate_id, 'UTF8')), 'hex').
func BoundField(b []byte) []byte {
	if len(b) <= MaxField {
		return b
	}
	n := boundPrefix
	for n > 0 && !utf8.RuneStart(b[n]) {
		n--
	}
	sum := sha256.Sum256(b)
	out := make([]byte, 0, MaxField)
	out = append(out, b[:n]...)
	out = append(out, boundMark...)
	return hex.AppendEncode(out, sum[:])
}

// recordBatchOverhead is what a record batch adds around its records (v2:
// base offset, length, epoch, magic, CRC, attributes, ...). The broker
// checks message.max.bytes against the whole batch; sarama checks
// kafka.max_message_bytes against the record alone.
const recordBatchOverhead = 61

// RecordSize is the size the producer counts for a record against
// kafka.max_message_bytes (record format v2): sarama's
// ProducerMessage.ByteSize, which the direct engine counts alike. An upper
// bound of the record's encoded size.
func RecordSize(key, value []byte, headers []sink.Header) int {
	n := 5*binary.MaxVarintLen32 + binary.MaxVarintLen64 + 1 + len(key) + len(value)
	for _, h := range headers {
		n += len(h.Key) + len(h.Value) + 2*binary.MaxVarintLen32
	}
	return n
}

// Record returns the key, value and headers of the dead-letter record: the
// relay's headers of the event, the row's headers, then the dlq.* ones.
//
// The record always fits MaxBytes less a record batch's overhead, so that
// writing it cannot fail for its size (for any MaxBytes of 2048 or more):
//   - the key and each relay header value longer than MaxField are cut
//     (BoundField; dlq.key_truncated, dlq.<header>_truncated);
//   - the row's headers are dropped (dlq.headers_omitted) when TooLarge, or
//     when the record would not fit otherwise;
//   - then the payload (dlq.payload_omitted), likewise;
//   - then dlq.error is shortened to what room is left.
//
// A letter the dead-letter topic refused for its size takes these steps
// further (Shrink).
//
// Any goroutine; it does not block.
func (l *Letter) Record(now time.Time) (key, value []byte, headers []sink.Header) {
	var notes []sink.Header // dlq.*_truncated
	note := func(k string, n int) {
		notes = append(notes, sink.Header{Key: []byte(k), Value: []byte(strconv.Itoa(n))})
	}
	key = BoundField(l.Key)
	if len(key) != len(l.Key) {
		note(HeaderKeyTruncated, len(l.Key))
	}
	own := make([]sink.Header, len(l.Headers))
	for i, h := range l.Headers {
		own[i] = sink.Header{Key: h.Key, Value: BoundField(h.Value)}
		if len(own[i].Value) != len(h.Value) {
			note(outboxschema.DeadLetterPrefix+string(h.Key)+headerTruncatedSuffix, len(h.Value))
		}
	}
	value, row, errText := l.Value, l.RowHeaders, Truncate(l.Err)
	// A message event's dead letter is its only copy: Shrink never drops
	// its payload (Record still does to fit MaxBytes, as ever).
	omitValue, omitRow := l.TooLarge || (l.cut >= 2 && l.Prefix == ""), (l.TooLarge || l.cut >= 1) && len(row) > 0
	switch {
	case l.cut >= cutLeast:
		errText = ""
	case l.cut == cutLeast-1 && len(errText) > shortError:
		errText = strings.ToValidUTF8(errText[:shortError], "") + "..."
	}
	build := func() []sink.Header {
		h := make([]sink.Header, 0, len(own)+len(row)+len(notes)+11)
		h = append(h, own...)
		if !omitRow {
			h = append(h, row...)
		}
		add := func(k, v string) { h = append(h, sink.Header{Key: []byte(k), Value: []byte(v)}) }
		add(HeaderOriginalTopic, l.Topic)
		add(HeaderReason, l.Reason)
		add(HeaderError, errText)
		add(HeaderAttempts, strconv.Itoa(l.Attempts))
		add(HeaderSourceLSN, l.LSN.String())
		add(HeaderTable, l.Table)
		switch {
		case l.Prefix != "":
			add(HeaderEventID, string(BoundField([]byte(l.EventID))))
			add(HeaderMessagePrefix, l.Prefix)
		case l.IDText != "":
			add(HeaderEventID, string(BoundField([]byte(l.IDText))))
		default:
			add(HeaderEventID, strconv.FormatInt(l.ID, 10))
		}
		add(HeaderFailedAt, now.UTC().Format(time.RFC3339Nano))
		if omitValue {
			add(HeaderPayloadOmitted, "true")
		}
		if omitRow {
			add(HeaderHeadersOmitted, "true")
		}
		return append(h, notes...)
	}
	val := func() []byte {
		if omitValue {
			return nil
		}
		return value
	}
	headers = build()
	if l.MaxBytes <= 0 {
		return key, val(), headers
	}
	budget := l.MaxBytes - recordBatchOverhead
	over := func() int { return RecordSize(key, val(), headers) - budget }
	if over() > 0 && len(row) > 0 && !omitRow {
		omitRow = true
		headers = build()
	}
	if over() > 0 && !omitValue {
		omitValue = true
		headers = build()
	}
	if n := over(); n > 0 {
		errText = strings.ToValidUTF8(errText[:max(0, len(errText)-n)], "")
		headers = build()
	}
	return key, val(), headers
}

// Truncate bounds an error text for a header or the last_error column.
func Truncate(s string) string {
	if len(s) <= maxErrorText {
		return s
	}
	return strings.ToValidUTF8(s[:maxErrorText], "") + "..."
}
