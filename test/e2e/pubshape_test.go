//go:build e2e

package e2e

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/preflight"
)

// The column list: every column of the outbox but headers (and
// the identity columns of migration 0006).
const strippedColumns = "(id, aggregate_type, aggregate_id, event_type, payload, created_at)"

// insertTenantRow writes one outbox row with headers {"tenant_id": "acme"}
// under aggregate id.
// (A generated headers column, still generated, computes them from the
// payload's meta.)
func (e *env) insertTenantRow(t *testing.T, id string) {
	t.Helper()
	var gen string
	if err := e.DB.QueryRow(context.Background(), "SELECT attgenerated::text FROM pg_attribute WHERE attrelid = $1::regclass AND attname = 'headers'",
		e.Table).Scan(&gen); err != nil {
		t.Fatal(err)
	}
	if gen != "" {
		mustExec(t, e, "INSERT INTO "+e.Table+` (aggregate_type, aggregate_id, event_type, payload)
			VALUES ('order', $1, 'created', '{"meta": {"tenant_id": "acme"}}')`, id)
		return
	}
	mustExec(t, e, "INSERT INTO "+e.Table+` (aggregate_type, aggregate_id, event_type, payload, headers)
		VALUES ('order', $1, 'created', '{}', '{"tenant_id": "acme"}')`, id)
}

// A publication that drops or strips the outbox's inserts (a column list
// leaving headers out, a row filter, a generated headers column, publish
// without insert) is refused at start with the ALTER PUBLICATION that fixes it, and `check` fails naming
// the same statement; run as printed, it lets the relay start and publish
// the row whole, headers included.
func TestPublicationShapeRefused(t *testing.T) {
	t.Parallel() // its own outboxes, no service fault
	for _, tc := range []struct {
		name  string
		alter func(e *env) string
		what  string // in the refusal and the check's value
		fix   func(e *env) string
	}{
		{"column list", func(e *env) string {
			return "ALTER PUBLICATION " + e.Pub + " SET TABLE " + e.Table + " " + strippedColumns
		},
			"streams only the columns (id, aggregate_type, aggregate_id, event_type, payload, created_at)",
			func(e *env) string { return `ALTER PUBLICATION "` + e.Pub + `" SET TABLE "` + e.Schema + `"."outbox";` }},
		{"row filter", func(e *env) string {
			return "ALTER PUBLICATION " + e.Pub + " SET TABLE " + e.Table + " WHERE (aggregate_type <> 'audit')"
		}, "has a row filter on", func(e *env) string { return `ALTER PUBLICATION "` + e.Pub + `" SET TABLE "` + e.Schema + `"."outbox";` }},
		{"generated headers", func(e *env) string {
			return "ALTER TABLE " + e.Table + " DROP COLUMN headers, ADD COLUMN headers JSONB GENERATED ALWAYS AS (payload -> 'meta') STORED"
		}, "which the relay reads, is a", func(e *env) string {
			if e.pgVersion(e.t) >= 180000 {
				return `ALTER PUBLICATION "` + e.Pub + `" SET (publish_generated_columns = stored);`
			}
			return `ALTER TABLE "` + e.Schema + `"."outbox" ALTER COLUMN "headers" DROP EXPRESSION;`
		}},
		{"publish update only", func(e *env) string { return "ALTER PUBLICATION " + e.Pub + " SET (publish = 'update')" },
			"does not publish inserts", func(e *env) string { return `ALTER PUBLICATION "` + e.Pub + `" SET (publish = 'insert');` }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, "pubshape")
			mustExec(t, e, tc.alter(e))
			fix := tc.fix(e)

			code, out := e.runRelayToExit(2 * time.Minute)
			out = unescaped(out)
			if code == 0 || !strings.Contains(out, tc.what) || !strings.Contains(out, strings.TrimSuffix(fix, ";")) {
				t.Fatalf("relay exited %d; want a refusal saying %q and naming %s:\n%s", code, tc.what, fix, tail([]byte(out), 3000))
			}
			r, _ := e.runCheck(t, "")
			c := checkNamed(t, r, "publication")
			if c.Verdict != preflight.Fail || !strings.Contains(c.Value, tc.what) || !strings.Contains(c.Fix, fix) {
				t.Fatalf("check publication = %s %q, fix %q; want Fail saying %q with fix %s", c.Verdict, c.Value, c.Fix, tc.what, fix)
			}

			// The fix, run as printed, is the right one.
			mustExec(t, e, strings.TrimSuffix(c.Fix, ";"))
			if r, _ := e.runCheck(t, ""); checkNamed(t, r, "publication").Verdict == preflight.Fail {
				t.Fatalf("check still fails after its own fix: %+v", checkNamed(t, r, "publication"))
			}
			rl := e.startRelay()
			e.insertTenantRow(t, "whole")
			rs := consume(t, []string{e.Prefix + ".order"}, 1, 60*time.Second, 2*time.Second)
			if len(rs) != 1 || !strings.Contains(rs[0].Headers["tenant_id"], "acme") {
				t.Fatalf("after the fix: %d records, want 1 with header tenant_id acme: %+v", len(rs), rs)
			}
			rl.stop(syscall.SIGTERM, 30*time.Second)
		})
	}
}

// A column list that leaves headers out, added while the relay runs: the
// next horizon sample pauses retention naming the fix, and the relay stops
// before it publishes any event without its headers (the Relation message
// lacks the column the previous one had); at its next start it refuses.
// The same holds for a relay idle since its start (the columns it checked
// at start): the second relay here publishes nothing before the change.
func TestPublicationColumnListAddedWhileRunning(t *testing.T) {
	t.Parallel() // its own outboxes, no service fault
	for _, tc := range []struct {
		name       string
		warmFirst  bool // publish one row before the change (a Relation seen)
		wantBefore int
	}{
		{"after a row", true, 1},
		{"idle since start", false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, "pubcols")
			r := e.startRelay()
			topic := e.Prefix + ".order"
			if tc.warmFirst {
				e.insertTenantRow(t, "before")
				consume(t, []string{topic}, 1, 60*time.Second, 0)
			}
			mustExec(t, e, "ALTER PUBLICATION "+e.Pub+" SET TABLE "+e.Table+" "+strippedColumns)
			fix := `ALTER PUBLICATION "` + e.Pub + `" SET TABLE "` + e.Schema + `"."outbox"`
			waitFor(t, 30*time.Second, "retention paused on the column list", func() bool {
				p := e.pausedReason(t)
				return strings.Contains(p, "streams only the columns") && strings.Contains(p, fix)
			})
			if p := r.metric("outbox_relay_retention_paused"); p != 1 {
				t.Errorf("outbox_relay_retention_paused = %v with a column list, want 1", p)
			}
			if !strings.Contains(r.log(), "retention paused: the publication drops or strips outbox inserts") {
				t.Errorf("no error logged for the pause:\n%s", tail([]byte(r.log()), 2000))
			}

			e.insertTenantRow(t, "stripped")
			rs := consume(t, []string{topic}, tc.wantBefore+1, 15*time.Second, 3*time.Second)
			for _, rec := range rs {
				if rec.Key == "stripped" {
					t.Fatalf("the row written under the column list was published, headers %v (want tenant_id)", rec.Headers)
				}
			}
			if len(rs) != tc.wantBefore {
				t.Fatalf("%d records, want %d", len(rs), tc.wantBefore)
			}
			waitFor(t, 60*time.Second, "the relay stops at the stripped Relation", func() bool { return !r.running() })
			if log := unescaped(r.log()); !strings.Contains(log, "outbox column not streamed") || !strings.Contains(log, `column "headers"`) || !strings.Contains(log, fix) {
				t.Errorf("the relay's last words do not name the column and the fix %s:\n%s", fix, tail([]byte(log), 3000))
			}

			code, out := e.runRelayToExit(2 * time.Minute)
			if out = unescaped(out); code == 0 || !strings.Contains(out, fix) {
				t.Fatalf("restarted relay exited %d, want a refusal naming %s:\n%s", code, fix, tail([]byte(out), 3000))
			}
			c := checkNamed(t, must(e.runCheck(t, "")), "publication")
			if c.Verdict != preflight.Fail || !strings.Contains(c.Fix, fix) {
				t.Fatalf("check publication = %s %q, fix %q; want Fail with %s", c.Verdict, c.Value, c.Fix, fix)
			}
			var rows int
			if err := e.DB.QueryRow(context.Background(), "SELECT count(*) FROM "+e.Table+" WHERE aggregate_id = 'stripped'").Scan(&rows); err != nil || rows != 1 {
				t.Fatalf("the stripped row: %d left (%v), want 1 kept for replay", rows, err)
			}
		})
	}
}

func must(r preflight.Report, _ string) preflight.Report { return r }

// pgVersion is the server's server_version_num.
func (e *env) pgVersion(t *testing.T) int {
	t.Helper()
	var v int
	if err := e.DB.QueryRow(context.Background(), "SELECT current_setting('server_version_num')::int").Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// unescaped undoes the JSON log's escaping of double quotes, so the SQL
// the relay logged reads as printed.
func unescaped(log string) string { return strings.ReplaceAll(log, `\"`, `"`) }
