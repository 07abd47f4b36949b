package retention

import (
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/outboxschema"
)

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*Config)
		want string // "" = valid
	}{
		{"defaults", func(*Config) {}, ""},
		{"keep 0 keeps for ever", func(c *Config) { c.Keep = 0 }, ""},
		{"negative keep", func(c *Config) { c.Keep = -time.Second }, "retention.keep: -1s is negative"},
		{"interval too short", func(c *Config) { c.Interval = 500 * time.Millisecond }, "retention.interval: 500ms is out of range"},
		{"interval too long", func(c *Config) { c.Interval = 25 * time.Hour }, "retention.interval: 25h0m0s is out of range"},
		{"batch 0", func(c *Config) { c.BatchSize = 0 }, "retention.batch_size: 0 is out of range"},
		{"batch too big", func(c *Config) { c.BatchSize = MaxBatchSize + 1 }, "retention.batch_size: 100001 is out of range"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			tt.mod(&c)
			err := c.Validate("retention.")
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("error %v, want it to contain %q", err, tt.want)
			}
		})
	}
	if d := DefaultConfig(); d.Keep != 168*time.Hour || d.Interval != time.Minute || d.BatchSize != 1000 || d.Archive {
		t.Errorf("defaults %+v, want keep 168h, interval 1m, batch 1000, no archive", d)
	}
}

func TestDescribe(t *testing.T) {
	tests := []struct {
		c     Config
		want  string
		short bool
	}{
		{Config{Keep: 0, Interval: time.Minute, BatchSize: 1000}, "rows kept for ever", false},
		{DefaultConfig(), "delivered rows older than 168h0m0s are deleted every 1m0s, in batches of 1000 rows", false},
		{Config{Keep: 3 * time.Second, Interval: time.Second, BatchSize: 10, Archive: true}, "older than 3s are moved to the archive table every 1s", true},
	}
	for _, tt := range tests {
		if got := tt.c.Describe(); !strings.Contains(got, tt.want) {
			t.Errorf("Describe() = %q, want %q in it", got, tt.want)
		}
		if tt.c.ShortKeep() != tt.short {
			t.Errorf("keep %s: ShortKeep %v", tt.c.Keep, !tt.short)
		}
	}
}

func TestDeleteBatchSQL(t *testing.T) {
	tbl := outboxschema.Table{Schema: "s", Name: "outbox"}
	q := `"s"."outbox"`
	tests := []struct {
		name, archive, cols string
		partitioned         bool
		want                []string
	}{
		{"delete", "", "", false, []string{
			// A plain table is read with ONLY: an inheritance child's rows
			// were never streamed.
			"DELETE FROM ONLY " + q + " o USING c WHERE (o.id, o.created_at) IN (SELECT o.id, o.created_at FROM ONLY " + q + " o, c WHERE ",
			"ORDER BY o.created_at LIMIT $4)",
			"o.created_at < now() - make_interval(secs => $1)",
			"o.published_at IS NOT NULL OR (",
			" >= $2 AND ", " < $3 AND NOT ",
			"NOT (o.dead_lettered_at IS NOT NULL AND o.dlq_resolved_at IS NULL)",
		}},
		{"partitioned", "", "", true, []string{
			// A partitioned one through its root (ONLY would read nothing).
			"DELETE FROM " + q + " o USING c WHERE (o.id, o.created_at) IN (SELECT o.id, o.created_at FROM " + q + " o, c WHERE ",
			// Each row is judged against its partition's attach.
			`pg_partition_tree(to_regclass('"s"."outbox"'))`,
			"(SELECT a.x FROM a WHERE a.rel = o.tableoid)",
		}},
		{"archive", `"s"."outbox_archive"`, `"id", "created_at"`, false, []string{
			", d AS (DELETE FROM ONLY " + q + " o USING c WHERE",
			`RETURNING o."id", o."created_at") INSERT INTO "s"."outbox_archive" ("id", "created_at") SELECT "id", "created_at" FROM d`,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sql := DeleteBatchSQL(tbl, tt.partitioned, tt.archive, tt.cols)
			if !strings.HasPrefix(sql, "WITH c AS (SELECT pg_snapshot_xmax(pg_current_snapshot())") {
				t.Errorf("no xid CTE first:\n%s", sql)
			}
			for _, w := range tt.want {
				if !strings.Contains(sql, w) {
					t.Errorf("missing %q in\n%s", w, sql)
				}
			}
			if tt.partitioned && strings.Contains(sql, "ONLY") {
				t.Errorf("ONLY on a partitioned outbox reads no row:\n%s", sql)
			}
			// The rule is checked in the subquery and again on the locked rows.
			if n := strings.Count(sql, DeliveredCond("$2", "$3")); n != 2 {
				t.Errorf("delivered condition appears %d times, want 2:\n%s", n, sql)
			}
		})
	}
}

func TestDryRunAndKeepsRowSQL(t *testing.T) {
	tbl := outboxschema.Table{Schema: "s", Name: "outbox"}
	sql := DryRunSQL(tbl, false)
	for _, w := range []string{"count(*) FILTER (WHERE " + DeliveredCond("$2", "$3"), " < $4)", " >= $4)", " AND " + unstreamed + ")\n",
		`FROM ONLY "s"."outbox" o, c WHERE o.created_at < now() - make_interval(secs => $1)`} {
		if !strings.Contains(sql, w) {
			t.Errorf("DryRunSQL lacks %q:\n%s", w, sql)
		}
	}
	if sql := DryRunSQL(tbl, true); !strings.Contains(sql, `FROM "s"."outbox" o, c WHERE`) {
		t.Errorf("DryRunSQL (partitioned) does not read the root:\n%s", sql)
	}
	k := KeepsRowSQL(`"s"."outbox"`, `"s"."outbox_p20260101"`)
	if !strings.Contains(k, "SELECT EXISTS (SELECT 1 FROM \"s\".\"outbox_p20260101\" o, c WHERE NOT "+DeliveredCond("$1", "$2")+" OR ") {
		t.Errorf("KeepsRowSQL: %s", k)
	}
	if !strings.Contains(k, `pg_partition_tree(to_regclass('"s"."outbox"'))`) {
		t.Errorf("KeepsRowSQL does not judge by the root's tree: %s", k)
	}
}

func TestPartitionVerdict(t *testing.T) {
	keep := PartitionVerdict{Partition: outboxschema.Table{Schema: "s", Name: "outbox_p20260101"}, Rows: 5, Unstreamed: 5, MinID: 11, MaxID: 15}
	if keep.Drop() {
		t.Fatal("a partition with unstreamed rows is dropped")
	}
	for _, w := range []string{"s.outbox_p20260101 (5 rows) is kept", "before it was attached", "outbox-relay replay --from-id 11 --to-id 15", `UPDATE "s"."outbox_p20260101" SET published_at = now() WHERE published_at IS NULL;`} {
		if !strings.Contains(keep.String(), w) {
			t.Errorf("%q lacks %q", keep, w)
		}
	}
	drop := PartitionVerdict{Partition: outboxschema.Table{Schema: "s", Name: "outbox_p20260102"}, Rows: 3}
	if !drop.Drop() || !strings.Contains(drop.String(), "would be dropped") {
		t.Errorf("%q", drop)
	}
}

func TestRangesAndNames(t *testing.T) {
	now := time.Date(2026, 11, 30, 22, 10, 0, 0, time.FixedZone("X", 3600))
	d := Ranges(PartitionDaily, now)
	if len(d) != daysAhead+1 || !d[0][0].Equal(time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)) || !d[7][1].Equal(time.Date(2026, 12, 8, 0, 0, 0, 0, time.UTC)) {
		t.Errorf("daily ranges %v", d)
	}
	m := Ranges(PartitionMonthly, now)
	if len(m) != monthsAhead+1 || !m[0][0].Equal(time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)) || !m[3][1].Equal(time.Date(2027, 3, 1, 0, 0, 0, 0, time.UTC)) {
		t.Errorf("monthly ranges %v", m)
	}
	if r := Ranges(PartitionNone, now); r != nil {
		t.Errorf("none: %v", r)
	}
	tbl := outboxschema.Table{Schema: "s", Name: "outbox"}
	if got := PartitionName(tbl, PartitionDaily, d[1][0]).Quoted(); got != `"s"."outbox_p20261201"` {
		t.Errorf("daily name %s", got)
	}
	if got := PartitionName(tbl, PartitionMonthly, m[2][0]).Quoted(); got != `"s"."outbox_p202701"` {
		t.Errorf("monthly name %s", got)
	}
	if got := CreatePartitionSQL(tbl, PartitionName(tbl, PartitionDaily, d[0][0]), d[0][0], d[0][1]); got !=
		`CREATE TABLE IF NOT EXISTS "s"."outbox_p20261130" PARTITION OF "s"."outbox" FOR VALUES FROM ('2026-11-30T00:00:00Z') TO ('2026-12-01T00:00:00Z')` {
		t.Errorf("CreatePartitionSQL: %s", got)
	}
}

func TestPartitionMode(t *testing.T) {
	day := time.Date(2026, 3, 29, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		ps   []partition
		want string
	}{
		{nil, ""},
		{[]partition{{isDefault: true}}, ""},
		{[]partition{{isDefault: true}, {from: day, until: day.AddDate(0, 0, 1)}}, PartitionDaily},
		{[]partition{{isDefault: true}, {from: day, until: day.AddDate(0, 1, 0)}}, PartitionMonthly},
	}
	for _, tt := range tests {
		if got := partitionMode(tt.ps); got != tt.want {
			t.Errorf("partitionMode(%v) = %q, want %q", tt.ps, got, tt.want)
		}
	}
}

func TestSummary(t *testing.T) {
	tbl := outboxschema.Table{Schema: "public", Name: "outbox"}
	cfg := DefaultConfig()
	proven := State{FloorXID: 100, DeliveredXID: 200, DeliveredAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	tests := []struct {
		name string
		r    Report
		dry  bool
		want []string
	}{
		{"dry", Report{State: proven, Removable: 5, BelowFloor: 3, AboveHorizon: 4, DeadLetters: 1}, true, []string{
			"delivered horizon: transactions below xid 200, sampled at 2026-01-02T03:04:05Z (floor xid 100)",
			"dry run: 5 rows of public.outbox older than 168h0m0s would be removed",
			"7 rows older than keep are not proven delivered: 3 below the slot's floor (written before the slot existed: `outbox-relay replay` them), 4 newer than the delivered horizon",
			"1 rows older than keep are unresolved dead letters",
		}},
		{"unproven", Report{}, true, []string{"no delivered horizon yet", "dry run: 0 rows"}},
		{"run", Report{State: proven, Deleted: 42, DroppedPartitions: []string{"public.outbox_p20260101"}}, false, []string{
			"removed 42 rows of public.outbox older than 168h0m0s, dropping 1 partitions: public.outbox_p20260101"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.r.Summary(tbl, cfg, tt.dry)
			for _, w := range tt.want {
				if !strings.Contains(got, w) {
					t.Errorf("missing %q in\n%s", w, got)
				}
			}
		})
	}
}
