package outboxschema

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

func TestParseTable(t *testing.T) {
	s63, t63 := strings.Repeat("s", 63), strings.Repeat("t", 63)
	tests := []struct {
		in     string
		want   Table
		reason string // substring of the error; "" means ok
	}{
		{"public.outbox", Table{"public", "outbox"}, ""},
		{"outbox", Table{"public", "outbox"}, ""},
		{"events.outbox_v2", Table{"events", "outbox_v2"}, ""},
		// Upper case is kept: it names the table created as "MySchema"."Outbox$1".
		{"MySchema.Outbox$1", Table{"MySchema", "Outbox$1"}, ""},
		{"OUTBOX", Table{"public", "OUTBOX"}, ""},
		{"_s._t", Table{"_s", "_t"}, ""},
		{s63 + "." + t63, Table{s63, t63}, ""},

		{"", Table{}, "is empty"},
		{".", Table{}, "schema name is empty"},
		{"public.", Table{}, "table name is empty"},
		{".outbox", Table{}, "schema name is empty"},
		{"a.b.c", Table{}, "more than one '.'"},
		{"public..outbox", Table{}, "more than one '.'"},
		{"1schema.outbox", Table{}, "must start with a letter or underscore"},
		{"public.1outbox", Table{}, "must start with a letter or underscore"},
		{"$s.t", Table{}, "must start with a letter or underscore"},
		{"public.out-box", Table{}, `has '-'`},
		{"public.out box", Table{}, `has ' '`},
		{" public.outbox", Table{}, `has ' '`},
		{"public.outbox ", Table{}, `has ' '`},
		{"public.outbox;drop", Table{}, `has ';'`},
		{"public.outbox\x00", Table{}, `has '\x00'`},
		{"public.ünbox", Table{}, `has 'ü'`},
		{`"Public".outbox`, Table{}, "quoted identifiers are not supported"},
		{`"My Schema"."Out Box"`, Table{}, "quoted identifiers are not supported"},
		{`"public.outbox"`, Table{}, "quoted identifiers are not supported"},
		{strings.Repeat("t", 64), Table{}, "64 bytes, over PostgreSQL's limit of 63"},
		{strings.Repeat("s", 64) + ".t", Table{}, "schema name"},
		{"public." + strings.Repeat("é", 32), Table{}, "64 bytes"}, // 32 characters, 64 bytes
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseTable(tt.in)
			if tt.reason == "" {
				if err != nil || got != tt.want {
					t.Fatalf("ParseTable(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
				}
				return
			}
			if err == nil {
				t.Fatalf("ParseTable(%q) = %v, want an error with %q", tt.in, got, tt.reason)
			}
			var te *TableError
			if !errors.As(err, &te) || te.Input != tt.in {
				t.Errorf("error %v is not a *TableError for the input", err)
			}
			msg := err.Error()
			for _, want := range []string{"postgres.table", fmt.Sprintf("%q", tt.in), tt.reason, "e.g. public.outbox"} {
				if !strings.Contains(msg, want) {
					t.Errorf("error %q lacks %q", msg, want)
				}
			}
			if got != (Table{}) {
				t.Errorf("ParseTable(%q) returned %v with its error", tt.in, got)
			}
		})
	}
}

// Quoting must match pgx's, which the rest of the SQL was written with.
func TestQuoteIdent(t *testing.T) {
	tests := [][]string{
		{"public", "outbox"},
		{"MySchema", "Outbox$1"},
		{"My Schema", `Out "Box"`},
		{"nul\x00byte"},
		{""},
	}
	for _, parts := range tests {
		if got, want := QuoteIdent(parts...), pgx.Identifier(parts).Sanitize(); got != want {
			t.Errorf("QuoteIdent(%q) = %s, want %s", parts, got, want)
		}
	}
	tb := Table{"Events", "outbox"}
	if got, want := tb.Quoted(), `"Events"."outbox"`; got != want {
		t.Errorf("Quoted() = %s, want %s", got, want)
	}
	if got, want := tb.String(), "Events.outbox"; got != want {
		t.Errorf("String() = %s, want %s", got, want)
	}
	if got, want := tb.Sibling(LeaseTable).Quoted(), `"Events"."outbox_relay_leader"`; got != want {
		t.Errorf("Sibling(LeaseTable).Quoted() = %s, want %s", got, want)
	}
}

// These names are in deployed databases and in migrations/*.sql: a change
// here would orphan existing tables, so it must be deliberate.
func TestNamesAreStable(t *testing.T) {
	tests := []struct{ got, want string }{
		{SlotRegistry, "outbox_relay_slots"},
		{LeaseTable, "outbox_relay_leader"},
		{MigrationHistory, "outbox_relay_migrations"},
		{strings.Join(RequiredColumns, ","), "id,aggregate_type,aggregate_id,event_type,payload"},
		{strings.Join(BookkeepingColumns, ","), "attempt_count,last_error,dead_lettered_at,dlq_resolved_at"},
		{ColHeaders, "headers"},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("name %q changed, was %q", tt.got, tt.want)
		}
	}
}

func TestPublicationNamesOption(t *testing.T) {
	tests := []struct {
		names []string
		want  string
	}{
		{[]string{"outbox_pub"}, `publication_names '"outbox_pub"'`},
		{[]string{"OutboxPub"}, `publication_names '"OutboxPub"'`},
		{[]string{"out box"}, `publication_names '"out box"'`},
		{[]string{`out"box`}, `publication_names '"out""box"'`},
		{[]string{`it's`}, `publication_names '"it''s"'`},
		{[]string{"a,b"}, `publication_names '"a,b"'`},
		{[]string{`back\slash`}, `publication_names '"back\slash"'`},
		{[]string{`'"; DROP TABLE x; --`}, `publication_names '"''""; DROP TABLE x; --"'`},
		{[]string{"a$$b"}, `publication_names '"a$$b"'`},
		{[]string{"Über Pub"}, `publication_names '"Über Pub"'`},
		{[]string{"A", `b"'c, d`}, `publication_names '"A","b""''c, d"'`},
	}
	for _, tt := range tests {
		got := PublicationNamesOption(tt.names...)
		if got != tt.want {
			t.Errorf("PublicationNamesOption(%q) = %s, want %s", tt.names, got, tt.want)
		}
		// What the walsender and pgoutput make of it must be the names.
		back, err := parsePublicationNames(got)
		if err != nil || !slices.Equal(back, tt.names) {
			t.Errorf("%s parses back as %q (%v), want %q", got, back, err, tt.names)
		}
	}
}

// parsePublicationNames does what PostgreSQL does with the option: the
// replication command scanner reads the string literal (a doubled single quote is one, no
// backslash escapes), then pgoutput splits it with SplitIdentifierString
// (varlena.c): comma-separated, whitespace around names skipped, "quoted"
// names kept with "" collapsed, unquoted names lower-cased.
func parsePublicationNames(opt string) ([]string, error) {
	lit, ok := strings.CutPrefix(opt, "publication_names ")
	if !ok || len(lit) < 2 || lit[0] != '\'' || lit[len(lit)-1] != '\'' {
		return nil, fmt.Errorf("not publication_names '...'")
	}
	body := lit[1 : len(lit)-1]
	if strings.Contains(strings.ReplaceAll(body, "''", ""), "'") {
		return nil, fmt.Errorf("lone quote ends the literal early")
	}
	s := strings.ReplaceAll(body, "''", "'")
	var names []string
	for {
		s = strings.TrimLeft(s, " \t\n\r\f\v")
		var name string
		if strings.HasPrefix(s, `"`) {
			var b strings.Builder
			i := 1
			for {
				j := strings.IndexByte(s[i:], '"')
				if j < 0 {
					return nil, fmt.Errorf("mismatched quotes")
				}
				b.WriteString(s[i : i+j])
				i += j + 1
				if i < len(s) && s[i] == '"' {
					b.WriteByte('"')
					i++
					continue
				}
				break
			}
			name, s = b.String(), s[i:]
		} else {
			end := strings.IndexAny(s, ", \t\n\r\f\v")
			if end < 0 {
				end = len(s)
			}
			name, s = strings.ToLower(s[:end]), s[end:]
		}
		if name == "" {
			return nil, fmt.Errorf("empty name")
		}
		names = append(names, name)
		s = strings.TrimLeft(s, " \t\n\r\f\v")
		if s == "" {
			return names, nil
		}
		if s[0] != ',' {
			return nil, fmt.Errorf("junk after name %q: %q", name, s)
		}
		s = s[1:]
	}
}

func TestParsePublicationNamesOracle(t *testing.T) {
	// The oracle itself, on what the old code sent: unquoted names are
	// lower-cased and split at commas.
	for in, want := range map[string][]string{
		`publication_names 'OutboxPub'`: {"outboxpub"},
		`publication_names 'a,b'`:       {"a", "b"},
		`publication_names ' a , "B" '`: {"a", "B"},
	} {
		if got, err := parsePublicationNames(in); err != nil || !slices.Equal(got, want) {
			t.Errorf("parsePublicationNames(%s) = %q, %v; want %q", in, got, err, want)
		}
	}
}

func TestCheckName(t *testing.T) {
	for _, tt := range []struct {
		in     string
		reason string
	}{
		{"outbox_pub", ""},
		{"OutboxPub", ""},
		{`Out"box 'Pub, $$`, ""},
		{"1pub", ""},
		{strings.Repeat("p", 63), ""},
		{strings.Repeat("é", 31), ""}, // 62 bytes
		{"", "is empty"},
		{strings.Repeat("p", 64), "over PostgreSQL's limit of 63"},
		{strings.Repeat("é", 32), "over PostgreSQL's limit of 63"},
		{"a\x00b", "NUL"},
		{"a\xffb", "UTF-8"},
	} {
		got := CheckName(tt.in)
		if (tt.reason == "") != (got == "") || !strings.Contains(got, tt.reason) {
			t.Errorf("CheckName(%q) = %q, want %q", tt.in, got, tt.reason)
		}
	}
}

func TestCheckSlotName(t *testing.T) {
	for _, tt := range []struct {
		in     string
		reason string
	}{
		{"outbox_relay", ""},
		{"0slot_9", ""},
		{strings.Repeat("s", 63), ""},
		{"", "is empty"},
		{strings.Repeat("s", 64), "limit of 63"},
		{"Outbox", `has 'O'`},
		{"outbox-relay", `has '-'`},
		{"out box", `has ' '`},
		{"outbox$", `has '$'`},
		{"slöt", `has 'ö'`},
	} {
		got := CheckSlotName(tt.in)
		if (tt.reason == "") != (got == "") || !strings.Contains(got, tt.reason) {
			t.Errorf("CheckSlotName(%q) = %q, want %q", tt.in, got, tt.reason)
		}
	}
}

func TestQuoteLiteral(t *testing.T) {
	for in, want := range map[string]string{
		"a":      "'a'",
		"it's":   "'it''s'",
		`a\'b`:   `'a\''b'`,
		"a\x00b": "'ab'",
		"":       "''",
	} {
		if got := QuoteLiteral(in); got != want {
			t.Errorf("QuoteLiteral(%q) = %s, want %s", in, got, want)
		}
	}
}

func TestReservedHeader(t *testing.T) {
	tests := []struct {
		key  string
		want bool
	}{
		{"event_id", true}, {"event_type", true}, {"aggregate_type", true}, {"aggregate_id", true}, {"pg_lsn", true},
		// Letter case does not matter: case-insensitive consumers exist.
		{"EVENT_ID", true}, {"Aggregate_Id", true}, {"PG_LSN", true},
		{"pg_l\u017fn", true}, // long s folds to s, as strings.EqualFold and Java's equalsIgnoreCase fold it
		{"dlq.reason", true}, {"dlq.", true}, {"dlq.anything.at_all", true}, {"DLQ.Reason", true}, {"Dlq.x", true},
		{"dlq", false}, {"dlq_reason", false}, {"dlqx", false}, {"x.dlq.reason", false},
		{"event_id ", false}, {" event_id", false}, {"event_ids", false}, {"eventid", false}, {"event-id", false},
		{"trace_id", false}, {"tenant_id", false}, {"schema_version", false}, {"traceparent", false}, {"", false},
	}
	for _, tt := range tests {
		if got := ReservedHeader(tt.key); got != tt.want {
			t.Errorf("ReservedHeader(%q) = %v, want %v", tt.key, got, tt.want)
		}
	}
	if n := testing.AllocsPerRun(100, func() { ReservedHeader("Trace_Id") }); n != 0 {
		t.Errorf("ReservedHeader allocates %v times", n)
	}
}
