package decoder_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/decoder"
	pt "github.com/outbox-relay/outbox-relay/decoder/pgoutputtest"
)

// A Relation message that lacks a column the relay reads, which the
// table's previous Relation had or the table had when its publication was
// checked (a column list added, the column made generated), stops the
// stream before any event of it is published with the column as NULL. A
// table that never had the column (not migrated yet, or before the check)
// is read as before.
func TestRelationWithoutAReadColumn(t *testing.T) {
	all := pt.IdentityCols
	noHeaders := []string{"id", "aggregate_type", "aggregate_id", "event_type", "payload", "event_id", "dlq_replay_of"}
	listed := []string{"id", "aggregate_type", "aggregate_id", "event_type", "payload", "created_at"} // the column list
	withCreated := append(append([]string(nil), all...), "created_at")
	type rel struct {
		lsn  pglogrepl.LSN
		cols []string
	}
	tests := []struct {
		name   string
		expect []string      // Expect's columns; nil: no Expect
		from   pglogrepl.LSN // Expect's position
		rels   []rel
		col    string // the column the error names; "" for no error
	}{
		{"same columns again", nil, 0, []rel{{100, all}, {200, all}}, ""},
		{"a column the relay does not read dropped", nil, 0, []rel{{100, withCreated}, {200, all}}, ""},
		{"a column added", nil, 0, []rel{{100, noHeaders}, {200, all}}, ""},
		{"headers left out by a column list", nil, 0, []rel{{100, all}, {200, noHeaders}}, "headers"},
		{"the issue's column list", nil, 0, []rel{{100, withCreated}, {200, listed}}, "headers"},
		{"first Relation after the check lacks headers", all, 150, []rel{{200, noHeaders}}, "headers"},
		{"first Relation after the check lacks event_id", all, 150, []rel{{200, pt.OutboxCols}}, "event_id"},
		{"Relation from before the check (a migration added the column since)", all, 150, []rel{{100, pt.OutboxCols}}, ""},
		{"a transaction that began before the check and commits after it", all, 150, []rel{{170, pt.OutboxCols}}, "event_id"},
		{"before the check, then after it, without the column", all, 150, []rel{{100, pt.OutboxCols}, {200, pt.OutboxCols}}, "event_id"},
		{"a table never migrated", pt.OutboxCols, 150, []rel{{200, pt.OutboxCols}}, ""},
		{"whole after the check", all, 150, []rel{{200, all}}, ""},
		// A required column's absence is a bad row each (dead-lettered
		// naming it), as for a column dropped mid-run.
		{"a required column dropped", nil, 0, []rel{{100, all}, {200, append([]string{"id", "aggregate_type", "aggregate_id", "payload"}, all[5:]...)}}, ""},
		{"a required column missing after the check", all, 150, []rel{{200, append([]string{"id", "aggregate_type", "aggregate_id", "payload"}, all[5:]...)}}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := decoder.New("public.outbox")
			if err != nil {
				t.Fatal(err)
			}
			d.SetPublication("outbox_pub")
			if tt.expect != nil {
				d.Expect(0, tt.expect, tt.from)
			}
			var last error
			// As pgoutput sends them: Begin at the transaction's first
			// change announcing its commit position (r.lsn), the Relation
			// with WALStart 0.
			for _, r := range tt.rels {
				if _, err := d.Decode(r.lsn-40, pt.Begin(r.lsn, 7)); err != nil {
					t.Fatal(err)
				}
				if _, last = d.Decode(0, pt.Relation(pt.OutboxID, "public", "outbox", r.cols...)); last != nil {
					break
				}
				if _, err := d.Decode(r.lsn, pt.Commit(r.lsn, r.lsn+1)); err != nil {
					t.Fatal(err)
				}
			}
			if tt.col == "" {
				if last != nil {
					t.Fatalf("refused: %v", last)
				}
				return
			}
			if !errors.Is(last, decoder.ErrColumnNotStreamed) {
				t.Fatalf("err = %v, want ErrColumnNotStreamed", last)
			}
			for _, w := range []string{`column "` + tt.col + `"`, `ALTER PUBLICATION "outbox_pub" SET TABLE "public"."outbox"`, "public.outbox", "pg_replication_slot_advance", "outbox-relay replay --since"} {
				if !strings.Contains(last.Error(), w) {
					t.Errorf("error lacks %q: %v", w, last)
				}
			}
		})
	}
}

// Other tables' Relations are not judged.
func TestRelationOfAnotherTableNarrowed(t *testing.T) {
	d, err := decoder.New("public.outbox")
	if err != nil {
		t.Fatal(err)
	}
	d.Expect(0, pt.IdentityCols, 0)
	for _, cols := range [][]string{{"id", "headers"}, {"id"}} {
		if _, err := d.Decode(100, pt.Relation(pt.OrdersID, "public", "orders", cols...)); err != nil {
			t.Fatalf("another table's Relation refused: %v", err)
		}
	}
}
