//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/outboxschema"
	"github.com/outbox-relay/outbox-relay/outboxschema/headernametest"
	"github.com/outbox-relay/outbox-relay/test/testkit"
)

// One rule for header names, end to end: for every name of
// headernametest.Cases (the "event_id " with a trailing space, its
// tab variant, the empty name and pg_lſn among them) a row written with
// headers {name: "x"} is published with that header exactly when
// outbox.Write accepts the name, and dead-lettered otherwise, with reason
// bad_row (a bad name) or reserved_header (the relay's own name) and a
// dlq.error quoting the name; check, run on the same rows before the relay
// reads them, names every refused one and no other; the good rows written
// around them all arrive.
func TestHeaderNameRule(t *testing.T) {
	t.Parallel() // own outbox, relay and topics; no service fault, no shared proxy
	e := newEnv(t, "hdrname")
	ctx := context.Background()
	dlq := e.Prefix + ".dlq"
	hdrTopic := e.Prefix + ".hdr"

	// outbox.Write's verdict on each name, in a transaction rolled back.
	w, err := outbox.NewWriter(outbox.WithTable(e.Table))
	if err != nil {
		t.Fatal(err)
	}
	writeVerdict := func(name string) headernametest.Verdict {
		tx, err := e.DB.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		err = w.Write(ctx, tx, outbox.Event{AggregateType: "hdr", AggregateID: "w", EventType: "E", Payload: json.RawMessage(`{}`),
			Headers: map[string]string{name: "x"}})
		var he *outboxschema.HeaderNameError
		switch {
		case err == nil:
			return headernametest.OK
		case !errors.As(err, &he):
			t.Errorf("outbox.Write with header name %q: %v, want a header-name error or none", name, err)
			return "refused otherwise"
		case he.Reserved != "":
			return headernametest.Reserved
		}
		return headernametest.Bad
	}

	gen := e.newWriter(97)
	if err := gen.run(ctx, 30, 5, 10, 0, ""); err != nil {
		t.Fatal(err)
	}
	// The rows of the cases PostgreSQL can store (not the NUL, not the
	// bytes that are not UTF-8: outbox.Write refuses those too, below).
	type caseRow struct {
		headernametest.Case
		id int64
	}
	rows := map[int64]caseRow{}
	byAggID := map[string]caseRow{}
	var want struct{ ok, bad, reserved int }
	for i, c := range headernametest.Cases {
		if got := writeVerdict(c.Name); got != c.Verdict {
			t.Errorf("outbox.Write with header name %q: %s, want %s", c.Name, got, c.Verdict)
		}
		if !utf8.ValidString(c.Name) || strings.ContainsRune(c.Name, 0) {
			continue
		}
		aggID := fmt.Sprintf("case-%d", i)
		id := e.insertRow(t, "hdr", aggID, "E", `{}`, headernametest.Headers(c.Name, "x"))
		rows[id] = caseRow{c, id}
		byAggID[aggID] = rows[id]
		switch c.Verdict {
		case headernametest.OK:
			want.ok++
		case headernametest.Bad:
			want.bad++
		default:
			want.reserved++
		}
	}
	if err := gen.run(ctx, 30, 5, 10, 0, ""); err != nil {
		t.Fatal(err)
	}
	end := e.currentLSN(t)

	// check, before the relay reads (and dead-letters) the rows.
	rep, out := e.runCheck(t, "", "--dlq-topic", dlq)
	var lines []string
	for _, c := range rep.Checks {
		if c.Name == "headers" {
			lines = append(lines, string(c.Verdict)+" "+c.Value+" -> "+c.Fix)
		}
	}
	all := strings.Join(lines, "\n")
	for _, r := range rows {
		q := strconv.Quote(r.Name) // a line of its own, or in the list of the rest
		named := strings.Contains(all, "header name "+q+" ") || strings.Contains(all, " "+q+",") || strings.Contains(all, " "+q+" -> ")
		if named != (r.Verdict != headernametest.OK) {
			t.Errorf("check on header name %q (%s): named %v\n%s", r.Name, r.Verdict, named, all)
		}
	}
	if !strings.Contains(all, `header name " event_id" starts with whitespace (U+0020); those rows are poison (bad_row), dead-lettered (on_poison: dlq)`) ||
		!strings.Contains(all, `header name "EVENT_ID" is reserved: the relay sets event_id,`) || !strings.Contains(all, "(reserved_header), dead-lettered") ||
		!strings.Contains(all, "more refused header names:") || !strings.Contains(all, "rename the header in the writer") {
		t.Errorf("check's headers lines:\n%s", all)
	}
	if t.Failed() {
		t.Logf("check:\n%s", out)
	}

	r := e.startRelay("--dlq-topic", dlq)
	ws := gen.written()
	requireClean(t, check(t, ws, consume(t, e.topics(), len(ws), 90*time.Second, 3*time.Second), e.partitions(t)), false)

	// The good names: published, the header as written, once.
	for _, m := range readRaw(t, []string{hdrTopic}, want.ok, 60*time.Second, 2*time.Second) {
		c, ok := byAggID[string(m.Key)]
		switch {
		case !ok:
			t.Errorf("record with key %q on %s: not a case row", m.Key, hdrTopic)
		case c.Verdict != headernametest.OK:
			var keys []string
			for _, h := range m.Headers {
				keys = append(keys, strconv.Quote(string(h.Key)))
			}
			t.Errorf("row with header name %q (%s) was published, headers %s", c.Name, c.Verdict, strings.Join(keys, ", "))
		case headerCount(m, c.Name) != 1 || headerValue(m, c.Name) != "x":
			t.Errorf("row with header name %q: published with %d such headers (value %q), want it once", c.Name, headerCount(m, c.Name), headerValue(m, c.Name))
		default:
			delete(byAggID, string(m.Key))
		}
	}
	// The refused names: dead-lettered with their reason and the name.
	for _, l := range readRaw(t, []string{dlq}, want.bad+want.reserved, 60*time.Second, 2*time.Second) {
		id, _ := strconv.ParseInt(headerValue(l, "dlq.event_id"), 10, 64)
		c, ok := rows[id]
		if !ok {
			t.Errorf("dead letter of id %d: not a case row", id)
			continue
		}
		wantReason := map[headernametest.Verdict]string{headernametest.Bad: "bad_row", headernametest.Reserved: "reserved_header"}[c.Verdict]
		msg := headerValue(l, "dlq.error")
		switch {
		case c.Verdict == headernametest.OK:
			t.Errorf("row %d with the good header name %q was dead-lettered: %s", id, c.Name, msg)
		case headerValue(l, "dlq.reason") != wantReason:
			t.Errorf("row %d with header name %q: dlq.reason %q, want %s (%s)", id, c.Name, headerValue(l, "dlq.reason"), wantReason, msg)
		case !strings.Contains(msg, strconv.Quote(c.Name)) || !strings.Contains(msg, "id="+strconv.FormatInt(id, 10)) || !strings.Contains(msg, "rename the key"):
			t.Errorf("row %d with header name %q: dlq.error %q, want it to quote the name, name the row and the fix", id, c.Name, msg)
		default:
			delete(byAggID, string(l.Key))
		}
	}
	for aggID, c := range byAggID {
		t.Errorf("row %d (%s) with header name %q (%s): neither published nor dead-lettered", c.id, aggID, c.Name, c.Verdict)
	}
	waitFor(t, 30*time.Second, "slot past the case rows", func() bool { return e.slotLSN(t) >= end })
	waitFor(t, 15*time.Second, "dead_lettered_total = the refused rows, by reason", func() bool {
		ss, err := r.Scrape()
		bad, _ := testkit.SumMetric(ss, "outbox_relay_dead_lettered_total", map[string]string{"reason": "bad_row"})
		res, _ := testkit.SumMetric(ss, "outbox_relay_dead_lettered_total", map[string]string{"reason": "reserved_header"})
		return err == nil && bad == float64(want.bad) && res == float64(want.reserved)
	})
}
