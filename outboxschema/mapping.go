package outboxschema

import (
	"errors"
	"fmt"
	"strings"
)

// Mapping says which columns of one outbox table feed which part of an
// event (config keys columns.*; their meanings follow Debezium's outbox
// EventRouter options, docs/migrating-from-debezium.md). It is resolved
// against each Relation message once, never per row.
type Mapping struct {
	Table Table
	// ID is the event id column (table.field.event.id): BIGINT (also
	// SMALLINT, INTEGER), UUID or TEXT (VARCHAR).
	ID string
	// Key is the Kafka record key column (table.field.event.key): any
	// type, its text.
	Key string
	// Type is the event type column (table.field.event.type); "" for none.
	Type string
	// Payload is the record value column (table.field.event.payload):
	// JSONB, JSON, TEXT (VARCHAR) or BYTEA, published byte for byte.
	Payload string
	// RouteBy is the column whose value fills the topic template's
	// {aggregate_type} (route.by.field); "" for none.
	RouteBy string
	// Headers is an optional JSON object column whose top-level keys become
	// record headers; "" for none.
	Headers string
	// Additional columns become record headers, in this order
	// (table.fields.additional.placement with placement header).
	Additional []Placement
	// TombstoneOnNull publishes a row whose payload is NULL as a record with
	// a null value (what Debezium's EventRouter does), instead of treating
	// it as a poison row.
	TombstoneOnNull bool
	// EventID and ReplayOf are the identity columns of the relay's own
	// table (migration 0006), "" for none; set by DefaultMapping only, so
	// a mapped table's event_id stays its id column. A uuid EventID that is
	// not NULL is the event_id instead of the id; ReplayOf (bigint) is the
	// id of the dead-lettered row a dlq replay copy stands for. Either may
	// be missing from the table (not migrated yet): then it is not read.
	EventID, ReplayOf string
}

// Placement is one extra column placed as a record header.
type Placement struct {
	Column string // the column
	Header string // the header key
}

// Column mapping keys, for errors.
const (
	KeyColumnsID         = "columns.id"
	KeyColumnsKey        = "columns.key"
	KeyColumnsType       = "columns.type"
	KeyColumnsPayload    = "columns.payload"
	KeyColumnsRouteBy    = "columns.route_by"
	KeyColumnsHeaders    = "columns.headers"
	KeyColumnsAdditional = "columns.additional"
)

// DefaultMapping is the relay's own table (migrations/): id, aggregate_id,
// event_type, payload, aggregate_type, headers, and the identity columns
// event_id and dlq_replay_of.
func DefaultMapping(t Table) Mapping {
	return Mapping{Table: t, ID: ColID, Key: ColAggregateID, Type: ColEventType, Payload: ColPayload,
		RouteBy: ColAggregateType, Headers: ColHeaders, EventID: ColEventID, ReplayOf: ColDLQReplayOf}
}

// DebeziumMapping is Debezium's recommended outbox table (id UUID,
// aggregatetype, aggregateid, type, payload JSONB) read as the EventRouter
// reads it by default.
func DebeziumMapping(t Table) Mapping {
	return Mapping{Table: t, ID: "id", Key: "aggregateid", Type: "type", Payload: "payload",
		RouteBy: "aggregatetype", TombstoneOnNull: true}
}

// Own reports whether m reads the relay's own table exactly (DefaultMapping):
// only then are the row marks of dead letters (the bookkeeping columns),
// retention (created_at, published_at) and replay available. The identity
// columns (EventID, ReplayOf) are not compared: they follow from the rest.
func (m Mapping) Own() bool {
	d := DefaultMapping(m.Table)
	return m.ID == d.ID && m.Key == d.Key && m.Type == d.Type && m.Payload == d.Payload &&
		m.RouteBy == d.RouteBy && m.Headers == d.Headers && len(m.Additional) == 0 && !m.TombstoneOnNull
}

// ParsePlacements parses columns.additional entries in Debezium's
// table.fields.additional.placement syntax, column:header[:name]. The
// envelope placement is refused: the relay publishes the payload as the
// value byte for byte, it never wraps it; partition is refused because the
// partition is always chosen by the key (per-key order).
func ParsePlacements(key string, entries []string) ([]Placement, error) {
	var out []Placement
	var errs []error
	for _, e := range entries {
		parts := strings.Split(strings.TrimSpace(e), ":")
		if len(parts) < 2 || len(parts) > 3 || parts[0] == "" {
			errs = append(errs, fmt.Errorf("%s: %q is not column:header or column:header:name (e.g. type:header:eventType)", key, e))
			continue
		}
		switch strings.ToLower(parts[1]) {
		case "header":
		case "envelope":
			errs = append(errs, fmt.Errorf("%s: %q: placement envelope is not supported: the relay publishes the payload column as the record value byte for byte and never wraps it in an envelope; place the column as a header (%s:header) or add it to the payload", key, e, parts[0]))
			continue
		case "partition":
			errs = append(errs, fmt.Errorf("%s: %q: placement partition is not supported: the partition is always chosen from the record key (columns.key), which is what keeps per-key order; set columns.key to the column instead", key, e))
			continue
		default:
			errs = append(errs, fmt.Errorf("%s: %q: unknown placement %q; use header (e.g. %s:header)", key, e, parts[1], parts[0]))
			continue
		}
		p := Placement{Column: parts[0], Header: parts[0]}
		if len(parts) == 3 {
			if parts[2] == "" {
				errs = append(errs, fmt.Errorf("%s: %q has an empty header name", key, e))
				continue
			}
			p.Header = parts[2]
		}
		out = append(out, p)
	}
	return out, errors.Join(errs...)
}

// Validate checks m without a database: required columns set, names valid,
// placement header names good (CheckHeaderName) and not reserved (reserved reports the header keys the
// relay sets itself in the chosen record format). prefix names the table's
// keys in errors ("" for the top-level columns.*, "tables[1]." for a list
// item).
func (m Mapping) Validate(prefix string, reserved func(string) bool) error {
	var errs []error
	check := func(key, col string, required bool) {
		if col == "" {
			if required {
				errs = append(errs, fmt.Errorf("%s%s: is empty; name the column of %s", prefix, key, m.Table))
			}
			return
		}
		if r := CheckName(col); r != "" {
			errs = append(errs, fmt.Errorf("%s%s: %q %s", prefix, key, col, r))
		}
	}
	check(KeyColumnsID, m.ID, true)
	check(KeyColumnsKey, m.Key, true)
	check(KeyColumnsPayload, m.Payload, true)
	check(KeyColumnsType, m.Type, false)
	check(KeyColumnsRouteBy, m.RouteBy, false)
	check(KeyColumnsHeaders, m.Headers, false)
	seen := map[string]bool{}
	for _, p := range m.Additional {
		check(KeyColumnsAdditional, p.Column, true)
		lower := strings.ToLower(p.Header)
		var he *HeaderNameError
		switch {
		case errors.As(CheckHeaderName(p.Header), &he) && he.Problem != "":
			errs = append(errs, fmt.Errorf("%s%s: %v (column %s): the relay refuses such a name in a row's headers too (docs/outbox-table.md#headers); give the column another name",
				prefix, KeyColumnsAdditional, he, p.Column))
		case reserved != nil && reserved(p.Header):
			errs = append(errs, fmt.Errorf("%s%s: header name %q (column %s) is reserved: the relay sets it itself, so a consumer could not tell the two apart; give the column another name (%s:header:x-%s)",
				prefix, KeyColumnsAdditional, p.Header, p.Column, p.Column, p.Header))
		case seen[lower]:
			errs = append(errs, fmt.Errorf("%s%s: header name %q is placed twice (names compared ignoring case); give one another name", prefix, KeyColumnsAdditional, p.Header))
		}
		seen[lower] = true
	}
	return errors.Join(errs...)
}

// Column types the mapping accepts, by pg_type.typname of the column (a
// domain is checked by its base type).
var (
	IDTypes      = []string{"int8", "int4", "int2", "uuid", "text", "varchar"}
	PayloadTypes = []string{"jsonb", "json", "text", "varchar", "bytea"}
	HeadersTypes = []string{"jsonb", "json", "text", "varchar"}
)

// CheckTypes checks m against the table's columns: name -> pg_type.typname
// (of the base type for a domain). Every problem is named by its key, the
// column and its type, with the fix.
func (m Mapping) CheckTypes(prefix string, types map[string]string) error {
	var errs []error
	col := func(key, c string, allowed []string, what string) {
		if c == "" {
			return
		}
		typ, ok := types[c]
		if !ok {
			errs = append(errs, fmt.Errorf("%s%s: column %q does not exist in %s: set %s%s to one of its columns, or add the column", prefix, key, c, m.Table, prefix, key))
			return
		}
		if allowed == nil {
			return
		}
		for _, a := range allowed {
			if typ == a {
				return
			}
		}
		errs = append(errs, fmt.Errorf("%s%s: column %q of %s has type %s, but %s must be %s: point %s%s at another column, or ALTER TABLE %s ALTER COLUMN %s TYPE %s",
			prefix, key, c, m.Table, typ, what, strings.Join(allowed, ", "), prefix, key, m.Table.Quoted(), QuoteIdent(c), allowed[0]))
	}
	col(KeyColumnsID, m.ID, IDTypes, "the event id")
	col(KeyColumnsKey, m.Key, nil, "")
	col(KeyColumnsType, m.Type, nil, "")
	col(KeyColumnsPayload, m.Payload, PayloadTypes, "the payload")
	col(KeyColumnsRouteBy, m.RouteBy, nil, "")
	col(KeyColumnsHeaders, m.Headers, HeadersTypes, "the headers column")
	for _, p := range m.Additional {
		col(KeyColumnsAdditional, p.Column, nil, "")
	}
	return errors.Join(errs...)
}
