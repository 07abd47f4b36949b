package pgsetup

import (
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/outboxschema"
)

func TestCreatePublicationSQLQuotesTheName(t *testing.T) {
	for pub, want := range map[string]string{
		"outbox_pub": `CREATE PUBLICATION "outbox_pub" FOR TABLE "public"."outbox" WITH (publish = 'insert')`,
		"OutboxPub":  `CREATE PUBLICATION "OutboxPub" FOR TABLE "public"."outbox" WITH (publish = 'insert')`,
		`Out"box 'P`: `CREATE PUBLICATION "Out""box 'P" FOR TABLE "public"."outbox" WITH (publish = 'insert')`,
	} {
		if got := CreatePublicationSQL(pub, "public.outbox"); got != want {
			t.Errorf("CreatePublicationSQL(%q) = %s, want %s", pub, got, want)
		}
	}
}

func TestPublishViaRootSQL(t *testing.T) {
	if got := PublishViaRootSQL("pub"); got != `ALTER PUBLICATION "pub" SET (publish = 'insert', publish_via_partition_root = true)` {
		t.Errorf("PublishViaRootSQL: %s", got)
	}
}

func TestShapeProblems(t *testing.T) {
	tbl := outboxschema.Table{Schema: "public", Name: "outbox"}
	read := outboxschema.DefaultMapping(tbl)
	good := func() Shape {
		return Shape{Publication: "outbox_pub", Table: tbl, VersionNum: 150004, Exists: true, Insert: true, Covered: true,
			Read: MappingColumns(read)}
	}
	tests := []struct {
		name   string
		change func(*Shape)
		kinds  []string
		want   []string // in the first problem's What or Fix
	}{
		{"whole table", func(*Shape) {}, nil, nil},
		{"whole table, in through FOR ALL TABLES", func(s *Shape) { s.Others = true }, nil, nil},
		{"replica identity, updates published: no matter", func(s *Shape) {}, nil, nil},
		{"missing", func(s *Shape) { s.Exists = false }, []string{KindMissing},
			[]string{`CREATE PUBLICATION "outbox_pub" FOR TABLE "public"."outbox" WITH (publish = 'insert')`}},
		{"publish = 'update'", func(s *Shape) { s.Insert = false }, []string{KindPublish},
			[]string{`ALTER PUBLICATION "outbox_pub" SET (publish = 'insert')`, "public.outbox"}},
		{"not included", func(s *Shape) { s.Covered = false }, []string{KindNotIncluded},
			[]string{`ALTER PUBLICATION "outbox_pub" ADD TABLE "public"."outbox"`}},
		{"partitioned, not via root", func(s *Shape) { s.Partitioned, s.Covered = true, false }, []string{KindViaRoot},
			[]string{`ALTER PUBLICATION "outbox_pub" SET (publish_via_partition_root = true)`}},
		{"partitioned, via root", func(s *Shape) { s.Partitioned, s.ViaRoot = true, true }, nil, nil},
		{"streamed as an ancestor", func(s *Shape) { s.Covered, s.ViaRoot, s.StreamedAs = false, true, `"public"."events"` }, []string{KindStreamedAs},
			[]string{`ALTER PUBLICATION "outbox_pub" DROP TABLE "public"."events"; ALTER PUBLICATION "outbox_pub" ADD TABLE "public"."outbox"`}},
		{"column list without headers", func(s *Shape) {
			s.ColumnList = []string{"id", "aggregate_type", "aggregate_id", "event_type", "payload", "created_at"}
		}, []string{KindColumnList}, []string{"headers, event_id, dlq_replay_of", `ALTER PUBLICATION "outbox_pub" SET TABLE "public"."outbox"`}},
		{"column list of every column", func(s *Shape) { s.ColumnList = MappingColumns(read) }, []string{KindColumnList},
			[]string{"added later", `ALTER PUBLICATION "outbox_pub" SET TABLE "public"."outbox"`}},
		{"column list, other tables in the publication", func(s *Shape) { s.ColumnList, s.Others = []string{"id"}, true }, []string{KindColumnList},
			[]string{`BEGIN; ALTER PUBLICATION "outbox_pub" DROP TABLE "public"."outbox"; ALTER PUBLICATION "outbox_pub" ADD TABLE "public"."outbox"; COMMIT;`}},
		{"column list, several outbox tables", func(s *Shape) {
			s.ColumnList, s.Tables = []string{"id"}, []outboxschema.Table{tbl, {Schema: "billing", Name: "outbox"}}
		}, []string{KindColumnList}, []string{`SET TABLE "public"."outbox", "billing"."outbox"`}},
		{"row filter", func(s *Shape) { s.RowFilter = "(aggregate_type <> 'audit'::text)" }, []string{KindRowFilter},
			[]string{"WHERE (aggregate_type <> 'audit'::text)", `ALTER PUBLICATION "outbox_pub" SET TABLE "public"."outbox"`}},
		{"column list and row filter", func(s *Shape) { s.ColumnList, s.RowFilter = []string{"id"}, "(id > 0)" },
			[]string{KindColumnList, KindRowFilter}, nil},
		{"generated headers before 18", func(s *Shape) { s.Generated = map[string]byte{"headers": 's'} }, []string{KindGenerated},
			[]string{`ALTER TABLE "public"."outbox" ALTER COLUMN "headers" DROP EXPRESSION`}},
		{"generated headers on 18, not published", func(s *Shape) { s.VersionNum, s.Generated = 180000, map[string]byte{"headers": 's'} },
			[]string{KindGenerated}, []string{`ALTER PUBLICATION "outbox_pub" SET (publish_generated_columns = stored)`}},
		{"generated headers on 18, published", func(s *Shape) {
			s.VersionNum, s.Generated, s.GenStored = 180000, map[string]byte{"headers": 's'}, true
		}, nil, nil},
		{"virtual event_id on 18", func(s *Shape) {
			s.VersionNum, s.Generated, s.GenStored = 180000, map[string]byte{"event_id": 'v'}, true
		},
			[]string{KindGenerated}, []string{"virtual", "event_id"}},
		{"publish and column list", func(s *Shape) { s.Insert, s.ColumnList = false, []string{"id"} }, []string{KindPublish, KindColumnList}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := good()
			tt.change(&s)
			ps := s.Problems()
			var kinds []string
			for _, p := range ps {
				kinds = append(kinds, p.Kind)
				if p.What == "" || p.Fix == "" {
					t.Errorf("problem without text or fix: %+v", p)
				}
			}
			if strings.Join(kinds, ",") != strings.Join(tt.kinds, ",") {
				t.Fatalf("kinds %v, want %v: %v", kinds, tt.kinds, ps)
			}
			for _, w := range tt.want {
				if !strings.Contains(ps[0].What+" "+ps[0].Fix, w) {
					t.Errorf("first problem lacks %q: %s", w, ps[0])
				}
			}
		})
	}
}

func TestMappingColumns(t *testing.T) {
	m := outboxschema.DebeziumMapping(outboxschema.Table{Schema: "public", Name: "outbox"})
	m.Additional = []outboxschema.Placement{{Column: "tenant", Header: "tenant"}, {Column: "id", Header: "x-id"}}
	if got := strings.Join(MappingColumns(m), ","); got != "id,aggregateid,type,payload,aggregatetype,tenant" {
		t.Errorf("MappingColumns = %s", got)
	}
}
