// Package outboxschema owns the names of the relay's database objects: the
// outbox table named by postgres.table and its one parser, the outbox columns
// the relay reads and writes, the column mappings of outbox tables it reads
// but does not own (mapping.go), the helper tables migrate creates beside
// the outbox table, and the record header keys reserved for the relay with
// the one rule for header names (headers.go: CheckHeaderName). The SQL in migrations/*.sql refers to the same objects
// through placeholders filled from here.
//
// It does no I/O and imports only the standard library, so that the pure
// decoder can use it as well as the packages that talk to PostgreSQL.
package outboxschema

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// ConfigKey is the configuration key that names the outbox table; parse
// errors name it so an operator knows what to fix.
const ConfigKey = "postgres.table"

// DefaultSchema is the schema of a postgres.table without one.
const DefaultSchema = "public"

// MaxIdentifierLen is PostgreSQL's identifier limit (NAMEDATALEN-1 bytes).
// Longer names are silently truncated by the server, so the relay would look
// for a table that is not the one created: refuse them instead.
const MaxIdentifierLen = 63

// Helper tables, in the outbox table's schema (see Table.Sibling).
const (
	// SlotRegistry remembers which slots the relay created (migration 0002).
	SlotRegistry = "outbox_relay_slots"
	// LeaseTable holds the leader election lease rows (migration 0004).
	LeaseTable = "outbox_relay_leader"
	// DeliveryTable holds each slot's delivery horizon and retention state
	// (migration 0005, package retention).
	DeliveryTable = "outbox_relay_delivery"
	// MigrationHistory records the applied migrations, per outbox table.
	MigrationHistory = "outbox_relay_migrations"
)

// Columns of the relay's own outbox table (DefaultMapping). Their types are
// not checked at start (pgoutput sends every value as text and the decoder
// validates the text); a mapped table's are, by Mapping.CheckTypes.
const (
	ColID            = "id"
	ColAggregateType = "aggregate_type"
	ColAggregateID   = "aggregate_id"
	ColEventType     = "event_type"
	ColPayload       = "payload"
	ColHeaders       = "headers" // optional: a table without it has no headers

	ColAttemptCount   = "attempt_count"
	ColLastError      = "last_error"
	ColDeadLetteredAt = "dead_lettered_at"
	ColDLQResolvedAt  = "dlq_resolved_at"
	ColCreatedAt      = "created_at"
	ColPublishedAt    = "published_at" // set by replay (after the ack) or an earlier publisher

	// The identity columns (migration 0006): optional, the relay reads
	// them when present.
	ColEventID     = "event_id"      // uuid, filled by the database: the event_id header when not NULL
	ColDLQReplayOf = "dlq_replay_of" // bigint: the dead-lettered row a dlq replay copy stands for
)

// RequiredColumns are the columns of the relay's own outbox table that it
// reads; start-up (package replication), preflight and replay refuse a
// table without them. The decoder does not use this list: it resolves a
// Mapping. Read only.
var RequiredColumns = []string{ColID, ColAggregateType, ColAggregateID, ColEventType, ColPayload}

// BookkeepingColumns are the columns the relay writes when an event is
// dead-lettered or halts it (migration 0003). Read only.
var BookkeepingColumns = []string{ColAttemptCount, ColLastError, ColDeadLetteredAt, ColDLQResolvedAt}

// Table is a table name as stored in the catalog: case-sensitive, unquoted.
type Table struct {
	Schema, Name string
}

// TableError is why a postgres.table value was refused.
type TableError struct {
	Input  string // the value as configured
	Reason string // what is wrong and how to fix it
}

func (e *TableError) Error() string {
	return fmt.Sprintf("%s %q: %s", ConfigKey, e.Input, e.Reason)
}

// ParseTable parses postgres.table: "schema.name", or "name" in schema
// public. Each part is a plain identifier (a letter or underscore, then
// letters, digits, underscores or $; at most 63 bytes) used verbatim, so
// upper case is kept: "Events.Outbox" is the table created as
// "Events"."Outbox". Quoted identifiers are not accepted, which keeps the
// name the same in the config, the catalog and pgoutput's messages.
func ParseTable(s string) (Table, error) {
	bad := func(format string, a ...any) (Table, error) {
		return Table{}, &TableError{Input: s, Reason: fmt.Sprintf(format, a...)}
	}
	const want = "use schema.name with plain identifiers, e.g. public.outbox"
	if s == "" {
		return bad("is empty; %s", want)
	}
	if strings.ContainsRune(s, '"') {
		return bad("quoted identifiers are not supported; %s (upper case is kept as written)", want)
	}
	t := Table{Schema: DefaultSchema, Name: s}
	if sch, name, ok := strings.Cut(s, "."); ok {
		if strings.Contains(name, ".") {
			return bad("has more than one '.'; %s", want)
		}
		t = Table{Schema: sch, Name: name}
	}
	for _, p := range []struct{ what, v string }{{"schema", t.Schema}, {"table", t.Name}} {
		if reason := checkIdent(p.v); reason != "" {
			return bad("%s name %s; %s", p.what, reason, want)
		}
	}
	return t, nil
}

// checkIdent returns why v is not a plain identifier, or "".
func checkIdent(v string) string {
	if v == "" {
		return "is empty"
	}
	if len(v) > MaxIdentifierLen {
		return fmt.Sprintf("%q is %d bytes, over PostgreSQL's limit of %d (NAMEDATALEN)", v, len(v), MaxIdentifierLen)
	}
	for i, c := range v {
		switch {
		case c == '_', 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case c == '$' || '0' <= c && c <= '9':
			if i == 0 {
				return fmt.Sprintf("%q must start with a letter or underscore", v)
			}
		default:
			return fmt.Sprintf("%q has %q; only ASCII letters, digits, underscores and $ are allowed", v, c)
		}
	}
	return ""
}

// String is "schema.name" as in the catalog, for messages and as the key of
// the migration history.
func (t Table) String() string { return t.Schema + "." + t.Name }

// Quoted is the name quoted for SQL: "schema"."name".
func (t Table) Quoted() string { return QuoteIdent(t.Schema, t.Name) }

// Sibling is the table called name in t's schema, where the helper tables
// live.
func (t Table) Sibling(name string) Table { return Table{Schema: t.Schema, Name: name} }

// MarkGrant is the GRANT that lets role write the dead-letter and halt
// marks (an UPDATE ... WHERE id = $1 of the bookkeeping columns) on t, with
// the column-level minimum as the alternative.
func (t Table) MarkGrant(role string) string {
	q := t.Quoted()
	r := QuoteIdent(role)
	return fmt.Sprintf("GRANT SELECT, UPDATE ON %s TO %s (or at least GRANT SELECT (%s, %s), UPDATE (%s, %s, %s) ON %s TO %s)",
		q, r, ColID, ColDeadLetteredAt, ColAttemptCount, ColLastError, ColDeadLetteredAt, q, r)
}

// QuoteIdent quotes each part as a PostgreSQL identifier and joins them with
// dots, like pgx.Identifier.Sanitize: doubled quotes, NUL bytes dropped.
func QuoteIdent(parts ...string) string {
	q := make([]string, len(parts))
	for i, p := range parts {
		p = strings.ReplaceAll(p, "\x00", "")
		q[i] = `"` + strings.ReplaceAll(p, `"`, `""`) + `"`
	}
	return strings.Join(q, ".")
}

// QuoteLiteral quotes s as a standard SQL string literal: single quotes,
// each ' doubled, NUL bytes dropped. Backslashes are plain characters in it
// (standard_conforming_strings, on by default since PostgreSQL 9.1, and the
// replication command grammar).
func QuoteLiteral(s string) string {
	s = strings.ReplaceAll(s, "\x00", "")
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// PublicationNamesOption is pgoutput's publication_names option as
// START_REPLICATION takes it: publication_names '"a","b"'. pgoutput splits
// the value with SplitIdentifierString, which lower-cases unquoted names and
// splits at commas, so each name is written as a quoted identifier (the
// catalog's exact name, as CREATE PUBLICATION got it from QuoteIdent), and
// the list is then a string literal (QuoteLiteral).
func PublicationNamesOption(names ...string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = QuoteIdent(n)
	}
	return "publication_names " + QuoteLiteral(strings.Join(q, ","))
}

// CheckName returns why s cannot be the name of a database object that the
// relay quotes with QuoteIdent (a publication), or "": any non-empty UTF-8
// text without NUL bytes of at most MaxIdentifierLen bytes. Case, spaces and
// quotes are kept exactly (the name is always quoted).
func CheckName(s string) string {
	switch {
	case s == "":
		return "is empty"
	case len(s) > MaxIdentifierLen:
		return fmt.Sprintf("is %d bytes, over PostgreSQL's limit of %d (NAMEDATALEN); PostgreSQL would truncate it", len(s), MaxIdentifierLen)
	case strings.ContainsRune(s, 0):
		return "contains a NUL byte, which PostgreSQL names cannot hold"
	case !utf8.ValidString(s):
		return "is not valid UTF-8"
	}
	return ""
}

// CheckSlotName returns why s is not a valid replication slot name, or "".
// PostgreSQL itself (ReplicationSlotValidateName) allows only lower-case
// letters, digits and underscores, 1 to 63 bytes.
func CheckSlotName(s string) string {
	if s == "" {
		return "is empty"
	}
	if len(s) > MaxIdentifierLen {
		return fmt.Sprintf("is %d bytes, over PostgreSQL's limit of %d for slot names", len(s), MaxIdentifierLen)
	}
	for _, c := range s {
		if !(c == '_' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9') {
			return fmt.Sprintf("has %q: PostgreSQL allows only lower-case letters, digits and underscores in slot names", c)
		}
	}
	return ""
}
