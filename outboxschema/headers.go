package outboxschema

import "strings"

// Record header keys the relay sets on every event record, and the prefix
// of the keys it adds to a dead letter. A row's headers column may use none
// of them (ReservedHeader): a consumer reading the last header of a name, or
// mapping headers to a map, would otherwise take the row's forged value for
// the relay's.
const (
	HeaderEventID       = "event_id"       // the dedup key: outbox.event_id (a UUID), else outbox.id
	HeaderEventType     = "event_type"     // outbox.event_type
	HeaderAggregateType = "aggregate_type" // outbox.aggregate_type
	HeaderAggregateID   = "aggregate_id"   // outbox.aggregate_id, also the record key
	HeaderLSN           = "pg_lsn"         // the transaction's commit LSN
	// HeaderOutboxID is the row's integer id on every record of a row
	// whose id is an integer: where the row is, not what the event is
	// (a new history or dlq replay's copy has another).
	HeaderOutboxID = "outbox_id"
	// HeaderReplayedFrom marks a record republished from elsewhere than the
	// WAL stream of its first insert: "dlq" on the copy `outbox-relay dlq
	// replay` inserted (its event_id is the dead-lettered row's).
	HeaderReplayedFrom = "outbox_replayed_from"
	// HeaderReplay marks every record `outbox-relay replay` publishes: the
	// replay's start time, RFC 3339 UTC, the same for the whole run.
	HeaderReplay = "outbox_replay"
	// DeadLetterPrefix starts every header key the relay adds to a dead
	// letter (dlq.reason, dlq.error, ...).
	DeadLetterPrefix = "dlq."
)

// RelayHeaders are the keys the relay sets on every record, in the order it
// sets them. Read only.
var RelayHeaders = []string{HeaderEventID, HeaderEventType, HeaderAggregateType, HeaderAggregateID, HeaderLSN}

// MarkHeaders are the keys the relay sets on some records only, after
// RelayHeaders and before the row's own, in this order. Read only.
var MarkHeaders = []string{HeaderOutboxID, HeaderReplayedFrom, HeaderReplay}

// ReservedHeader reports whether key may not be a top-level key of a row's
// headers column: one of RelayHeaders or MarkHeaders, or any key starting with
// DeadLetterPrefix. Keys are compared ignoring letter case (Unicode simple
// folding, as strings.EqualFold): Kafka header keys are case-sensitive, but
// consumers that map headers case-insensitively exist, and for them
// "Event_ID" would override event_id just the same. It does not allocate;
// any goroutine.
func ReservedHeader(key string) bool {
	if len(key) >= len(DeadLetterPrefix) && strings.EqualFold(key[:len(DeadLetterPrefix)], DeadLetterPrefix) {
		return true
	}
	for _, r := range RelayHeaders {
		if strings.EqualFold(key, r) {
			return true
		}
	}
	for _, r := range MarkHeaders {
		if strings.EqualFold(key, r) {
			return true
		}
	}
	return false
}

// ReservedNames lists the reserved keys for messages: RelayHeaders and
// MarkHeaders, comma-separated. Any goroutine.
func ReservedNames() string {
	return strings.Join(RelayHeaders, ", ") + ", " + strings.Join(MarkHeaders, ", ")
}
