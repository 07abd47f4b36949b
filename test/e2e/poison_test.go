//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/test/testkit"
)

// createTopic creates a topic with one partition and the given configs, so
// a test can make the broker reject records (max.message.bytes).
func createTopic(t *testing.T, name string, configs map[string]string) {
	t.Helper()
	entries := map[string]*string{}
	for k, v := range configs {
		entries[k] = &v
	}
	if err := testkit.CreateTopics(brokers, 1, entries, name); err != nil {
		t.Fatal(err)
	}
}

// cli runs an outbox-relay subcommand with the env's config and returns its
// exit code and combined output.
func (e *env) cli(args ...string) (int, string) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	code, out, err := testkit.Run(ctx, os.Environ(), relayBin, append(args, e.flags()...)...)
	if err != nil {
		e.t.Fatalf("%v: %v", args, err)
	}
	return code, out
}

func (e *env) insertRow(t *testing.T, aggType, aggID any, eventType, payload, headers string) int64 {
	t.Helper()
	var id int64
	err := e.DB.QueryRow(context.Background(), "INSERT INTO "+e.Table+
		" (aggregate_type, aggregate_id, event_type, payload, headers) VALUES ($1, $2, $3, $4, $5) RETURNING id",
		aggType, aggID, eventType, payload, headers).Scan(&id)
	if err != nil {
		t.Fatalf("insert row: %v", err)
	}
	return id
}

// Every kind of poison event goes to the dead-letter topic with headers that
// say why, its row is marked, the good events around it (same aggregate,
// same topic) are all delivered in order, the slot moves on, and the
// operator can list, replay and resolve with the CLI.
func TestPoisonEventsAreDeadLetteredAndReplayable(t *testing.T) {
	t.Parallel() // own outbox, relay and topics; no service fault, no shared proxy
	e := newEnv(t, "poison")
	ctx := context.Background()
	dlq := e.Prefix + ".dlq"
	mustExec(t, e, "ALTER TABLE "+e.Table+" ALTER COLUMN aggregate_id DROP NOT NULL")
	createTopic(t, e.Prefix+".big", map[string]string{"max.message.bytes": "3000"})
	r := e.startRelay("--dlq-topic", dlq, "--dlq-max-attempts", "2", "--dlq-retry-backoff", "50ms", "--lag-poll-interval", "200ms")

	type poison struct {
		reason, errText string
		payload         string // "" when the dead letter carries none
		attempts        int
	}
	poisons := map[int64]poison{}
	big := `{"blob":"` + strings.Repeat("x", 5000) + `"}`
	steps := []func(){
		func() {
			id := e.insertRow(t, "order", "order-1", "order.updated", `{"n": 1}`, `["not", "an", "object"]`)
			poisons[id] = poison{"bad_row", `column "headers"`, `{"n": 1}`, 1}
		},
		func() {
			id := e.insertRow(t, "order", nil, "order.updated", `{"n": 2}`, `{}`)
			poisons[id] = poison{"bad_row", `column "aggregate_id": is NULL`, `{"n": 2}`, 1}
		},
		func() {
			id := e.insertRow(t, "bad topic!", "order-1", "order.updated", `{"n": 3}`, `{}`)
			poisons[id] = poison{"invalid_topic", "Kafka allows only", `{"n": 3}`, 1}
		},
		func() {
			id := e.insertRow(t, "big", "order-1", "big.updated", big, `{}`)
			poisons[id] = poison{"message_too_large", "too large", "", 1} // refused alone: at the first answer
		},
		func() { // a required column dropped while running, then restored
			mustExec(t, e, "ALTER TABLE "+e.Table+" DROP COLUMN event_type")
			var id int64
			if err := e.DB.QueryRow(ctx, "INSERT INTO "+e.Table+" (aggregate_type, aggregate_id, payload) VALUES ('order', 'order-1', '{\"n\": 5}') RETURNING id").Scan(&id); err != nil {
				t.Fatal(err)
			}
			poisons[id] = poison{"bad_row", `column "event_type": is missing from the table`, `{"n": 5}`, 1}
			mustExec(t, e, "ALTER TABLE "+e.Table+" ADD COLUMN event_type TEXT")
		},
	}
	w := e.newWriter(11)
	for _, step := range append(steps, func() {}) {
		if err := w.run(ctx, 100, 5, 10, 0, ""); err != nil {
			t.Fatal(err)
		}
		step()
	}
	end := e.currentLSN(t)

	rs := consume(t, e.topics(), len(w.written()), 90*time.Second, 3*time.Second)
	// The broker refuses the big event alone in its batch (its topic has
	// no other events): a refusal that cannot change on retry, so it is
	// dead-lettered at the first answer, without a rewind (issue 36).
	requireClean(t, check(t, w.written(), rs, e.partitions(t)), true)
	if n := r.metric("outbox_relay_rewinds_total"); n != 0 {
		t.Errorf("%v rewinds: the big event's refusal is certain at the first answer, nothing needs publishing again", n)
	}

	letters := consume(t, []string{dlq}, len(poisons), 60*time.Second, 2*time.Second)
	if len(letters) != len(poisons) {
		t.Fatalf("%d dead letters, want %d", len(letters), len(poisons))
	}
	letterOf := map[int64]record{}
	for _, l := range letters {
		id, _ := strconv.ParseInt(l.Headers["dlq.event_id"], 10, 64)
		letterOf[id] = l
		p, ok := poisons[id]
		if !ok {
			t.Errorf("dead letter for id %d, which is not a poison row: %v", id, l.Headers)
			continue
		}
		h := l.Headers
		if h["dlq.reason"] != p.reason || h["dlq.attempts"] != strconv.Itoa(p.attempts) || h["dlq.table"] != e.Table ||
			h["dlq.source_lsn"] == "" || h["dlq.failed_at"] == "" || !strings.Contains(h["dlq.error"], p.errText) {
			t.Errorf("dead letter of id %d: headers %v, want reason %s, attempts %d, error containing %q", id, h, p.reason, p.attempts, p.errText)
		}
		if p.payload == "" && (len(l.Value) != 0 || h["dlq.payload_omitted"] != "true") {
			t.Errorf("dead letter of too-large id %d carries %d payload bytes, want none and dlq.payload_omitted", id, len(l.Value))
		}
		if p.payload != "" && string(l.Value) != p.payload {
			t.Errorf("dead letter of id %d: value %q, want the row's payload %q", id, l.Value, p.payload)
		}
		if p.reason == "message_too_large" && h["dlq.original_topic"] != e.Prefix+".big" {
			t.Errorf("dead letter of id %d: original topic %q", id, h["dlq.original_topic"])
		}
	}

	// Rows are marked for the operator; the slot has moved past them all.
	waitFor(t, 30*time.Second, "slot past every poison event", func() bool { return e.slotLSN(t) >= end })
	rows, err := e.DB.Query(ctx, "SELECT id, attempt_count, last_error FROM "+e.Table+" WHERE dead_lettered_at IS NOT NULL")
	if err != nil {
		t.Fatal(err)
	}
	marked := 0
	for rows.Next() {
		var id int64
		var attempts int
		var lastErr string
		if err := rows.Scan(&id, &attempts, &lastErr); err != nil {
			t.Fatal(err)
		}
		p := poisons[id]
		if p.reason == "" || attempts != p.attempts || !strings.Contains(lastErr, p.errText) {
			t.Errorf("row %d marked with attempts %d, last_error %q; want a poison row with %d attempts, error containing %q", id, attempts, lastErr, p.attempts, p.errText)
		}
		marked++
	}
	if marked != len(poisons) {
		t.Errorf("%d rows marked dead-lettered, want %d", marked, len(poisons))
	}
	waitFor(t, 15*time.Second, "dead-letter metrics", func() bool {
		return r.metric("outbox_relay_dead_lettered_total") == float64(len(poisons)) &&
			r.metric("outbox_relay_dlq_unresolved_rows") == float64(len(poisons))
	})
	if r.readyStatus() != 200 {
		t.Error("relay not ready after dead-lettering: dlq must not halt")
	}

	// The operator's side.
	var headersID, nullID int64
	for id, p := range poisons {
		switch p.errText {
		case `column "headers"`:
			headersID = id
		case `column "aggregate_id": is NULL`:
			nullID = id
		}
	}
	code, out := e.cli("dlq", "list")
	for id := range poisons {
		if code != 0 || !strings.Contains(out, "\n"+strconv.FormatInt(id, 10)+" ") {
			t.Errorf("dlq list (exit %d) does not show row %d:\n%s", code, id, out)
		}
	}
	if code, out := e.cli("dlq", "replay", "--id", strconv.FormatInt(nullID, 10)); code != 1 || !strings.Contains(out, "aggregate_id is NULL") || !strings.Contains(out, "fix the row") {
		t.Errorf("replay of a row that is still bad: exit %d, %s; want 1 and what to fix", code, out)
	}
	// Dropping event_type above emptied it in every row: fix that too.
	mustExec(t, e, "UPDATE "+e.Table+` SET headers = '{"fixed": true}', event_type = 'order.updated' WHERE id = $1`, headersID)
	code, out = e.cli("dlq", "replay", "--id", strconv.FormatInt(headersID, 10))
	var newID int64
	if _, err := fmt.Sscanf(out[strings.Index(out, "replayed"):], "replayed outbox row %d as row %d", new(int64), &newID); code != 0 || err != nil {
		t.Fatalf("dlq replay: exit %d, %s", code, out)
	}
	if code, out := e.cli("dlq", "replay", "--id", strconv.FormatInt(headersID, 10)); code != 1 || !strings.Contains(out, "already resolved") {
		t.Errorf("second replay: exit %d, %s; want 1 and already resolved", code, out)
	}
	if code, out := e.cli("dlq", "resolve", "--id", strconv.FormatInt(nullID, 10)); code != 0 {
		t.Errorf("dlq resolve: exit %d, %s", code, out)
	}
	replayed, orders := false, 0
	for _, rec := range rs {
		if rec.Topic == e.Prefix+".order" {
			orders++
		}
	}
	// The copy is the dead-lettered event, not a new one: the row's
	// event_id, which its dead letter carried too, marked as a dlq replay.
	var eventID string
	if err := e.DB.QueryRow(ctx, "SELECT event_id::text FROM "+e.Table+" WHERE id = $1", headersID).Scan(&eventID); err != nil {
		t.Fatal(err)
	}
	if got := letterOf[headersID].Headers["event_id"]; got != eventID || !testkit.IsUUID(eventID) {
		t.Errorf("dead letter of row %d: event_id %q, want the row's event_id %q", headersID, got, eventID)
	}
	if !strings.Contains(out, "event_id "+eventID) {
		t.Errorf("dlq replay output does not name the event_id %s: %s", eventID, out)
	}
	for _, rec := range consume(t, []string{e.Prefix + ".order"}, orders+1, 60*time.Second, 2*time.Second) {
		if rec.Headers["outbox_id"] == strconv.FormatInt(newID, 10) {
			replayed = rec.Key == "order-1" && rec.Headers["fixed"] == "true" && string(rec.Value) == `{"n": 1}` &&
				rec.Headers["event_id"] == eventID && rec.Headers["outbox_replayed_from"] == "dlq"
			if !replayed {
				t.Errorf("replayed row %d: key %q value %s headers %v; want the event_id %s of row %d and outbox_replayed_from dlq", newID, rec.Key, rec.Value, rec.Headers, eventID, headersID)
			}
		}
	}
	if !replayed {
		t.Errorf("replayed row %d not delivered to %s.order with its key, payload, fixed headers and identity", newID, e.Prefix)
	}
	waitFor(t, 15*time.Second, "unresolved gauge to drop by two", func() bool {
		return r.metric("outbox_relay_dlq_unresolved_rows") == float64(len(poisons)-2)
	})
}

// on_poison: halt stops publishing at the poison event: the relay stays up
// but not ready, the slot stays before the event, the row says why. After
// the operator switches to dlq and restarts, everything after it flows.
func TestPoisonHaltHoldsSlot(t *testing.T) {
	e := newEnv(t, "halt")
	ctx := context.Background()
	r := e.startRelay("--on-poison", "halt")
	w := e.newWriter(8)
	if err := w.run(ctx, 50, 5, 10, 0, ""); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "good events acked", func() bool { return r.metric("outbox_relay_events_published_total") >= 50 })
	id := e.insertRow(t, "order", "order-1", "order.updated", `{}`, `["not", "an", "object"]`)
	if err := w.run(ctx, 30, 5, 10, 0, ""); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "outbox_relay_halted = 1", func() bool { return r.metric("outbox_relay_halted") == 1 })
	time.Sleep(2 * time.Second) // deliberate: the halted relay must stay up over time, not just at one instant
	if !r.running() {
		t.Fatal("the relay exited; halt must keep it up (not ready) so it does not crash-loop")
	}
	if code, body := r.get("/readyz"); code != 503 || !strings.Contains(body, "halted") {
		t.Errorf("/readyz = %d %q, want 503 saying halted", code, body)
	}
	if code, _ := r.get("/healthz"); code != 200 {
		t.Errorf("/healthz = %d, want 200", code)
	}
	if n := r.metric("outbox_relay_events_published_total"); n != 50 {
		t.Errorf("%v events published, want 50: nothing after the poison event", n)
	}
	at := r.haltedLSN()
	if c := e.slotLSN(t); c > at {
		t.Fatalf("slot confirmed %s past the commit LSN %s of the poison row's transaction", c, at)
	}
	var attempts int
	var lastErr string
	waitFor(t, 10*time.Second, "row records the error", func() bool {
		err := e.DB.QueryRow(ctx, "SELECT attempt_count, COALESCE(last_error, '') FROM "+e.Table+" WHERE id = $1", id).Scan(&attempts, &lastErr)
		return err == nil && attempts == 1 && strings.Contains(lastErr, "headers")
	})
	log := r.log()
	for _, want := range []string{e.Table, fmt.Sprintf(`"id":%d`, id), "headers", "HALTED"} {
		if !strings.Contains(log, want) {
			t.Errorf("the log does not name %q:\n%s", want, tail([]byte(log), 2000))
		}
	}
	if code := r.stop(syscall.SIGTERM, 15*time.Second); code != 0 {
		t.Errorf("exit code %d after SIGTERM while halted, want 0", code)
	}
	if c := e.slotLSN(t); c > at {
		t.Fatalf("slot confirmed %s past the poison row at %s at shutdown", c, at)
	}

	r = e.startRelay("--dlq-topic", e.Prefix+".dlq")
	rs := consume(t, e.topics(), len(w.written()), 60*time.Second, 3*time.Second)
	requireClean(t, check(t, w.written(), rs, e.partitions(t)), true)
	waitFor(t, 30*time.Second, "poison row dead-lettered", func() bool { return r.metric("outbox_relay_dead_lettered_total") == 1 })
}

// A dead letter larger than the dead-letter topic's max.message.bytes is cut
// down further (the payload stays in the row) and written.
func TestDeadLetterCutToFitItsTopic(t *testing.T) {
	t.Parallel() // own outbox, relay and topics; no service fault, no shared proxy
	e := newEnv(t, "dlqcut")
	dlq := e.Prefix + ".dlq"
	createTopic(t, dlq, map[string]string{"max.message.bytes": "1500"})
	r := e.startRelay("--dlq-topic", dlq)
	id := e.insertRow(t, "bad topic!", "order-1", "order.updated", `{"blob":"`+strings.Repeat("y", 3000)+`"}`, `{}`)
	letters := consume(t, []string{dlq}, 1, 30*time.Second, 2*time.Second)
	if len(letters) != 1 {
		t.Fatalf("%d dead letters, want 1", len(letters))
	}
	if h := letters[0].Headers; h["dlq.event_id"] != strconv.FormatInt(id, 10) || h["dlq.payload_omitted"] != "true" || len(letters[0].Value) != 0 {
		t.Errorf("dead letter: headers %v, %d value bytes; want id %d without its payload", h, len(letters[0].Value), id)
	}
	if r.metric("outbox_relay_halted") != 0 {
		t.Error("halted although the cut-down dead letter fits its topic")
	}
}

// When even the least dead letter cannot be written, the relay halts rather
// than drop the event, naming the dead-letter topic's limit.
func TestDeadLetterWriteFailureHalts(t *testing.T) {
	t.Parallel() // own outbox, relay and topics; no service fault, no shared proxy
	e := newEnv(t, "dlqfail")
	dlq := e.Prefix + ".dlq"
	createTopic(t, dlq, map[string]string{"max.message.bytes": "200"}) // below any dead letter
	r := e.startRelay("--dlq-topic", dlq)
	id := e.insertRow(t, "bad topic!", "order-1", "order.updated", `{"blob":"`+strings.Repeat("y", 3000)+`"}`, `{}`)
	waitFor(t, 30*time.Second, "halt", func() bool { return r.metric("outbox_relay_halted") == 1 })
	if code, body := r.get("/readyz"); code != 503 || !strings.Contains(body, "dead letter") || !strings.Contains(body, "max.message.bytes of topic "+dlq) {
		t.Errorf("/readyz = %d %q, want 503 naming the dead-letter failure and the topic's limit", code, body)
	}
	if c, at := e.slotLSN(t), r.haltedLSN(); c > at {
		t.Fatalf("slot confirmed %s past the commit LSN %s of the event whose dead letter failed", c, at)
	}
	var lastErr string
	waitFor(t, 10*time.Second, "row records the error", func() bool {
		return e.DB.QueryRow(context.Background(), "SELECT COALESCE(last_error, '') FROM "+e.Table+" WHERE id = $1", id).Scan(&lastErr) == nil &&
			strings.Contains(lastErr, "dead letter")
	})
}
