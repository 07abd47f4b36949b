//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/test/testkit"
)

// replay runs `outbox-relay replay` with the env's config plus args and
// returns its exit code and output.
func (e *env) replay(d time.Duration, args ...string) (int, string) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	code, out, err := testkit.Run(ctx, append(os.Environ(), e.extra...), relayBin, append(append([]string{"replay"}, e.flags()...), args...)...)
	if ctx.Err() != nil {
		e.t.Fatalf("replay still running after %s:\n%s", d, testkit.Tail(out, 3000))
	}
	if err != nil {
		e.t.Fatal(err)
	}
	return code, out
}

func (e *env) migrate(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if code, out, err := testkit.Run(ctx, os.Environ(), relayBin, append([]string{"migrate"}, e.flags()...)...); err != nil || code != 0 {
		t.Fatalf("migrate: exit %d %v\n%s", code, err, out)
	}
}

func (e *env) count(t *testing.T, where string) int {
	t.Helper()
	var n int
	if err := e.DB.QueryRow(context.Background(), "SELECT count(*) FROM "+e.Table+" WHERE "+where).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// sameRecords checks that every copy of an event is the same record: the
// replayed one is built like the relay's (topic, key, partition, payload
// bytes, headers, event_id included; only pg_lsn differs, 0/0 on a replay,
// and a replay adds outbox_replay). Of the copies of an event all but one
// (the relay's) carry outbox_replay, a time.
func sameRecords(t *testing.T, rs []record) (compared int) {
	t.Helper()
	first := map[string]record{}
	copies, marked := map[string]int{}, map[string]int{}
	for _, r := range rs {
		id := r.Headers["event_id"]
		copies[id]++
		if m, ok := r.Headers["outbox_replay"]; ok {
			marked[id]++
			if _, err := time.Parse(time.RFC3339, m); err != nil {
				t.Errorf("event_id=%s: outbox_replay %q is not an RFC 3339 time", id, m)
			}
		}
		f, ok := first[id]
		if !ok {
			first[id] = r
			continue
		}
		compared++
		hf, hr := maps(f.Headers), maps(r.Headers)
		for _, k := range []string{"pg_lsn", "outbox_replay"} {
			delete(hf, k)
			delete(hr, k)
		}
		if f.Topic != r.Topic || f.Key != r.Key || f.Partition != r.Partition || !bytes.Equal(f.Value, r.Value) || fmt.Sprint(hf) != fmt.Sprint(hr) {
			t.Errorf("event_id=%s: copies differ:\n %s/%d key %q %s %v\n %s/%d key %q %s %v", id,
				f.Topic, f.Partition, f.Key, f.Value, f.Headers, r.Topic, r.Partition, r.Key, r.Value, r.Headers)
		}
	}
	for id, n := range copies {
		if n > 1 && marked[id] != n-1 {
			t.Errorf("event_id=%s: %d copies, %d marked outbox_replay; want all but the relay's", id, n, marked[id])
		}
	}
	return compared
}

func maps(m map[string]string) map[string]string {
	c := make(map[string]string, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

var (
	replayCmd = regexp.MustCompile("`outbox-relay replay ([^`]+)`")
	deleteCmd = regexp.MustCompile(`DELETE FROM \S+ WHERE slot_name = '[^']+'`)
)

// The "done when": the slot is dropped while the relay is down and
// events are written meanwhile. The relay refuses to start and names the
// recovery; following it (registry row, migrate, relay, the replay command
// it names) puts every event in Kafka: duplicates allowed, none lost.
func TestReplayAfterDroppedSlotDeliversEverything(t *testing.T) {
	t.Parallel() // own outbox, relay and topics; no service fault, no shared proxy
	e := newEnv(t, "replaydrop")
	ctx := context.Background()
	r := e.startRelay()
	w := e.newWriter(41)
	if err := w.run(ctx, 60, 5, 8, 0, ""); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "events acked", func() bool { return r.metric("outbox_relay_events_published_total") >= 60 })
	if code := r.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	waitFor(t, 10*time.Second, "the slot to be dropped", func() bool {
		_, err := e.DB.Exec(ctx, "SELECT pg_drop_replication_slot($1)", e.Slot)
		return err == nil
	})
	if err := w.run(ctx, 60, 5, 8, 0, ""); err != nil { // never streamed: no slot
		t.Fatal(err)
	}

	code, log := e.runRelayToExit(60 * time.Second)
	log = strings.ReplaceAll(log, `\"`, `"`) // the JSON log escapes the quoted names
	cmd, del := replayCmd.FindStringSubmatch(log), deleteCmd.FindString(log)
	if code != 1 || cmd == nil || del == "" || !strings.Contains(log, "harmless") {
		t.Fatalf("exit code %d; want 1 with the DELETE and the replay command to run:\n%s", code, testkit.Tail(log, 3000))
	}
	t.Logf("the relay says: %s; outbox-relay replay %s", del, cmd[1])
	if !strings.Contains(cmd[1], "--since 20") {
		t.Fatalf("the replay command carries no concrete time: %q", cmd[1])
	}
	mustExec(t, e, del)
	e.migrate(t)
	r2 := e.startRelay()
	if err := w.run(ctx, 30, 5, 8, 0, ""); err != nil { // streamed by the fresh slot
		t.Fatal(err)
	}
	start := time.Now()
	code, out := e.replay(2*time.Minute, strings.Fields(cmd[1])...)
	if code != 0 || !strings.Contains(out, "replay done") {
		t.Fatalf("replay: exit %d\n%s", code, testkit.Tail(out, 3000))
	}
	t.Logf("replay took %s", time.Since(start).Round(time.Millisecond))
	ws := w.written()
	rs := consume(t, e.topics(), len(ws)+90, 90*time.Second, 3*time.Second) // 60+30 from the relay, 150 from the replay
	rep := check(t, ws, rs, e.partitions(t))
	t.Logf("written %d, delivered %d, records %d, duplicates %d, order violations %d (the replay interleaves with the fresh slot's events)",
		rep.Written, rep.Delivered, rep.Records, rep.Duplicates, rep.OrderViolations)
	if rep.Lost != 0 || rep.PartitionViolations != 0 || rep.Delivered != len(ws) {
		t.Fatalf("lost %d, partition violations %d, delivered %d of %d: %v", rep.Lost, rep.PartitionViolations, rep.Delivered, len(ws), rep.Problems)
	}
	if n := sameRecords(t, rs); n < 60 {
		t.Fatalf("only %d duplicate copies compared; the first 60 events were delivered twice", n)
	}
	if n := e.count(t, "published_at IS NOT NULL"); n != len(ws) {
		t.Fatalf("%d rows have published_at after the replay, want every replayed row (%d)", n, len(ws))
	}
	r2.stop(syscall.SIGTERM, 30*time.Second)
}

// Adopting the relay on an outbox that already holds rows (say, written
// for a poller) before migrate made the slot: the slot never streams them,
// replay delivers them, and nothing else.
func TestReplayAdoptsRowsOlderThanTheSlot(t *testing.T) {
	t.Parallel() // own outbox, relay and topics; no service fault, no shared proxy
	var old *testkit.Writer
	var poisonID int64
	aggType := func(a int) string {
		if a%3 == 2 {
			return "payment"
		}
		return "order"
	}
	e := newEnv(t, "replayadopt", func(o *testkit.Outbox) {
		ctx := context.Background()
		for _, q := range []string{"CREATE SCHEMA " + o.Schema, `CREATE TABLE ` + o.Table + ` (
			id BIGSERIAL PRIMARY KEY, aggregate_type TEXT NOT NULL, aggregate_id TEXT NOT NULL, event_type TEXT NOT NULL,
			payload JSONB NOT NULL, headers JSONB, created_at TIMESTAMPTZ NOT NULL DEFAULT now(), published_at TIMESTAMPTZ)`} {
			if _, err := o.DB.Exec(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
		old = testkit.NewWriter(o.DB, o.Table, rand.New(rand.NewPCG(42, 99)), aggType)
		for i := range 10 {
			if err := old.Write(ctx, 4, 6, ""); err != nil {
				t.Fatal(err)
			}
			if i == 4 { // a poison row among them: replay dead-letters it like the relay
				if err := o.DB.QueryRow(ctx, `INSERT INTO `+o.Table+` (aggregate_type, aggregate_id, event_type, payload, headers)
					VALUES ('order', 'order-0', 'order.updated', '{}', '{"event_id": "forged"}') RETURNING id`).Scan(&poisonID); err != nil {
					t.Fatal(err)
				}
			}
		}
	})
	pre := old.Events()
	maxPre := pre[len(pre)-1].ID
	w := &writer{old}
	r := e.startRelay()
	if err := w.run(context.Background(), 30, 3, 6, 0, ""); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "new events acked", func() bool { return r.metric("outbox_relay_events_published_total") >= 30 })
	rs := consume(t, e.topics(), 30, 30*time.Second, 2*time.Second)
	if rep := check(t, w.written(), rs, e.partitions(t)); rep.Lost != len(pre) || rep.Delivered != 30 {
		t.Fatalf("before the replay: delivered %d, lost %d; want exactly the %d rows older than the slot missing", rep.Delivered, rep.Lost, len(pre))
	}

	dlq := e.Prefix + ".dlq"
	code, out := e.replay(2*time.Minute, "--from-id", "1", "--to-id", strconv.FormatInt(maxPre, 10), "--dlq-topic", dlq)
	if code != 0 || !strings.Contains(out, fmt.Sprintf(`"total":%d,"read":%d,"published":%d,"dead_lettered":1,"failed":0`, len(pre)+1, len(pre)+1, len(pre))) {
		t.Fatalf("replay: exit %d\n%s", code, testkit.Tail(out, 3000))
	}
	dead := consume(t, []string{dlq}, 1, 30*time.Second, time.Second)
	if len(dead) != 1 || dead[0].Headers["dlq.reason"] != "reserved_header" || dead[0].Headers["dlq.event_id"] != strconv.FormatInt(poisonID, 10) {
		t.Fatalf("dead letters: %+v", dead)
	}
	if n := e.count(t, fmt.Sprintf("id = %d AND dead_lettered_at IS NOT NULL AND published_at IS NULL", poisonID)); n != 1 {
		t.Fatalf("the poison row %d is not marked dead-lettered", poisonID)
	}
	rs = consume(t, e.topics(), 30+len(pre), 60*time.Second, 3*time.Second)
	rep := check(t, w.written(), rs, e.partitions(t))
	// The old rows of an aggregate arrive after its new ones (the relay
	// streamed those first): consumers tolerate that, as any replay.
	if rep.Lost != 0 || rep.Duplicates != 0 || rep.PartitionViolations != 0 {
		t.Fatalf("after the replay: %+v", rep.Problems)
	}
	// The rows written before migrate kept a NULL event_id (0006 adds the
	// column without a default for them): published under their id, as
	// before the migration; the rows written after under their UUID.
	for _, rec := range rs {
		id, _ := testkit.RecordID(rec)
		if older := id <= maxPre; older && rec.Headers["event_id"] != rec.Headers["outbox_id"] || !older && !testkit.IsUUID(rec.Headers["event_id"]) {
			t.Errorf("row %d (written before migrate: %v): event_id %q", id, older, rec.Headers["event_id"])
		}
	}
	if n := e.count(t, fmt.Sprintf("event_id IS NOT NULL AND id <= %d", maxPre)); n != 0 {
		t.Errorf("%d rows written before migration 0006 got an event_id", n)
	}
	if n := e.count(t, "published_at IS NOT NULL"); n != len(pre) {
		t.Fatalf("%d rows have published_at, want the %d replayed", n, len(pre))
	}
	if n := e.count(t, fmt.Sprintf("published_at IS NOT NULL AND id > %d", maxPre)); n != 0 {
		t.Fatalf("%d rows outside the range got published_at", n)
	}
	r.stop(syscall.SIGTERM, 30*time.Second)
}

// Feeding a new consumer: replay a selection (an aggregate type, an event
// type, up to an id) into the normal topics while the relay runs. Exactly
// the selected rows arrive, once each, in id order per key.
func TestReplayFeedsNewConsumerSelection(t *testing.T) {
	t.Parallel() // own outbox, relay and topics; no service fault, no shared proxy
	e := newEnv(t, "replayfeed")
	ctx := context.Background()
	r := e.startRelay()
	w := e.newWriter(43)
	if err := w.run(ctx, 80, 4, 9, 0, ""); err != nil {
		t.Fatal(err)
	}
	// Rows of the same aggregate type but another event type: not selected.
	mustExec(t, e, `INSERT INTO `+e.Table+` (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'order', 'order-0', 'order.archived', jsonb_build_object('n', g) FROM generate_series(1, 5) g`)
	waitFor(t, 60*time.Second, "events acked", func() bool { return r.metric("outbox_relay_events_published_total") >= 85 })
	before, _, err := testkit.ReadToEnd(brokers, e.Prefix+".", 30*time.Second)
	if err != nil || len(before) < 85 {
		t.Fatalf("read %d records before the replay: %v", len(before), err)
	}
	end := map[string]int64{}
	for _, rec := range before {
		k := fmt.Sprintf("%s/%d", rec.Topic, rec.Partition)
		end[k] = max(end[k], rec.Offset+1)
	}
	ws := w.written()
	toID := ws[59].ID
	var want []int64
	for _, ev := range ws {
		if ev.Type == "order" && ev.ID <= toID {
			want = append(want, ev.ID)
		}
	}
	code, out := e.replay(2*time.Minute, "--from-id", "1", "--to-id", strconv.FormatInt(toID, 10),
		"--aggregate-type", "order", "--event-type", "order.updated")
	if code != 0 {
		t.Fatalf("replay: exit %d\n%s", code, testkit.Tail(out, 3000))
	}
	var after []record
	waitFor(t, 60*time.Second, "the replayed records", func() bool {
		all, _, err := testkit.ReadToEnd(brokers, e.Prefix+".", 30*time.Second)
		if err != nil {
			t.Log(err)
			return false
		}
		after = after[:0]
		for _, rec := range all {
			if rec.Offset >= end[fmt.Sprintf("%s/%d", rec.Topic, rec.Partition)] {
				after = append(after, rec)
			}
		}
		return len(after) >= len(want)
	})
	slices.SortFunc(after, func(a, b record) int {
		if c := strings.Compare(a.Topic, b.Topic); c != 0 {
			return c
		}
		if a.Partition != b.Partition {
			return int(a.Partition - b.Partition)
		}
		return int(a.Offset - b.Offset)
	})
	var got []int64
	lastByKey := map[string]int64{}
	identity := map[string]string{} // outbox_id -> event_id, as the relay published it
	for _, rec := range before {
		identity[rec.Headers["outbox_id"]] = rec.Headers["event_id"]
	}
	for _, rec := range after {
		id, _ := testkit.RecordID(rec)
		got = append(got, id)
		// Republished under the event's own identity, marked as a replay.
		if rec.Headers["event_id"] != identity[rec.Headers["outbox_id"]] || !testkit.IsUUID(rec.Headers["event_id"]) {
			t.Errorf("row %d replayed under event_id %q, published under %q", id, rec.Headers["event_id"], identity[rec.Headers["outbox_id"]])
		}
		if m, err := time.Parse(time.RFC3339, rec.Headers["outbox_replay"]); err != nil || time.Since(m) > 10*time.Minute {
			t.Errorf("row %d replayed with outbox_replay %q, want the replay's start", id, rec.Headers["outbox_replay"])
		}
		if rec.Topic != e.Prefix+".order" || rec.Headers["event_type"] != "order.updated" {
			t.Errorf("event_id=%d replayed to %s with event_type %q", id, rec.Topic, rec.Headers["event_type"])
		}
		if id <= lastByKey[rec.Key] {
			t.Errorf("key %s: event_id=%d after %d", rec.Key, id, lastByKey[rec.Key])
		}
		lastByKey[rec.Key] = id
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("replayed event_ids %v\nwant exactly %v", got, want)
	}
	t.Logf("replayed %d selected rows of %d, in id order per key", len(got), len(ws)+5)
	r.stop(syscall.SIGTERM, 30*time.Second)
}

// --rate is a token bucket: 40 rows at 20/s cannot take less than about
// two seconds (the first row goes at once, then one every 50 ms).
func TestReplayRateIsHonoured(t *testing.T) {
	e := newEnv(t, "replayrate")
	w := e.newWriter(44)
	if err := w.run(context.Background(), 40, 4, 5, 0, ""); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	code, out := e.replay(2*time.Minute, "--since", time.Now().UTC().Add(-time.Hour).Format(time.RFC3339), "--rate", "20/s")
	took := time.Since(start)
	if code != 0 || !strings.Contains(out, `"published":40`) {
		t.Fatalf("replay: exit %d\n%s", code, testkit.Tail(out, 3000))
	}
	if took < 1500*time.Millisecond {
		t.Fatalf("40 rows at --rate 20/s took %s, want at least 1.5s", took)
	}
	t.Logf("40 rows at 20/s took %s", took.Round(time.Millisecond))
	rs := consume(t, e.topics(), 40, 30*time.Second, 2*time.Second)
	if rep := check(t, w.written(), rs, e.partitions(t)); rep.Lost != 0 || rep.Duplicates != 0 || rep.OrderViolations != 0 {
		t.Fatalf("%+v", rep.Problems)
	}
}

// replay leaves dead letters out (issue 35, case 4): a row `dlq replay`
// published again as a new row (the copy, under the same event_id, is what
// replays cover), and one `dlq resolve` closed, never come again; a dead
// letter not yet resolved only with --include-dead-letters. Were the fixed
// row replayed it would count as published, the bad ones as dead-lettered.
func TestReplayLeavesDeadLettersOut(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "replaydlq")
	ctx := context.Background()
	dlq := e.Prefix + ".dlq"
	mustExec(t, e, "ALTER TABLE "+e.Table+" ALTER COLUMN aggregate_id DROP NOT NULL")
	r := e.startRelay("--dlq-topic", dlq)
	var bad []int64
	for range 3 {
		bad = append(bad, e.insertRow(t, "order", nil, "order.paid", `{"n": 1}`, `{}`))
	}
	w := e.newWriter(146)
	if err := w.run(ctx, 20, 2, 5, 0, ""); err != nil {
		t.Fatal(err)
	}
	consume(t, []string{dlq}, len(bad), 60*time.Second, time.Second)
	waitFor(t, 30*time.Second, "the bad rows marked dead-lettered", func() bool {
		var n int
		err := e.DB.QueryRow(ctx, "SELECT count(*) FROM "+e.Table+" WHERE dead_lettered_at IS NOT NULL").Scan(&n)
		return err == nil && n == len(bad)
	})
	mustExec(t, e, "UPDATE "+e.Table+" SET aggregate_id = 'order-9' WHERE id = $1", bad[0])
	if code, out := e.cli("dlq", "replay", "--id", strconv.FormatInt(bad[0], 10)); code != 0 {
		t.Fatalf("dlq replay: exit %d\n%s", code, out)
	}
	if code, out := e.cli("dlq", "resolve", "--id", strconv.FormatInt(bad[1], 10)); code != 0 {
		t.Fatalf("dlq resolve: exit %d\n%s", code, out)
	}
	r.stop(syscall.SIGTERM, 30*time.Second)
	var good int64
	if err := e.DB.QueryRow(ctx, "SELECT count(*) FROM "+e.Table+" WHERE dead_lettered_at IS NULL").Scan(&good); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		dead int
	}{
		{[]string{"--from-id", "1"}, 0},
		{[]string{"--from-id", "1", "--include-dead-letters"}, 1}, // bad[2], still bad: dead-lettered again
	} {
		code, out := e.replay(2*time.Minute, append(tc.args, "--dlq-topic", dlq)...)
		want := fmt.Sprintf(`"total":%d,"read":%d,"published":%d,"dead_lettered":%d,"failed":0`, good+int64(tc.dead), good+int64(tc.dead), good, tc.dead)
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("replay %v: exit %d, want 0 and %s:\n%s", tc.args, code, want, testkit.Tail(out, 2000))
		}
	}
	t.Logf("%d rows replayed; of the 3 dead letters one replayed by dlq replay and one resolved never again, the third only when asked", good)
}
