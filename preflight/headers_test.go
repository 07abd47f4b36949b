package preflight

import (
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/deadletter"
	"github.com/outbox-relay/outbox-relay/outboxschema"
	"github.com/outbox-relay/outbox-relay/outboxschema/headernametest"
	"github.com/outbox-relay/outbox-relay/report"
)

// check judges every header name as the relay does: what it dead-letters
// for a reserved header is reserved_header, a bad name bad_row, the rest
// is not reported.
func TestJudgeHeaderNameMatchesRule(t *testing.T) {
	t.Parallel()
	for _, c := range headernametest.Cases {
		n := HeaderName{Name: c.Name}
		refused := judgeHeaderName(&n, nil)
		want := map[headernametest.Verdict]string{headernametest.OK: "", headernametest.Bad: deadletter.ReasonBadRow,
			headernametest.Reserved: deadletter.ReasonReservedHeader}[c.Verdict]
		if refused != (want != "") || n.Reason != want {
			t.Errorf("header name %q: refused %v, reason %q; want %s (%q)", c.Name, refused, n.Reason, c.Verdict, want)
		}
	}
	n := HeaderName{Name: "ID"}
	if !judgeHeaderName(&n, []string{"id"}) || n.Reason != deadletter.ReasonReservedHeader {
		t.Errorf("ID with compat: debezium's id reserved: %+v", n)
	}
}

func TestHeaderChecks(t *testing.T) {
	t.Parallel()
	bad := func(name string, rows int64, id string) HeaderName {
		n := HeaderName{Name: name, Rows: rows, Example: id}
		judgeHeaderName(&n, nil)
		return n
	}
	reads := []HeaderNamesRead{
		{Table: "public.outbox", Suspects: 3, Refused: []HeaderName{bad("event_id ", 3, "17"), bad("pg_lſn", 1, "20")}},
		{Table: "public.other", Suspects: 1},
		{Table: "public.nohdr", NoColumn: true},
		{Table: "public.gone", Skipped: "it does not exist"},
		{Table: "public.locked", Err: "permission denied for table locked", SQL: "SELECT ..."},
	}
	for _, halts := range []bool{false, true} {
		var cs []report.Check
		o := opts()
		o.PoisonHalts = halts
		headerChecks(o, reads, func(name string, v report.Verdict, value, fix string) {
			cs = append(cs, report.Check{Name: name, Verdict: v, Value: value, Fix: fix})
		})
		want := Warn
		if halts {
			want = Fail
		}
		if len(cs) != 5 {
			t.Fatalf("halts=%v: %d lines, want 5: %+v", halts, len(cs), cs)
		}
		for i, w := range []struct {
			v    report.Verdict
			subs []string
		}{
			{want, []string{"public.outbox: 3 rows, e.g. id=17", `header name "event_id " ends with whitespace (U+0020)`, "(bad_row)"}},
			{want, []string{"public.outbox: 1 row, e.g. id=20", `header name "pg_lſn" is reserved`, "(reserved_header)"}},
			{OK, []string{"public.other: no header name the relay refuses"}},
			{Skip, []string{"public.gone: not read (it does not exist)"}},
			{Warn, []string{"public.locked: could not read", "permission denied"}},
		} {
			c := cs[i]
			if c.Name != "headers" || c.Verdict != w.v {
				t.Errorf("halts=%v line %d: %s %s, want headers %s", halts, i, c.Name, c.Verdict, w.v)
			}
			for _, s := range w.subs {
				if !strings.Contains(c.Value, s) {
					t.Errorf("halts=%v line %d: %q, want it to contain %q", halts, i, c.Value, s)
				}
			}
		}
		if !strings.Contains(cs[0].Fix, "rename the header in the writer") || !strings.Contains(cs[4].Fix, "SELECT ...") {
			t.Errorf("fixes: %q, %q", cs[0].Fix, cs[4].Fix)
		}
	}
	// Many refused names: maxLines lines, then one naming the rest.
	var many []HeaderName
	for i := range maxLines + 5 {
		many = append(many, bad(strings.Repeat(" ", i+1), 1, "1"))
	}
	var n int
	var last string
	headerChecks(opts(), []HeaderNamesRead{{Table: "public.outbox", Refused: many}}, func(_ string, _ report.Verdict, value, _ string) {
		n++
		last = value
	})
	if n != maxLines+1 || !strings.Contains(last, "and 5 more refused header names") {
		t.Errorf("%d lines, last %q", n, last)
	}
}

// The query reads the headers column as jsonb, the suspects only, with
// the dead-lettered rows left out of the relay's own table.
func TestHeaderSQL(t *testing.T) {
	t.Parallel()
	r := Route{Table: outboxschema.Table{Schema: "app", Name: "Outbox"}, Headers: "hdrs", ID: "event_id"}
	q := headerSQL(r, true)
	for _, s := range []string{`FROM "app"."Outbox" o`, `jsonb_object_keys(CASE WHEN jsonb_typeof(o."hdrs"::jsonb) = 'object' THEN o."hdrs"::jsonb END) k`,
		`min(o."event_id"::text)`, `o."dead_lettered_at" IS NULL`, `k COLLATE "C" !~ '^[!-~]([ -~]*[!-~])?$'`, "= ANY($1)", "= 'dlq.'", "LIMIT 1001"} {
		if !strings.Contains(q, s) {
			t.Errorf("query %s\nlacks %s", q, s)
		}
	}
	if strings.Contains(headerSQL(r, false), "dead_lettered_at") {
		t.Error("a mapped table's query filters on dead_lettered_at")
	}
}
