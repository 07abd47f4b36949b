package migrations

import (
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/outboxschema"
)

var q = outboxschema.QuoteIdent

// The SQL names every object through the placeholders filled from
// outboxschema, quoted; none is left unfilled.
func TestLoadSubstitutesNames(t *testing.T) {
	tests := []struct {
		names Names
		want  []string
	}{
		{Names{"public", "outbox", "outbox_pub"}, []string{
			`"public"."outbox"`, `"public".` + q(outboxschema.SlotRegistry), `"public".` + q(outboxschema.LeaseTable),
			`"outbox_unpublished_idx"`, `"outbox_dead_lettered_idx"`, `"outbox_pub"`, `'outbox_pub'`, `'"public"."outbox"'::regclass`}},
		{Names{"Events", "Outbox$1", "Pub"}, []string{
			`"Events"."Outbox$1"`, `"Events".` + q(outboxschema.SlotRegistry), `"Events".` + q(outboxschema.LeaseTable), `"Pub"`}},
		{Names{"it's", "out'box", "p"}, []string{`'"it''s"."out''box"'::regclass`}},
	}
	for _, tt := range tests {
		t.Run(tt.names.Schema+"."+tt.names.Table, func(t *testing.T) {
			ms, err := Load(tt.names)
			if err != nil {
				t.Fatal(err)
			}
			var all strings.Builder
			for i, m := range ms {
				if i > 0 && m.Version <= ms[i-1].Version {
					t.Errorf("%s: version %d after %d", m.Name, m.Version, ms[i-1].Version)
				}
				if strings.Contains(m.SQL, "{{") {
					t.Errorf("%s: placeholder left in:\n%s", m.Name, m.SQL)
				}
				all.WriteString(m.SQL)
			}
			for _, w := range tt.want {
				if !strings.Contains(all.String(), w) {
					t.Errorf("no %s in the SQL", w)
				}
			}
		})
	}
}

// The checksum is the file's, so applying the same migration with other
// names is not reported as a changed file.
func TestChecksumIgnoresNames(t *testing.T) {
	a, err := Load(Names{"public", "outbox", "outbox_pub"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := Load(Names{"Events", "Outbox$1", "other_pub"})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]string{}
	for i := range a {
		raw, err := files.ReadFile(a[i].Name)
		if err != nil {
			t.Fatal(err)
		}
		if a[i].Checksum != sha256Hex(string(raw)) || b[i].Checksum != a[i].Checksum {
			t.Errorf("%s: checksums %s and %s, want both the file's %s", a[i].Name, a[i].Checksum, b[i].Checksum, sha256Hex(string(raw)))
		}
		if other, dup := seen[a[i].Checksum]; dup {
			t.Errorf("%s and %s have the same checksum", other, a[i].Name)
		}
		seen[a[i].Checksum] = a[i].Name
	}
}

// A publication name holding $$ must not end migration 0001's DO block: the
// block is then quoted with a tag no name contains. Plain names keep $$, so
// SQL an older relay checksummed is unchanged.
func TestDollarQuotingSurvivesNames(t *testing.T) {
	for _, tt := range []struct {
		pub, tag string
	}{
		{"outbox_pub", "$$"},
		{`Out"box 'Pub, x $$`, "$outbox_relay_0$"},
		{"a$$b$outbox_relay_0$", "$outbox_relay_1$"},
	} {
		ms, err := Load(Names{"public", "outbox", tt.pub})
		if err != nil {
			t.Fatal(err)
		}
		sql := ms[0].SQL
		if !strings.Contains(sql, "DO "+tt.tag+"\n") || !strings.Contains(sql, "\n"+tt.tag+";") {
			t.Errorf("publication %q: DO block not quoted with %s:\n%s", tt.pub, tt.tag, sql)
		}
		body := sql[strings.Index(sql, "DO "+tt.tag)+len("DO "+tt.tag) : strings.LastIndex(sql, tt.tag+";")]
		if strings.Contains(body, tt.tag) {
			t.Errorf("publication %q: the tag %s occurs inside the block", tt.pub, tt.tag)
		}
		for _, w := range []string{q(tt.pub), outboxschema.QuoteLiteral(tt.pub)} {
			if !strings.Contains(body, w) {
				t.Errorf("publication %q: %s not in the block", tt.pub, w)
			}
		}
	}
}

// Migration 0006 adds the identity columns without a default (no rewrite,
// a short lock) and sets the default for new rows after: rows written
// before keep NULL, the identity they were published with.
func TestEventIDMigrationDoesNotRewrite(t *testing.T) {
	ms, err := Load(Names{"public", "outbox", "outbox_pub"})
	if err != nil {
		t.Fatal(err)
	}
	var sql string
	for _, m := range ms {
		if m.Version == 6 {
			sql = m.SQL
		}
	}
	for _, want := range []string{"ADD COLUMN IF NOT EXISTS event_id      UUID,", "ADD COLUMN IF NOT EXISTS dlq_replay_of BIGINT;",
		`ALTER TABLE "public"."outbox" ALTER COLUMN event_id SET DEFAULT gen_random_uuid();`} {
		if !strings.Contains(sql, want) {
			t.Errorf("migration 0006 lacks %q:\n%s", want, sql)
		}
	}
	add := sql[strings.Index(sql, "ADD COLUMN IF NOT EXISTS event_id"):strings.Index(sql, "SET DEFAULT")]
	if strings.Contains(strings.ToUpper(add), "DEFAULT") {
		t.Errorf("migration 0006 adds a column with a default (a table rewrite): %s", add)
	}
}
