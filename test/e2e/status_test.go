//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"net/url"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/outboxschema"
	checkreport "github.com/outbox-relay/outbox-relay/report"
	"github.com/outbox-relay/outbox-relay/retention"
	"github.com/outbox-relay/outbox-relay/status"
	"github.com/outbox-relay/outbox-relay/test/testkit"
)

// statusJSON runs `outbox-relay status --json` with the env's config and
// parses its report.
func (e *env) statusJSON(t *testing.T, args ...string) status.Report {
	t.Helper()
	code, out := e.cli(append([]string{"status", "--json"}, args...)...)
	var r status.Report
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("status --json %v: exit %d, output not JSON: %v\n%s", args, code, err, out)
	}
	if r.ExitCode != code {
		t.Fatalf("status exited %d, its report says %d\n%s", code, r.ExitCode, out)
	}
	return r
}

func statusCheck(t *testing.T, r status.Report, name string) checkreport.Check {
	t.Helper()
	for _, c := range r.Checks {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no check %q in %+v", name, r.Checks)
	return checkreport.Check{}
}

// `outbox-relay status` reads PostgreSQL only: with no relay running it says
// rows wait and nothing delivers them; with a relay leading and the horizon
// fresh every check is ok (exit 0); a dead-lettered row, an event newer than
// the horizon, a dropped slot and a missing migration each get their
// verdict and the command that fixes them.
func TestStatus(t *testing.T) {
	t.Parallel() // own outbox, relay and topics; no service fault, no shared proxy
	e := newEnv(t, "status")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	tbl, err := outboxschema.ParseTable(e.Table)
	if err != nil {
		t.Fatal(err)
	}
	h := retention.Horizon{Table: tbl, Slot: e.Slot}
	conn, err := pgx.Connect(ctx, pgURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	// The test samples the horizon itself, as the leader's sampler does.
	advance := func() retention.State {
		st, _, err := h.Advance(ctx, conn)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	// freshHorizon waits until the horizon proves row id and was sampled
	// within the last few seconds.
	freshHorizon := func(id int64) {
		t.Helper()
		waitFor(t, 60*time.Second, "a fresh horizon proving row "+strconv.FormatInt(id, 10), func() bool {
			if err := e.WaitConfirmed(ctx, e.currentLSN(t), 30*time.Second); err != nil {
				t.Fatal(err)
			}
			st := advance()
			ok, _, err := h.IsDelivered(ctx, conn, st, id)
			if err != nil {
				t.Fatal(err)
			}
			return ok && time.Since(st.DeliveredAt) < 10*time.Second
		})
	}
	insert := func() int64 { return e.insertRow(t, "order", "order-1", "order.created", `{}`, `{}`) }

	// 1. No relay has run; rows are written.
	first := insert()
	for range 4 {
		insert()
	}
	advance()
	r := e.statusJSON(t)
	if r.ExitCode != checkreport.ExitBad || r.Verdict != status.Bad {
		t.Errorf("no relay: exit %d verdict %s, want %d bad", r.ExitCode, r.Verdict, checkreport.ExitBad)
	}
	if c := statusCheck(t, r, "undelivered"); c.Verdict != status.Bad || !strings.Contains(c.Fix, "outbox-relay run") ||
		r.Facts.Delivery.Undelivered == nil || *r.Facts.Delivery.Undelivered != 5 {
		t.Errorf("no relay: undelivered %+v, facts %+v", c, r.Facts.Delivery)
	}
	for _, name := range []string{"leader", "slot.active"} {
		if c := statusCheck(t, r, name); c.Verdict != status.Bad || !strings.Contains(c.Fix, "outbox-relay run") {
			t.Errorf("no relay: %+v, want bad with `outbox-relay run`", c)
		}
	}
	if c := statusCheck(t, r, "slot"); c.Verdict != status.OK || r.Facts.SlotInfo.WALStatus != "reserved" || r.Facts.SlotInfo.ActivePID != nil {
		t.Errorf("no relay: slot %+v facts %+v", c, r.Facts.SlotInfo)
	}
	// Text for a terminal, and no password in it even when PostgreSQL
	// cannot be reached.
	code, out := e.cli("status")
	u, err := url.Parse(pgURL)
	if err != nil {
		t.Fatal(err)
	}
	pw, _ := u.User.Password()
	if code != checkreport.ExitBad || !strings.Contains(out, "\nundelivered ") || !strings.Contains(out, "BAD (exit 3)") || (pw != "" && strings.Contains(out, pw)) {
		t.Errorf("text status: exit %d\n%s", code, out)
	}
	down := *u
	down.Host = freePort(t)
	down.User = url.UserPassword(u.User.Username(), "s3cret-status-pw")
	code, out, err = testkit.Run(ctx, os.Environ(), relayBin, append(append([]string{"status"}, e.flags()...), "--postgres-url", down.String())...)
	if err != nil {
		t.Fatal(err)
	}
	if code != checkreport.ExitBad || !strings.Contains(out, "postgres  BAD") || strings.Contains(out, "s3cret-status-pw") {
		t.Errorf("postgres down: exit %d\n%s", code, out)
	}

	// 2. A relay leads and the horizon is fresh: every check is ok.
	dlq := e.Prefix + ".dlq"
	rel := e.startRelay("--dlq-topic", dlq, "--dlq-max-attempts", "1")
	last := insert()
	freshHorizon(last)
	r = e.statusJSON(t)
	if r.ExitCode != checkreport.ExitOK {
		t.Errorf("healthy relay: exit %d, checks %+v", r.ExitCode, r.Checks)
	}
	f := r.Facts
	if f.Leader.Holder == "" || f.Leader.Epoch < 1 || f.Leader.RenewedAge > 5 ||
		f.SlotInfo.ActivePID == nil || f.SlotInfo.LagBytes == nil || *f.SlotInfo.LagBytes < 0 || *f.SlotInfo.LagBytes > 16<<20 || !f.SlotInfo.Registered ||
		f.Delivery.LagSecondsBound == nil || *f.Delivery.LagSecondsBound > 15 || f.Delivery.PreSlotRows == nil || *f.Delivery.PreSlotRows != 0 ||
		f.DLQ.Unresolved != 0 || f.Oldest.Empty || f.Oldest.AgeSeconds > 600 {
		b, _ := json.MarshalIndent(f, "", "  ")
		t.Errorf("healthy relay: facts not sane:\n%s", b)
	}
	code, out = e.cli("status")
	if code != checkreport.ExitOK || !strings.Contains(out, "OK (exit 0)") {
		t.Errorf("healthy relay, text: exit %d\n%s", code, out)
	}
	r = e.statusJSON(t, "--id", strconv.FormatInt(first, 10))
	if r.ExitCode != checkreport.ExitOK || r.Facts.Event == nil || !r.Facts.Event.Delivered || r.Facts.Event.Reason != status.ReasonHorizon {
		t.Errorf("--id %d (delivered): exit %d event %+v checks %+v", first, r.ExitCode, r.Facts.Event, r.Checks)
	}

	// 3. A poison row is dead-lettered: the DLQ line counts it.
	poison := e.insertRow(t, "order", "order-1", "order.created", `{}`, `["not", "an", "object"]`)
	waitFor(t, 30*time.Second, "the poison row dead-lettered", func() bool {
		var dead bool
		if err := e.DB.QueryRow(ctx, "SELECT dead_lettered_at IS NOT NULL FROM "+e.Table+" WHERE id = $1", poison).Scan(&dead); err != nil {
			t.Fatal(err)
		}
		return dead
	})
	freshHorizon(poison)
	r = e.statusJSON(t)
	if c := statusCheck(t, r, "dlq"); c.Verdict != status.Warn || r.Facts.DLQ.Unresolved != 1 || !strings.Contains(c.Fix, "outbox-relay dlq list") || r.ExitCode != checkreport.ExitWarn {
		t.Errorf("dead-lettered row: dlq %+v, facts %+v, exit %d, checks %+v", c, r.Facts.DLQ, r.ExitCode, r.Checks)
	}

	// 4. The relay stops; a row written now is not delivered.
	if code := rel.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
		t.Fatalf("relay exit %d", code)
	}
	fresh := insert()
	r = e.statusJSON(t, "--id", strconv.FormatInt(fresh, 10))
	if r.ExitCode != checkreport.ExitWarn || r.Facts.Event.Delivered || r.Facts.Event.Reason != status.ReasonNewer {
		t.Errorf("--id %d (undelivered): exit %d event %+v", fresh, r.ExitCode, r.Facts.Event)
	}
	r = e.statusJSON(t)
	if c := statusCheck(t, r, "undelivered"); r.ExitCode != checkreport.ExitBad || c.Verdict != status.Bad || *r.Facts.Delivery.Undelivered < 1 {
		t.Errorf("relay stopped: exit %d undelivered %+v facts %+v", r.ExitCode, c, r.Facts.Delivery)
	}

	// 5. The slot is dropped: bad, with the replay from the horizon.
	if err := testkit.DropSlot(ctx, e.DB, e.Slot); err != nil {
		t.Fatal(err)
	}
	r = e.statusJSON(t)
	since := "outbox-relay replay --since " + r.Facts.Delivery.DeliveredAt.UTC().Format(time.RFC3339)
	if c := statusCheck(t, r, "slot"); r.ExitCode != checkreport.ExitBad || c.Verdict != status.Bad || !strings.Contains(c.Value, "dropped") || !strings.Contains(c.Fix, since) {
		t.Errorf("dropped slot: exit %d slot %+v, want bad with %q", r.ExitCode, c, since)
	}

	// 6. Without migration 0005's table: a migrate line, not a crash.
	mustExec(t, e, "DROP TABLE "+tbl.Sibling(outboxschema.DeliveryTable).Quoted())
	code, out = e.cli("status")
	if code != checkreport.ExitBad || !strings.Contains(out, "run `outbox-relay migrate` with this config (migration 0005") {
		t.Errorf("no delivery table: exit %d\n%s", code, out)
	}
	r = e.statusJSON(t, "--id", strconv.FormatInt(first, 10))
	if r.ExitCode != checkreport.ExitBad || !strings.Contains(r.Checks[0].Fix, "outbox-relay migrate") {
		t.Errorf("no delivery table, --id: exit %d %+v", r.ExitCode, r.Checks)
	}
}
