// Package inbox consumes the events outbox-relay publishes and handles each
// one once: the consumer half of the transactional outbox pattern.
//
// Delivery from the relay is at-least-once: a relay restart, a rewind or a
// consumer crash delivers a record again. A Consumer wraps a sarama
// ConsumerGroup and, for each record, in ONE PostgreSQL transaction:
//
//  1. INSERT the record's event_id into processed_events ... ON CONFLICT DO NOTHING;
//  2. only if that row is new, calls the Handler with the same transaction;
//  3. commits;
//  4. then marks the record's offset.
//
// So the handler's database changes commit together with the proof that the
// event was handled: a duplicate (a redelivery after a crash between the
// commit and the offset commit, or a record the relay published twice) finds
// its row and is skipped and counted; a handler error rolls back both the
// side effect and the row, and the record is retried. Side effects outside
// that transaction (an e-mail, an HTTP call) are not covered: make them
// idempotent, or record them in the transaction and send them afterwards.
//
// event_id is the event's identity: a record republished by outbox-relay
// replay (header outbox_replay) or dlq replay (outbox_replayed_from) keeps
// it and is skipped here once handled, and a row id handed out again after
// a failover or a restore does not make a new event look handled (its
// event_id is a new UUID).
//
// Records of one partition are handled one at a time, in offset order, so
// the events of one aggregate (one key, one partition) are handled in the
// order the relay published them.
//
// # Record formats
//
// Besides the relay's plain records (the payload JSON as the value, the
// event in headers), a Consumer reads:
//
//   - CloudEvents 1.0 (the relay's envelope: cloudevents, or any producer
//     following the Kafka protocol binding). Binary mode (ce_* headers):
//     EventID is the event_id header, else ce_id; EventType event_type,
//     else ce_type; AggregateID aggregate_id, else ce_subject; Payload the
//     value. Structured mode (content-type application/cloudevents+json):
//     the JSON event is unwrapped, Payload is its data (data_base64
//     decoded). Message.CloudEvent holds the attributes (nil for a record
//     that is no CloudEvent). A record claiming to be one that cannot be
//     read (not JSON, no id) never reaches the handler: like a record
//     without event_id it goes to Config.OnGiveUp, or stops the consumer,
//     with an error wrapping ErrBadCloudEvent naming topic/partition@offset.
//   - The Schema Registry wire format (magic byte 0, a 4-byte schema id,
//     the encoded data), with Config.Decoder set: Payload is the decoded
//     JSON and Message.SchemaID the schema id; a decode error is retried
//     like a handler error. Without a Decoder such a value reaches the
//     handler as it is (WireSchemaID reads its id); values not in the wire
//     format pass as they are either way.
//
// ParseMessage shows the mapping on one record.
package inbox

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/outboxschema"
)

// Header keys the relay sets (outboxschema) and schema_version, which the
// writer sets (outbox.Event.SchemaVersion).
const (
	HeaderEventID       = outboxschema.HeaderEventID
	HeaderEventType     = outboxschema.HeaderEventType
	HeaderAggregateType = outboxschema.HeaderAggregateType
	HeaderAggregateID   = outboxschema.HeaderAggregateID
	HeaderSchemaVersion = "schema_version"
)

// Message is one record as a Handler sees it.
type Message struct {
	// EventID is the event_id header, the dedup key: a UUID for rows
	// written since migration 0006 and for message events, the decimal
	// row id for older rows. Compare it as text; do not parse it.
	// A CloudEvent without that header gives its id (ce_id).
	EventID       string
	EventType     string // event_type header, else the CloudEvent's type
	AggregateType string // aggregate_type header
	AggregateID   string // aggregate_id header (also the record key), else the CloudEvent's subject
	// Headers holds every record header (the last value of a repeated key).
	Headers map[string]string
	Key     []byte
	// Payload is the event's data: the record value (the outbox row's
	// payload JSON); for a structured CloudEvent its data (data_base64
	// decoded); for a value in the Schema Registry wire format, the JSON
	// Config.Decoder made of it, or the value as it is without one.
	Payload []byte
	// Value is the record value as it was read.
	Value []byte
	// CloudEvent is the record's CloudEvents context; nil when it is not a
	// CloudEvent.
	CloudEvent *CloudEvent
	// SchemaID is the Schema Registry id of the schema Config.Decoder
	// decoded the value with; 0 when it decoded nothing.
	SchemaID int
	Topic    string
	// Partition and Offset locate the record.
	Partition int32
	Offset    int64
	Timestamp time.Time // the PostgreSQL commit time, as the relay sets it
	// Attempt is 1 on the first delivery to the handler, then 2, 3, ... while
	// it is retried after errors in this process.
	Attempt int
}

// SchemaVersion is the schema_version header as an integer; 0 when the
// record has none. A header that is not a non-negative integer is an
// error naming it.
func (m *Message) SchemaVersion() (int, error) {
	s, ok := m.Headers[HeaderSchemaVersion]
	if !ok {
		return 0, nil
	}
	v, err := strconv.Atoi(s)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("event %s: header %s=%q is not a non-negative integer", m.EventID, HeaderSchemaVersion, s)
	}
	return v, nil
}

// NewMessage builds the Message of a consumed record: ParseMessage
// without its error (a record that is no valid CloudEvent is then what
// its headers give, with its value as Payload).
func NewMessage(r *sarama.ConsumerMessage) *Message {
	m, _ := ParseMessage(r)
	return m
}

// Handler applies one event inside tx, the transaction that also records
// its event_id. It must do its database work through tx and must not
// commit or roll it back. A returned error rolls back everything and the
// record is retried (Config.Retry, Config.MaxAttempts). It is called from
// the goroutine of the record's partition: handlers of different
// partitions run concurrently.
type Handler func(ctx context.Context, tx pgx.Tx, m *Message) error

// ErrNoEventID is the error of a record without an event_id header: it
// cannot be deduplicated. Such a record never reaches the handler; it is
// a permanent failure (see Config.MaxAttempts and Config.OnGiveUp).
var ErrNoEventID = errors.New("record has no " + HeaderEventID + " header, so it cannot be deduplicated; was it published by outbox-relay?")

// FailedError is the error Run returns when a record could not be handled
// and no OnGiveUp hook took it: the consumer stops with the record's
// offset not marked, so it is delivered again after a restart.
type FailedError struct {
	Topic     string
	Partition int32
	Offset    int64
	EventID   string
	Attempts  int
	Err       error // the handler's last error, or ErrNoEventID
}

func (e *FailedError) Error() string {
	return fmt.Sprintf("inbox: record %s/%d@%d (event_id %q) failed %d time(s), not marked: %v; fix the cause and restart (it is delivered again), or set inbox.Config.OnGiveUp to park such records",
		e.Topic, e.Partition, e.Offset, e.EventID, e.Attempts, e.Err)
}

func (e *FailedError) Unwrap() error { return e.Err }
