//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/outboxschema"
	"github.com/outbox-relay/outbox-relay/retention"
	"github.com/outbox-relay/outbox-relay/test/testkit"
)

// Migration 0006 (issue 35) on a real server: on an outbox that already
// holds rows they keep a NULL event_id and new rows get a UUID from the
// database; on a fresh outbox and a partitioned one likewise; a second run
// changes nothing; an event_id column of another type is refused.
func TestEventIDMigration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pgURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	schema := fmt.Sprintf("e2e_eventid_%d", time.Now().UnixNano()%1e9)
	t.Cleanup(func() { _, _ = conn.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE") })
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	names := func(table string) migrations.Names {
		return migrations.Names{Schema: schema, Table: table, Publication: schema + "_" + table}
	}
	t.Cleanup(func() {
		for _, p := range []string{"existing", "fresh", "parted", "wrongtype"} {
			_, _ = conn.Exec(context.Background(), "DROP PUBLICATION IF EXISTS "+schema+"_"+p)
		}
	})
	insert := func(table string) (id int64, eventID *string) {
		t.Helper()
		if err := conn.QueryRow(ctx, "INSERT INTO "+schema+"."+table+` (aggregate_type, aggregate_id, event_type, payload)
			VALUES ('order', 'o-1', 'E', '{}') RETURNING id, event_id::text`).Scan(&id, &eventID); err != nil {
			t.Fatalf("insert into %s: %v", table, err)
		}
		return id, eventID
	}
	apply := func(table string, want []int) {
		t.Helper()
		applied, err := migrations.Apply(ctx, conn, names(table), zerolog.Nop())
		if err != nil || fmt.Sprint(applied) != fmt.Sprint(want) {
			t.Fatalf("migrate %s: applied %v, %v; want %v", table, applied, err, want)
		}
	}
	newRowHasUUID := func(table string) {
		t.Helper()
		if _, eid := insert(table); eid == nil || !testkit.IsUUID(*eid) {
			t.Errorf("%s: a new row's event_id is %v, want a UUID from the column's default", table, eid)
		}
	}

	t.Run("existing outbox with rows", func(t *testing.T) {
		ms, err := migrations.Load(names("existing"))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range ms[:5] { // 0001..0005, as an install before this change has them
			if _, err := conn.Exec(ctx, m.SQL); err != nil {
				t.Fatalf("%s: %v", m.Name, err)
			}
		}
		var old []int64
		for range 3 {
			if _, err := conn.Exec(ctx, "INSERT INTO "+schema+`.existing (aggregate_type, aggregate_id, event_type, payload)
				VALUES ('order', 'o-1', 'E', '{}')`); err != nil {
				t.Fatal(err)
			}
		}
		if err := conn.QueryRow(ctx, "SELECT array_agg(id ORDER BY id) FROM "+schema+".existing").Scan(&old); err != nil {
			t.Fatal(err)
		}
		// The relay's history has none of them (the files ran by hand):
		// Apply runs all, 0001..0005 finding their objects.
		apply("existing", []int{1, 2, 3, 4, 5, 6, 7})
		var nulls int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM "+schema+".existing WHERE event_id IS NULL AND dlq_replay_of IS NULL").Scan(&nulls); err != nil {
			t.Fatal(err)
		}
		if nulls != len(old) {
			t.Errorf("%d of the %d rows written before 0006 have a NULL event_id, want all: they keep their id as identity", nulls, len(old))
		}
		newRowHasUUID("existing")
		apply("existing", nil) // idempotent
	})

	t.Run("fresh outbox", func(t *testing.T) {
		apply("fresh", []int{1, 2, 3, 4, 5, 6, 7})
		newRowHasUUID("fresh")
		// The file itself is idempotent too (a history lost, a rerun by hand).
		ms, _ := migrations.Load(names("fresh"))
		if _, err := conn.Exec(ctx, ms[5].SQL); err != nil {
			t.Fatalf("0006 again: %v", err)
		}
		var def string
		if err := conn.QueryRow(ctx, `SELECT pg_get_expr(d.adbin, d.adrelid) FROM pg_attrdef d JOIN pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum
			WHERE d.adrelid = $1::regclass AND a.attname = 'event_id'`, schema+".fresh").Scan(&def); err != nil || def != "gen_random_uuid()" {
			t.Errorf("event_id default %q (%v), want gen_random_uuid()", def, err)
		}
	})

	t.Run("partitioned outbox", func(t *testing.T) {
		tbl := outboxschema.Table{Schema: schema, Name: "parted"}
		if created, err := migrations.CreatePartitionedOutbox(ctx, conn, tbl, retention.PartitionDaily, zerolog.Nop()); err != nil || !created {
			t.Fatalf("create partitioned: %v %v", created, err)
		}
		apply("parted", []int{1, 2, 3, 4, 5, 6, 7})
		newRowHasUUID("parted")
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_inherits i JOIN pg_attribute a ON a.attrelid = i.inhrelid
			WHERE i.inhparent = $1::regclass AND a.attname IN ('event_id', 'dlq_replay_of') AND NOT a.attisdropped`, schema+".parted").Scan(&n); err != nil || n == 0 || n%2 != 0 {
			t.Errorf("partitions with the identity columns: %d (%v)", n, err)
		}
	})

	t.Run("event_id of another type is refused", func(t *testing.T) {
		ms, _ := migrations.Load(names("wrongtype"))
		if _, err := conn.Exec(ctx, ms[0].SQL); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, "ALTER TABLE "+schema+".wrongtype ADD COLUMN event_id text"); err != nil {
			t.Fatal(err)
		}
		_, err := migrations.Apply(ctx, conn, names("wrongtype"), zerolog.Nop())
		if err == nil || !strings.Contains(err.Error(), "0006_event_id.sql") || !strings.Contains(err.Error(), "event_id of type text, not uuid") {
			t.Fatalf("Apply: %v, want 0006 refusing the text event_id", err)
		}
	})
}

// The case: after a failover to a lagging standby or a restore,
// the sequence hands out ids whose events were already published. Here
// the rows are deleted and the sequence set back: the new rows have the
// old ids, but their event_ids are new UUIDs, so a consumer deduplicating
// on event_id takes them as the new events they are.
func TestReusedRowIDIsANewEvent(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "reusedid")
	r := e.startRelay()
	const n = 5
	insert := func() map[int64]string {
		ids := map[int64]string{}
		for i := range n {
			var id int64
			var eid string
			if err := e.DB.QueryRow(context.Background(), "INSERT INTO "+e.Table+` (aggregate_type, aggregate_id, event_type, payload)
				VALUES ('order', $1, 'order.created', '{}') RETURNING id, event_id::text`, fmt.Sprintf("order-%d", i)).Scan(&id, &eid); err != nil {
				t.Fatal(err)
			}
			ids[id] = eid
		}
		return ids
	}
	first := insert()
	consume(t, []string{e.Prefix + ".order"}, n, 60*time.Second, time.Second)
	// The lost history: its rows gone, the sequence back where it was.
	mustExec(t, e, "DELETE FROM "+e.Table)
	mustExec(t, e, fmt.Sprintf("SELECT setval(pg_get_serial_sequence('%s', 'id'), 1, false)", e.Table))
	second := insert()
	rs := consume(t, []string{e.Prefix + ".order"}, 2*n, 60*time.Second, 2*time.Second)
	if len(rs) != 2*n {
		t.Fatalf("%d records, want %d", len(rs), 2*n)
	}
	seen := map[string]bool{}
	for _, rec := range rs {
		id, _ := testkit.RecordID(rec)
		eid := rec.Headers["event_id"]
		if seen[eid] || !testkit.IsUUID(eid) || (eid != first[id] && eid != second[id]) {
			t.Errorf("record of row %d: event_id %q (first history %q, second %q), seen before: %v", id, eid, first[id], second[id], seen[eid])
		}
		seen[eid] = true
	}
	for id := range second {
		if _, reused := first[id]; !reused {
			t.Fatalf("row id %d was not reused: the test set the sequence back", id)
		}
	}
	r.stop(syscall.SIGTERM, 30*time.Second)
}

// dlq replay of a row written before migration 0006 (event_id NULL): the
// copy is published under the row's id, the identity its dead letter
// carried, marked outbox_replayed_from: dlq; a second dlq replay of that
// copy keeps it too.
func TestDLQReplayKeepsIdentityOfRowWithoutEventID(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "dlqidentity")
	dlq := e.Prefix + ".dlq"
	mustExec(t, e, "ALTER TABLE "+e.Table+" ALTER COLUMN aggregate_id DROP NOT NULL")
	r := e.startRelay("--dlq-topic", dlq)
	var id int64
	if err := e.DB.QueryRow(context.Background(), "INSERT INTO "+e.Table+` (aggregate_type, aggregate_id, event_type, payload, event_id)
		VALUES ('order', NULL, 'order.paid', '{"n": 1}', NULL) RETURNING id`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	idText := strconv.FormatInt(id, 10)
	letters := consume(t, []string{dlq}, 1, 60*time.Second, time.Second)
	if len(letters) != 1 || letters[0].Headers["event_id"] != idText || letters[0].Headers["outbox_id"] != idText {
		t.Fatalf("dead letters %+v, want one with event_id and outbox_id %d", letters, id)
	}
	waitFor(t, 30*time.Second, "the row marked dead-lettered", func() bool { return e.count(t, "dead_lettered_at IS NOT NULL") == 1 })
	mustExec(t, e, "UPDATE "+e.Table+" SET aggregate_id = 'order-1' WHERE id = $1", id)
	code, out := e.cli("dlq", "replay", "--id", idText)
	var newID int64
	if _, err := fmt.Sscanf(out[max(0, strings.Index(out, "replayed")):], "replayed outbox row %d as row %d", new(int64), &newID); code != 0 || err != nil ||
		!strings.Contains(out, "event_id "+idText) {
		t.Fatalf("dlq replay: exit %d, %s", code, out)
	}
	rs := consume(t, []string{e.Prefix + ".order"}, 1, 60*time.Second, time.Second)
	if len(rs) != 1 || rs[0].Headers["event_id"] != idText || rs[0].Headers["outbox_id"] != strconv.FormatInt(newID, 10) ||
		rs[0].Headers["outbox_replayed_from"] != "dlq" || rs[0].Key != "order-1" {
		t.Fatalf("records %+v, want the copy %d under event_id %d marked outbox_replayed_from dlq", rs, newID, id)
	}
	var replayOf int64
	var eventID *string
	if err := e.DB.QueryRow(context.Background(), "SELECT dlq_replay_of, event_id::text FROM "+e.Table+" WHERE id = $1", newID).Scan(&replayOf, &eventID); err != nil ||
		replayOf != id || eventID != nil {
		t.Fatalf("the copy: dlq_replay_of %d event_id %v (%v), want %d and NULL", replayOf, eventID, err, id)
	}
	r.stop(syscall.SIGTERM, 30*time.Second)
}
