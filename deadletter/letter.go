// Package deadletter is where poison events go: an event that can never be
// published as it is (too large, an invalid topic, a record the broker
// rejects, a row that cannot become an event). It builds the dead-letter
// record, marks the outbox row so an operator finds it with SQL, and serves
// the operator's list, replay and resolve.
package deadletter

import (
	"strconv"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pglogrepl"
)

// Header keys a dead-letter record carries besides the event's own headers.
const (
	HeaderOriginalTopic  = "dlq.original_topic"  // "" when the event could not be routed
	HeaderReason         = "dlq.reason"          // e.g. message_too_large, bad_row
	HeaderError          = "dlq.error"           // the last error, as logged
	HeaderAttempts       = "dlq.attempts"        // publish attempts before dead-lettering
	HeaderSourceLSN      = "dlq.source_lsn"      // WAL position of the outbox insert
	HeaderTable          = "dlq.table"           // schema.table of the outbox row
	HeaderEventID        = "dlq.event_id"        // the outbox row id, also when the row could not be decoded
	HeaderPayloadOmitted = "dlq.payload_omitted" // "true" when the payload stayed in the row
	HeaderFailedAt       = "dlq.failed_at"       // RFC 3339, when the relay gave up
)

// Reasons for dead-lettering besides sink's publish error reasons.
const (
	ReasonBadRow       = "bad_row"       // the row cannot become an event (decoder.RowError)
	ReasonInvalidTopic = "invalid_topic" // the topic template makes an invalid name
	ReasonTopicLimit   = "topic_limit"   // the topic would be one more than kafka.max_topics
	// ReasonTopicNotAllowed: the topic is not in kafka.topic_allowlist.
	ReasonTopicNotAllowed = "topic_not_allowed"
)

// maxErrorText bounds the error text kept in a header and in last_error.
const maxErrorText = 2000

// Letter is one poison event on its way to the dead-letter topic.
type Letter struct {
	Table    string
	ID       int64 // 0 if the row's id could not be read
	LSN      pglogrepl.LSN
	Topic    string // the topic it was meant for; "" if it could not be routed
	Key      []byte
	Value    []byte
	Headers  []sarama.RecordHeader // the event's own headers
	Reason   string
	Err      string
	Attempts int
	// OmitPayload sends the record without its value (the event was too
	// large for the broker); the row keeps the payload.
	OmitPayload bool
}

// Record returns the value and headers of the dead-letter record: the
// event's headers first, then the dlq.* ones.
func (l *Letter) Record(now time.Time) (value []byte, headers []sarama.RecordHeader) {
	h := make([]sarama.RecordHeader, 0, len(l.Headers)+9)
	h = append(h, l.Headers...)
	add := func(k, v string) { h = append(h, sarama.RecordHeader{Key: []byte(k), Value: []byte(v)}) }
	add(HeaderOriginalTopic, l.Topic)
	add(HeaderReason, l.Reason)
	add(HeaderError, Truncate(l.Err))
	add(HeaderAttempts, strconv.Itoa(l.Attempts))
	add(HeaderSourceLSN, l.LSN.String())
	add(HeaderTable, l.Table)
	add(HeaderEventID, strconv.FormatInt(l.ID, 10))
	add(HeaderFailedAt, now.UTC().Format(time.RFC3339Nano))
	value = l.Value
	if l.OmitPayload {
		add(HeaderPayloadOmitted, "true")
		value = nil
	}
	return value, h
}

// Truncate bounds an error text for a header or the last_error column.
func Truncate(s string) string {
	if len(s) <= maxErrorText {
		return s
	}
	return strings.ToValidUTF8(s[:maxErrorText], "") + "..."
}
