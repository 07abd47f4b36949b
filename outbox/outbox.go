// Package outbox writes events into the outbox table in the caller's
// transaction: the producer half of the transactional outbox pattern that
// outbox-relay publishes to Kafka.
//
// Write the business change and its events in ONE transaction on ONE
// connection. Writing the events through another pool, connection or
// database is the dual write the pattern exists to avoid: a crash between
// the two commits loses an event or publishes one for a change that never
// happened.
//
//	tx, err := pool.Begin(ctx) // pgxpool, pgx.Conn, or database/sql's db.BeginTx
//	...
//	_, err = tx.Exec(ctx, "UPDATE orders SET status = 'paid' WHERE id = $1", id)
//	err = outbox.Write(ctx, tx, outbox.Event{
//		AggregateType: "order", AggregateID: id, EventType: "order.paid",
//		SchemaVersion: 2, Payload: OrderPaid{ID: id, Amount: amount},
//	})
//	err = tx.Commit(ctx)
//
// Each event becomes one row; the relay publishes it to
// outbox.event.<AggregateType> with the key AggregateID and the headers
// event_id (consumers deduplicate on it), event_type, aggregate_type,
// aggregate_id, pg_lsn, outbox_id (the row id), plus one header per entry
// of the row's headers column, which Write fills from Event.Headers,
// Event.SchemaVersion (schema_version) and the W3C trace context of ctx
// (traceparent, tracestate; see WithTraceparent and TraceparentFrom).
//
// event_id is the row's event_id column, a random UUID the database fills
// in (migration 0006: DEFAULT gen_random_uuid()), so it never repeats
// after a failover or a restore the way a row id can; Write does not name
// the column, so on a table not migrated yet it writes the same rows, and
// the relay publishes them under their id. Write does not return the ids:
// read them back in the same transaction (INSERT ... RETURNING event_id
// with your own statement) if the caller needs them.
//
// WriteMessage writes the same events without a table, as transactional
// logical decoding messages that the relay publishes when its
// messages.prefix matches (PostgreSQL 14+): no rows, no bloat, no
// retention, but the replication slot is then the events' only copy
// (docs/message-outbox.md).
package outbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/outboxschema"
)

// DefaultTable is the outbox table of the package-level Write and of a
// Writer without WithTable: the relay's default postgres.table.
const DefaultTable = "public.outbox"

// Header keys Write sets from an Event's fields and from the context.
const (
	HeaderSchemaVersion = "schema_version"
	HeaderTraceparent   = "traceparent"
	HeaderTracestate    = "tracestate"
)

// Event is one event to write. AggregateType, AggregateID and EventType may
// not be empty.
type Event struct {
	// AggregateType names the topic: outbox.event.<AggregateType> with the
	// relay's default kafka.topic_template.
	AggregateType string
	// AggregateID is the Kafka key: the events of one aggregate go to one
	// partition, in commit order.
	AggregateID string
	// EventType is the event_type header, e.g. "order.created". A breaking
	// change of the payload is a new EventType ("order.created.v2").
	EventType string
	// Payload is the record value. json.RawMessage and []byte are taken as
	// JSON text and must be valid JSON; any other value (a struct, a map, a
	// string, ...) is marshalled with encoding/json. nil is refused.
	Payload any
	// Headers become Kafka record headers. Their names follow the relay's
	// one rule (outboxschema.CheckHeaderName, docs/outbox-table.md#headers):
	// a name that is empty, not UTF-8, has whitespace at either end or
	// holds a control or invisible character is refused, and so are the
	// relay's own names (outboxschema.RelayHeaders,
	// outboxschema.MarkHeaders and any "dlq." key, in any letter case):
	// rename such a key, e.g. "x-event_id". The error wraps the
	// *outboxschema.HeaderNameError.
	Headers map[string]string
	// SchemaVersion, when above 0, is written as the schema_version header
	// (decimal), which consumers dispatch on (inbox.Router). Setting both
	// SchemaVersion and Headers["schema_version"] is an error.
	SchemaVersion int
}

// Writer writes events into one outbox table. The zero Writer is not
// usable; make one with NewWriter. A Writer is immutable: any goroutine may
// use it concurrently (each with its own transaction).
type Writer struct {
	table  outboxschema.Table
	quoted string
	copyAt int // batches of at least this many events go through COPY on pgx; 0 = never
}

// Option configures a Writer.
type Option func(*Writer) error

// WithTable sets the outbox table: "schema.name" or "name" (schema public),
// plain identifiers, exactly as the relay's postgres.table takes it.
func WithTable(name string) Option {
	return func(w *Writer) error {
		t, err := outboxschema.ParseTable(name)
		if err != nil {
			var te *outboxschema.TableError
			if errors.As(err, &te) {
				return fmt.Errorf("outbox: table %q: %s", name, te.Reason)
			}
			return fmt.Errorf("outbox: table: %w", err)
		}
		w.table = t
		return nil
	}
}

// CopyThreshold is the smallest batch that Write sends with COPY on a pgx
// transaction; smaller batches are multi-row INSERTs (database/sql
// transactions always use INSERT). Measured on PostgreSQL 15
// (BenchmarkWrite in outbox/bench_e2e_test.go): below about this size the
// INSERT is faster, COPY's extra round trip to describe the table costing
// more than the per-row parameters it saves. Per event, committed, on a
// shared 2-core machine (2 runs): 1 event 247-291 us INSERT vs 309-315 us
// COPY; 10: 43-44 vs 47-48; 50: 21-22 vs 20-22; 100: 15-18 vs 13-14; 1000:
// 16-22 vs 13-14; 10 000: 14-16 vs 9-10.
const CopyThreshold = 100

// withCopyAt sets the COPY threshold (0 = never COPY); for the benchmark.
func withCopyAt(n int) Option {
	return func(w *Writer) error { w.copyAt = n; return nil }
}

// NewWriter returns a Writer for DefaultTable unless WithTable says
// otherwise. It does no I/O.
func NewWriter(opts ...Option) (*Writer, error) {
	w := &Writer{copyAt: CopyThreshold}
	if err := WithTable(DefaultTable)(w); err != nil {
		return nil, err
	}
	for _, o := range opts {
		if err := o(w); err != nil {
			return nil, err
		}
	}
	w.quoted = w.table.Quoted()
	return w, nil
}

// Table is the outbox table the Writer writes, as "schema.name".
func (w *Writer) Table() string { return w.table.String() }

var defaultWriter, _ = NewWriter()

// Write writes events into DefaultTable ("public.outbox") in tx; see
// Writer.Write.
func Write(ctx context.Context, tx any, events ...Event) error {
	return defaultWriter.Write(ctx, tx, events...)
}

// Write inserts events, in order, in tx: a pgx.Tx (from pgx.Conn.Begin or
// pgxpool.Pool.Begin) or a *sql.Tx. Anything else, a pool or a connection
// outside a transaction included, is refused: the events must commit or
// roll back with the business change. Nothing is written unless every
// event is valid; an invalid one is reported by its index in events and
// the field at fault. Write does not commit or roll back; after an error
// the caller rolls back.
//
// Events go in one round trip per statement: multi-row INSERTs of at most
// 10 000 rows each, or, on pgx for batches of CopyThreshold events or more,
// one COPY. Write blocks on the database; it uses tx, so it must not run
// concurrently with another statement on the same tx.
func (w *Writer) Write(ctx context.Context, tx any, events ...Event) error {
	rows, err := encode(ctx, events)
	if err != nil {
		return err
	}
	switch tx := tx.(type) {
	case pgx.Tx:
		if len(rows) == 0 {
			return nil
		}
		if w.copyAt > 0 && len(rows) >= w.copyAt {
			return w.copyPgx(ctx, tx, rows)
		}
		return w.insert(rows, func(q string, args []any) error {
			_, err := tx.Exec(ctx, q, args...)
			return err
		})
	case *sql.Tx:
		if tx == nil {
			break
		}
		return w.insert(rows, func(q string, args []any) error {
			_, err := tx.ExecContext(ctx, q, args...)
			return err
		})
	}
	return fmt.Errorf("outbox: write: tx is %T; pass the pgx.Tx or *sql.Tx of the business change (not a pool or a connection: the events must commit with it)", tx)
}

// row is one encoded event.
type row struct {
	aggregateType, aggregateID, eventType string
	payload, headers                      []byte // headers nil = SQL NULL
}

// columns are the outbox columns Write fills, in row order.
var columns = []string{outboxschema.ColAggregateType, outboxschema.ColAggregateID, outboxschema.ColEventType, outboxschema.ColPayload, outboxschema.ColHeaders}

const (
	columnsPerRow = 5
	// maxRowsPerInsert keeps a statement's parameters (5 per row) under
	// PostgreSQL's limit of 65535.
	maxRowsPerInsert = 10000
)

// insert runs the rows as multi-row INSERTs of at most maxRowsPerInsert rows.
func (w *Writer) insert(rows []row, exec func(q string, args []any) error) error {
	for lo := 0; lo < len(rows); lo += maxRowsPerInsert {
		chunk := rows[lo:min(lo+maxRowsPerInsert, len(rows))]
		args := make([]any, 0, len(chunk)*columnsPerRow)
		for _, r := range chunk {
			args = append(args, r.aggregateType, r.aggregateID, r.eventType, string(r.payload), nullable(r.headers))
		}
		if err := exec(insertSQL(w.quoted, len(chunk)), args); err != nil {
			return fmt.Errorf("outbox: insert events %d..%d into %s: %w", lo, lo+len(chunk)-1, w.table, err)
		}
	}
	return nil
}

// insertSQL is INSERT INTO table (columns) VALUES ($1,...,$5),... for n rows.
// Payload and headers are sent as text and cast, so database/sql drivers
// and pgx alike send them as they are.
func insertSQL(table string, n int) string {
	var b strings.Builder
	b.Grow(80 + n*48)
	b.WriteString("INSERT INTO ")
	b.WriteString(table)
	b.WriteString(" (")
	for i, c := range columns {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(outboxschema.QuoteIdent(c))
	}
	b.WriteString(") VALUES ")
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		p := i * columnsPerRow
		fmt.Fprintf(&b, "($%d,$%d,$%d,$%d::jsonb,$%d::jsonb)", p+1, p+2, p+3, p+4, p+5)
	}
	return b.String()
}

func nullable(b []byte) any {
	if b == nil {
		return nil
	}
	return string(b)
}

// copyPgx sends the rows with one COPY FROM STDIN.
func (w *Writer) copyPgx(ctx context.Context, tx pgx.Tx, rows []row) error {
	src := pgx.CopyFromSlice(len(rows), func(i int) ([]any, error) {
		r := rows[i]
		var h any
		if r.headers != nil {
			h = json.RawMessage(r.headers)
		}
		return []any{r.aggregateType, r.aggregateID, r.eventType, json.RawMessage(r.payload), h}, nil
	})
	n, err := tx.CopyFrom(ctx, pgx.Identifier{w.table.Schema, w.table.Name}, columns, src)
	if err != nil {
		return fmt.Errorf("outbox: copy %d events into %s: %w", len(rows), w.table, err)
	}
	if n != int64(len(rows)) {
		return fmt.Errorf("outbox: copy into %s wrote %d of %d events", w.table, n, len(rows))
	}
	return nil
}

// encode validates and encodes every event; the first bad one is an error
// naming its index and field.
func encode(ctx context.Context, events []Event) ([]row, error) {
	tp, ts := traceContext(ctx)
	rows := make([]row, len(events))
	for i, e := range events {
		bad := func(format string, a ...any) error {
			return fmt.Errorf("outbox: event %d: %s", i, fmt.Sprintf(format, a...))
		}
		for _, f := range []struct{ name, v string }{{"AggregateType", e.AggregateType}, {"AggregateID", e.AggregateID}, {"EventType", e.EventType}} {
			if f.v == "" {
				return nil, bad("%s is empty", f.name)
			}
		}
		payload, err := encodePayload(e.Payload)
		if err != nil {
			return nil, bad("%v", err)
		}
		if e.SchemaVersion < 0 {
			return nil, bad("SchemaVersion is %d; use 1, 2, ... (0 = no schema_version header)", e.SchemaVersion)
		}
		h := make(map[string]string, len(e.Headers)+3)
		for k, v := range e.Headers {
			// The relay's rule (outboxschema.CheckHeaderName): what it
			// would dead-letter is refused here.
			var he *outboxschema.HeaderNameError
			switch err := outboxschema.CheckHeaderName(k); {
			case errors.As(err, &he) && he.Reserved != "":
				return nil, fmt.Errorf("outbox: event %d: Headers: %w; rename it, e.g. %q", i, err, "x-"+k)
			case err != nil:
				return nil, fmt.Errorf("outbox: event %d: Headers: %w: the relay would dead-letter the event (docs/outbox-table.md#headers); rename it", i, err)
			case k == HeaderSchemaVersion && e.SchemaVersion > 0:
				return nil, bad("both SchemaVersion and Headers[%q] are set; set only SchemaVersion", HeaderSchemaVersion)
			}
			h[k] = v
		}
		if e.SchemaVersion > 0 {
			h[HeaderSchemaVersion] = strconv.Itoa(e.SchemaVersion)
		}
		if _, ok := h[HeaderTraceparent]; !ok && tp != "" {
			h[HeaderTraceparent] = tp
			if ts != "" {
				h[HeaderTracestate] = ts
			}
		}
		r := row{aggregateType: e.AggregateType, aggregateID: e.AggregateID, eventType: e.EventType, payload: payload}
		if len(h) > 0 {
			if r.headers, err = json.Marshal(h); err != nil {
				return nil, bad("Headers cannot be marshalled to JSON: %v", err)
			}
		}
		rows[i] = r
	}
	return rows, nil
}

func encodePayload(p any) ([]byte, error) {
	var raw []byte
	switch v := p.(type) {
	case nil:
		return nil, errors.New("Payload is nil; use json.RawMessage(`{}`) for an empty body")
	case json.RawMessage:
		raw = v
	case []byte:
		raw = v
	default:
		b, err := json.Marshal(v)
		if err != nil {
			return nil, fmt.Errorf("Payload cannot be marshalled to JSON: %v", err)
		}
		return b, nil
	}
	if raw == nil {
		return nil, errors.New("Payload is nil; use json.RawMessage(`{}`) for an empty body")
	}
	if !json.Valid(raw) {
		var v any
		err := json.Unmarshal(raw, &v)
		return nil, fmt.Errorf("Payload is not valid JSON (%v); pass JSON text as json.RawMessage, or a Go value to marshal", err)
	}
	return raw, nil
}
