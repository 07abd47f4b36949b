//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/preflight"
	"github.com/outbox-relay/outbox-relay/test/testkit"
)

// nextXID is the next xid to be assigned: every transaction committed
// before the call has a lower one.
func (e *env) nextXID(t *testing.T) int64 {
	t.Helper()
	var x int64
	if err := e.DB.QueryRow(context.Background(), "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint").Scan(&x); err != nil {
		t.Fatal(err)
	}
	return x
}

// deliveredXID is the slot's delivered horizon (0 before the first
// promotion).
func (e *env) deliveredXID(t *testing.T) int64 {
	t.Helper()
	var x *int64
	err := e.DB.QueryRow(context.Background(), "SELECT delivered_xid::text::bigint FROM "+e.Schema+".outbox_relay_delivery WHERE slot_name = $1", e.Slot).Scan(&x)
	if err != nil || x == nil {
		return 0
	}
	return *x
}

func (e *env) countIn(t *testing.T, from string) int64 {
	t.Helper()
	var n int64
	if err := e.DB.QueryRow(context.Background(), "SELECT count(*) FROM "+from).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// The issue's inheritance child: `CREATE TABLE outbox_legacy () INHERITS
// (outbox)`, 5 rows into the child, retention.keep 2s. The child's inserts
// are not streamed as the outbox's; retention read the outbox without ONLY
// and deleted them as delivered. Now retention pauses naming the child, the
// 5 rows are still there after 12 s, a restarted relay refuses to start
// naming the child and the SQL that fixes it, `check` fails with that SQL,
// and once it has run the relay starts and publishes the 5 events.
func TestRetentionInheritanceChild(t *testing.T) {
	e := newEnv(t, "inherit")
	ctx := context.Background()
	r := e.startRelay("--retention-keep", "2s", "--retention-interval", "1s")
	child := e.Schema + ".outbox_legacy"
	mustExec(t, e, "CREATE TABLE "+child+" () INHERITS ("+e.Table+")")
	for i := 0; i < 5; i++ {
		mustExec(t, e, "INSERT INTO "+child+" (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', $1, 'legacy', '{}')", fmt.Sprintf("legacy-%d", i))
	}
	// Events through the outbox itself, so the slot and the horizon move
	// on past the child's rows.
	w := e.newWriter(371)
	if err := w.run(ctx, 10, 2, 5, 0, ""); err != nil {
		t.Fatal(err)
	}
	written := time.Now()
	for time.Since(written) < 12*time.Second {
		if n := e.countIn(t, "ONLY "+child); n != 5 {
			t.Fatalf("%d of the 5 rows of the inheritance child left %s after they were written (keep 2s): retention deleted rows it never streamed; delivery state: %s",
				n, time.Since(written).Round(time.Second), e.deliveryState(t))
		}
		time.Sleep(200 * time.Millisecond)
	}
	if p := r.metric("outbox_relay_retention_paused"); p != 1 {
		t.Errorf("outbox_relay_retention_paused = %v with an inheritance child, want 1", p)
	}
	if !strings.Contains(r.log(), "retention paused") || !strings.Contains(r.log(), "outbox_legacy") {
		t.Errorf("no log line says retention paused naming the child:\n%s", r.LogTail(3000))
	}
	r.stop(syscall.SIGTERM, 30*time.Second)

	code, out := e.runRelayToExit(60 * time.Second)
	if code == 0 || !strings.Contains(out, "inheritance children ("+child+")") || !strings.Contains(out, "NO INHERIT") {
		t.Fatalf("the relay did not refuse to start naming the child and the fix (exit %d):\n%s", code, out)
	}
	t.Logf("the relay refused to start: %s", testkit.Tail(out, 1500))
	rep, raw := e.runCheck(t, "")
	c := checkNamed(t, rep, "inheritance")
	if c.Verdict != preflight.Fail || !strings.Contains(c.Value, child) || !strings.Contains(c.Fix, "NO INHERIT") || rep.ExitCode == 0 {
		t.Fatalf("check does not fail naming the child and the fix: %+v\n%s", c, raw)
	}
	t.Logf("check: inheritance %s: %s -> %s", c.Verdict, c.Value, c.Fix)
	// The fix check names, run as given, publishes the 5 events.
	fix := c.Fix[:strings.Index(c.Fix, "COMMIT;")+len("COMMIT;")]
	mustExec(t, e, fix)
	if rep, raw := e.runCheck(t, ""); checkNamed(t, rep, "inheritance").Verdict != preflight.OK {
		t.Fatalf("check still fails after the fix:\n%s", raw)
	}
	r = e.startRelay("--retention-keep", "2s", "--retention-interval", "1s")
	defer r.stop(syscall.SIGTERM, 30*time.Second)
	rs := consume(t, e.topics(), 15, 60*time.Second, 3*time.Second)
	legacy := 0
	for _, rec := range rs {
		if strings.HasPrefix(rec.Key, "legacy-") {
			legacy++
		}
	}
	if legacy != 5 {
		t.Errorf("%d of the child's 5 events published after the fix, want 5", legacy)
	}
}

// The attached partition: rows loaded into a standalone table,
// then attached to a partitioned outbox (a range past retention.keep). The
// slot never streamed them, yet their xids fall in the delivered horizon:
// retention dropped the partition whole. Now it is kept once the horizon
// has passed those xids and retention has run, and `cleanup --dry-run`
// says why and which replay publishes them.
func TestRetentionAttachedPartition(t *testing.T) {
	t.Setenv("OUTBOX_RELAY_PARTITION", "daily")
	e := newEnv(t, "attach")
	ctx := context.Background()
	r := e.startRelay("--retention-keep", "3s", "--retention-interval", "1s")
	defer r.stop(syscall.SIGTERM, 30*time.Second)
	old := time.Now().UTC().AddDate(0, 0, -3).Truncate(24 * time.Hour)
	loaded := e.Schema + ".outbox_loaded"
	mustExec(t, e, "CREATE TABLE "+loaded+" (LIKE "+e.Table+" INCLUDING DEFAULTS)")
	mustExec(t, e, "INSERT INTO "+loaded+" (aggregate_type, aggregate_id, event_type, payload, created_at) SELECT 'order', 'loaded-' || g, 'loaded', '{}', $1 FROM generate_series(1, 5) g",
		old.Add(time.Hour))
	mustExec(t, e, "ALTER TABLE "+e.Table+" ATTACH PARTITION "+loaded+" FOR VALUES FROM ('"+old.Format(time.RFC3339)+"') TO ('"+old.AddDate(0, 0, 1).Format(time.RFC3339)+"')")
	after := e.nextXID(t)
	w := e.newWriter(372)
	if err := w.run(ctx, 10, 2, 5, 0, ""); err != nil {
		t.Fatal(err)
	}
	// The horizon passes the loaded rows' xids, then two retention runs.
	waitFor(t, 60*time.Second, "the delivered horizon past the attach", func() bool { return e.deliveredXID(t) > after })
	proven := time.Now()
	waitFor(t, 30*time.Second, "a retention run 2s after", func() bool { return e.lastRun(t).After(proven.Add(2 * time.Second)) })
	if !e.exists(t, loaded) {
		t.Fatalf("partition %s, attached with 5 rows the slot never streamed, was dropped as delivered", loaded)
	}
	if n := e.countIn(t, loaded); n != 5 {
		t.Fatalf("%d of the 5 rows loaded before the attach left", n)
	}
	if !strings.Contains(r.log(), "partition kept") {
		t.Errorf("no log line says the partition is kept")
	}
	code, out := e.cleanup(t, "--dry-run", "--retention-keep", "3s")
	if code != 0 {
		t.Fatalf("cleanup --dry-run: exit %d\n%s", code, out)
	}
	t.Logf("cleanup --dry-run:\n%s", out)
	for _, want := range []string{"partition " + loaded + " (5 rows) is kept", "before it was attached", "outbox-relay replay --from-id",
		"5 rows older than keep were written into a partition before it was attached"} {
		if !strings.Contains(out, want) {
			t.Errorf("cleanup --dry-run does not say %q:\n%s", want, out)
		}
	}
}
