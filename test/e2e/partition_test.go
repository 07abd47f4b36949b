//go:build e2e

package e2e

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/test/testkit"
)

func (e *env) exists(t *testing.T, rel string) bool {
	t.Helper()
	var ok bool
	if err := e.DB.QueryRow(context.Background(), "SELECT to_regclass($1) IS NOT NULL", rel).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

// migrate --partition daily creates the outbox partitioned by created_at
// (DEFAULT partition, a week ahead) and a publication through the root:
// events are delivered under the root's name; retention drops an old
// delivered partition whole, deletes old rows of the DEFAULT partition
// row by row, and never drops the DEFAULT partition.
func TestPartitionedOutboxRetention(t *testing.T) {
	t.Setenv("OUTBOX_RELAY_PARTITION", "daily")
	e := newEnv(t, "parted")
	var kind string
	var viaRoot bool
	if err := e.DB.QueryRow(context.Background(), "SELECT c.relkind::text, p.pubviaroot FROM pg_class c, pg_publication p WHERE c.oid = $1::regclass AND p.pubname = $2",
		e.Table, e.Pub).Scan(&kind, &viaRoot); err != nil {
		t.Fatal(err)
	}
	if kind != "p" || !viaRoot {
		t.Fatalf("relkind %q, publish_via_partition_root %v: want a partitioned table published through its root", kind, viaRoot)
	}
	var parts int
	if err := e.DB.QueryRow(context.Background(), "SELECT count(*) FROM pg_inherits WHERE inhparent = $1::regclass", e.Table).Scan(&parts); err != nil {
		t.Fatal(err)
	}
	if parts != 9 {
		t.Errorf("%d partitions after migrate, want 9 (DEFAULT, today and 7 days ahead)", parts)
	}
	// An old day's partition, rows in it, and old rows in the DEFAULT one.
	old := time.Now().UTC().AddDate(0, 0, -3).Truncate(24 * time.Hour)
	oldPart := e.Schema + ".outbox_p" + old.Format("20060102")
	mustExec(t, e, "CREATE TABLE "+oldPart+" PARTITION OF "+e.Table+" FOR VALUES FROM ('"+old.Format(time.RFC3339)+"') TO ('"+old.AddDate(0, 0, 1).Format(time.RFC3339)+"')")
	ctx := context.Background()
	w := e.newWriter(121)
	if err := w.run(ctx, 30, 5, 10, 0, ""); err != nil {
		t.Fatal(err)
	}
	// Moving rows to other partitions is a delete and an insert to logical
	// decoding: the relay publishes these 20 rows twice (the duplicates).
	mustExec(t, e, "UPDATE "+e.Table+" SET created_at = $1 WHERE id IN (SELECT id FROM "+e.Table+" ORDER BY id LIMIT 10)", old.Add(time.Hour))
	mustExec(t, e, "UPDATE "+e.Table+" SET created_at = $1 WHERE id IN (SELECT id FROM "+e.Table+" WHERE created_at > $2 ORDER BY id LIMIT 10)", old.AddDate(0, 0, -10), old.AddDate(0, 0, 1))
	if n := e.rows(t, "true"); n != 30 {
		t.Fatalf("%d rows, want 30", n)
	}
	r := e.startRelay("--retention-keep", "3s", "--retention-interval", "1s")
	if err := w.run(ctx, 30, 5, 10, 0, ""); err != nil {
		t.Fatal(err)
	}
	ws := w.written()
	requireClean(t, check(t, ws, consume(t, e.topics(), len(ws), 60*time.Second, 2*time.Second), e.partitions(t)), true)
	waitFor(t, 60*time.Second, "every delivered row removed", func() bool { return e.rows(t, "true") == 0 })
	if e.exists(t, oldPart) {
		t.Errorf("old delivered partition %s not dropped", oldPart)
	}
	if !e.exists(t, e.Schema+".outbox_default") {
		t.Errorf("the DEFAULT partition was dropped")
	}
	// The counter moves after the batch's commit, which the row count above
	// may see first.
	_ = testkit.Poll(10*time.Second, 50*time.Millisecond, func() (bool, error) {
		return r.metric("outbox_relay_retention_deleted_rows_total") >= 60, nil
	})
	if got := r.metric("outbox_relay_retention_deleted_rows_total"); got != 60 {
		t.Errorf("outbox_relay_retention_deleted_rows_total = %v, want 60 (dropped partition's rows included)", got)
	}
	if !strings.Contains(r.log(), "dropped_partitions") {
		t.Errorf("no retention run logged a dropped partition")
	}
	r.stop(syscall.SIGTERM, 30*time.Second)
}

// A partitioned outbox whose publication does not publish through the root
// would stream inserts under the partitions' names, which the relay never
// reads: it refuses to start, naming the ALTER PUBLICATION to run.
func TestPartitionedOutboxNeedsPublishViaRoot(t *testing.T) {
	t.Setenv("OUTBOX_RELAY_PARTITION", "monthly")
	e := newEnv(t, "partpub")
	mustExec(t, e, "ALTER PUBLICATION "+e.Pub+" SET (publish_via_partition_root = false)")
	r := e.launchRelay()
	select {
	case <-r.Done():
	case <-time.After(60 * time.Second):
		t.Fatal("relay still running with a publication not through the root")
	}
	want := `ALTER PUBLICATION \"` + e.Pub + `\" SET (publish_via_partition_root = true)` // JSON-escaped quotes
	if !strings.Contains(r.log(), want) {
		t.Fatalf("relay log does not name %q:\n%s", want, r.LogTail(2000))
	}
}
