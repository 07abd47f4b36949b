package outbox

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// WriteMessage writes events as transactional logical decoding messages in
// tx instead of outbox rows: the table-less outbox (docs/message-outbox.md).
// Each event is one pg_logical_emit_message(true, prefix, envelope) call,
// in order; the relay publishes them in commit order with the outbox rows
// of the same transaction when its messages.prefix is prefix (PostgreSQL
// 14+). Nothing is stored in a table: the messages exist only in the WAL,
// so the replication slot is the only copy until the relay publishes them.
//
// The envelope is a JSON object (decoder.Envelope* keys):
//
//	{"id": "<UUIDv7>", "aggregate_type": "...", "aggregate_id": "...",
//	 "event_type": "...", "payload": <the payload>, "headers": {...}}
//
// id is a new UUID (version 7, time-ordered) per event, never given by the
// caller: the record's event_id header, which consumers deduplicate on.
// Nothing in it derives from the WAL position or a sequence, so it does not
// repeat after a failover or a restore. (The relay refuses an envelope
// without an id as a poison event: dead-lettered, or a halt with on_poison:
// halt; it never makes one up.) The payload is
// published as written (JSON text, compacted when given as
// json.RawMessage or []byte); headers are filled as Write fills the
// headers column (Event.Headers, SchemaVersion, the trace context of ctx).
//
// tx is a pgx.Tx or a *sql.Tx, as for Write; anything else is refused.
// Nothing is written unless every event is valid. On pgx the events go in
// one round trip (a batch); on database/sql one statement each. It blocks
// on the database and must not run concurrently with another statement on
// the same tx. After an error the caller rolls back.
func WriteMessage(ctx context.Context, tx any, prefix string, events ...Event) error {
	if err := checkPrefix(prefix); err != nil {
		return err
	}
	envs, err := encodeMessages(ctx, events, time.Now())
	if err != nil {
		return err
	}
	switch tx := tx.(type) {
	case pgx.Tx:
		if len(envs) == 0 {
			return nil
		}
		b := &pgx.Batch{}
		for _, e := range envs {
			b.Queue(emitSQL, prefix, e)
		}
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return fmt.Errorf("outbox: emit %d messages with prefix %q: %w", len(envs), prefix, err)
		}
		return nil
	case *sql.Tx:
		if tx == nil {
			break
		}
		for i, e := range envs {
			if _, err := tx.ExecContext(ctx, emitSQL, prefix, e); err != nil {
				return fmt.Errorf("outbox: emit message %d with prefix %q: %w", i, prefix, err)
			}
		}
		return nil
	}
	return fmt.Errorf("outbox: write message: tx is %T; pass the pgx.Tx or *sql.Tx of the business change (not a pool or a connection: the events must commit with it)", tx)
}

// emitSQL writes one transactional message; text arguments pick the text
// overload of the function.
const emitSQL = "SELECT pg_logical_emit_message(true, $1::text, $2::text)"

// heartbeatNamespace starts the relays' own heartbeat prefixes
// (outbox-relay/<slot>), which the relay refuses as messages.prefix.
const heartbeatNamespace = "outbox-relay"

// checkPrefix refuses a prefix the relay cannot have as messages.prefix.
func checkPrefix(p string) error {
	switch {
	case p == "":
		return fmt.Errorf("outbox: message prefix is empty; use the relay's messages.prefix, e.g. orders-outbox")
	case p == heartbeatNamespace || strings.HasPrefix(p, heartbeatNamespace+"/"):
		return fmt.Errorf("outbox: message prefix %q is the relays' heartbeat namespace (outbox-relay/<slot>); use the relay's messages.prefix, e.g. orders-outbox", p)
	case !utf8.ValidString(p) || strings.ContainsFunc(p, func(r rune) bool { return r < ' ' || r == 0x7f }):
		return fmt.Errorf("outbox: message prefix %q must be printable UTF-8 text without control characters", p)
	}
	return nil
}

// envelope is a message event as the relay reads it (decoder.Envelope*).
type envelope struct {
	ID            string          `json:"id"`
	AggregateType string          `json:"aggregate_type"`
	AggregateID   string          `json:"aggregate_id"`
	EventType     string          `json:"event_type"`
	Payload       json.RawMessage `json:"payload"`
	Headers       json.RawMessage `json:"headers,omitempty"`
}

// encodeMessages validates events as Write does and returns their
// envelopes, each with a new id.
func encodeMessages(ctx context.Context, events []Event, now time.Time) ([]string, error) {
	rows, err := encode(ctx, events)
	if err != nil {
		return nil, err
	}
	out := make([]string, len(rows))
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // the payload's text stays as written
	for i, r := range rows {
		id, err := newUUIDv7(now)
		if err != nil {
			return nil, fmt.Errorf("outbox: event %d: cannot make its id: %w", i, err)
		}
		buf.Reset()
		if err := enc.Encode(envelope{ID: id, AggregateType: r.aggregateType, AggregateID: r.aggregateID,
			EventType: r.eventType, Payload: r.payload, Headers: r.headers}); err != nil {
			return nil, fmt.Errorf("outbox: event %d: cannot encode its envelope: %w", i, err)
		}
		out[i] = strings.TrimSuffix(buf.String(), "\n")
	}
	return out, nil
}

// newUUIDv7 returns a random UUID of version 7 (RFC 9562): the Unix time
// in milliseconds, then random bits, so ids sort by creation time.
func newUUIDv7(now time.Time) (string, error) {
	var u [16]byte
	if _, err := rand.Read(u[6:]); err != nil {
		return "", err
	}
	ms := uint64(now.UnixMilli())
	for i := 0; i < 6; i++ {
		u[i] = byte(ms >> (40 - 8*i))
	}
	u[6] = u[6]&0x0f | 0x70 // version 7
	u[8] = u[8]&0x3f | 0x80 // variant RFC 9562
	var s [36]byte
	hex.Encode(s[0:8], u[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], u[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], u[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], u[8:10])
	s[23] = '-'
	hex.Encode(s[24:], u[10:])
	return string(s[:]), nil
}
