//go:build e2e

package e2e

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/outbox-relay/outbox-relay/test/testkit"
)

// Rows a careless or hostile writer can put in the outbox, end to end:
// whatever a row holds, it cannot forge the relay's headers nor stop
// delivery for everyone else.

// readRaw reads every partition of topics from the start until it has at
// least want records and none came for quiet, or d passes. Unlike consume it
// keeps each record's headers as the broker returned them, duplicates
// included.
func readRaw(t *testing.T, topics []string, want int, d, quiet time.Duration) []*sarama.ConsumerMessage {
	t.Helper()
	var (
		mu   sync.Mutex
		out  []*sarama.ConsumerMessage
		last = time.Now()
	)
	c, err := testkit.Consume(brokers, topics, d, func(m *sarama.ConsumerMessage) {
		mu.Lock()
		out = append(out, m)
		last = time.Now()
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = testkit.Poll(d, 50*time.Millisecond, func() (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		return len(out) >= want && time.Since(last) >= quiet, nil
	})
	c.Close()
	mu.Lock()
	defer mu.Unlock()
	return append([]*sarama.ConsumerMessage(nil), out...)
}

// headerCount counts the headers of m named key.
func headerCount(m *sarama.ConsumerMessage, key string) int {
	n := 0
	for _, h := range m.Headers {
		if string(h.Key) == key {
			n++
		}
	}
	return n
}

// A row whose headers column holds a reserved key (one the relay sets
// itself, or a dlq.* key) is dead-lettered with reason reserved_header; it
// never reaches its topic, every record there carries exactly one event_id
// and aggregate_id, every other event arrives, and the slot moves past it.
func TestReservedHeadersAreDeadLettered(t *testing.T) {
	t.Parallel() // own outbox, relay and topics; no service fault, no shared proxy
	e := newEnv(t, "reserved")
	ctx := context.Background()
	dlq := e.Prefix + ".dlq"
	r := e.startRelay("--dlq-topic", dlq)

	w := e.newWriter(41)
	if err := w.run(ctx, 50, 5, 10, 0, ""); err != nil {
		t.Fatal(err)
	}
	forged := map[int64]string{ // id -> the reserved key its error must name
		e.insertRow(t, "order", "order-1", "order.updated", `{"n": 1}`, `{"event_id": "7", "aggregate_id": "victim"}`): "event_id",
		e.insertRow(t, "order", "order-2", "order.updated", `{"n": 2}`, `{"trace": "t", "dlq.reason": "forged"}`):      "dlq.reason",
		e.insertRow(t, "order", "order-3", "order.updated", `{"n": 3}`, `{"Outbox_ID": "1"}`):                          "Outbox_ID",
		e.insertRow(t, "order", "order-4", "order.updated", `{"n": 4}`, `{"outbox_replayed_from": "dlq"}`):             "outbox_replayed_from",
	}
	if err := w.run(ctx, 50, 5, 10, 0, ""); err != nil {
		t.Fatal(err)
	}
	end := e.currentLSN(t)

	ws := w.written()
	rs := consume(t, e.topics(), len(ws), 90*time.Second, 3*time.Second)
	requireClean(t, check(t, ws, rs, e.partitions(t)), false)

	raw := readRaw(t, e.topics(), len(ws), 60*time.Second, 2*time.Second)
	if len(raw) != len(ws) {
		t.Errorf("%d records on the event topics, want %d (the forged rows must not be published)", len(raw), len(ws))
	}
	for _, m := range raw {
		for _, k := range []string{"event_id", "event_type", "aggregate_type", "aggregate_id", "pg_lsn", "outbox_id"} {
			if n := headerCount(m, k); n != 1 {
				t.Errorf("record %s/%d@%d has %d %s headers, want exactly 1", m.Topic, m.Partition, m.Offset, n, k)
			}
		}
		for _, h := range m.Headers {
			if string(h.Value) == "victim" || strings.HasPrefix(string(h.Key), "dlq.") {
				t.Errorf("record %s/%d@%d carries a forged header %s=%s", m.Topic, m.Partition, m.Offset, h.Key, h.Value)
			}
		}
		if headerCount(m, "outbox_replayed_from") != 0 || headerCount(m, "outbox_replay") != 0 {
			t.Errorf("record %s/%d@%d carries a replay mark: %v", m.Topic, m.Partition, m.Offset, m.Headers)
		}
		id, _ := strconv.ParseInt(headerValue(m, "outbox_id"), 10, 64)
		if _, bad := forged[id]; bad {
			t.Errorf("forged row %d was published to %s", id, m.Topic)
		}
	}

	letters := readRaw(t, []string{dlq}, len(forged), 60*time.Second, 2*time.Second)
	if len(letters) != len(forged) {
		t.Fatalf("%d dead letters, want %d", len(letters), len(forged))
	}
	for _, l := range letters {
		id, _ := strconv.ParseInt(headerValue(l, "dlq.event_id"), 10, 64)
		key, ok := forged[id]
		if !ok {
			t.Errorf("dead letter of id %d, which is not a forged row", id)
			continue
		}
		if got := headerValue(l, "dlq.reason"); got != "reserved_header" {
			t.Errorf("dead letter of id %d: dlq.reason %q, want reserved_header", id, got)
		}
		if n := headerCount(l, "dlq.reason"); n != 1 {
			t.Errorf("dead letter of id %d has %d dlq.reason headers, want 1", id, n)
		}
		// The relay's own headers, once each: the row's identity (its
		// event_id) and its id, never the forged values.
		var eventID string
		if err := e.DB.QueryRow(ctx, "SELECT event_id::text FROM "+e.Table+" WHERE id = $1", id).Scan(&eventID); err != nil {
			t.Fatal(err)
		}
		if got := headerValue(l, "event_id"); got != eventID || !testkit.IsUUID(got) || headerCount(l, "event_id") != 1 {
			t.Errorf("dead letter of id %d: event_id %q (x%d), want the row's event_id %q once", id, got, headerCount(l, "event_id"), eventID)
		}
		if got := headerValue(l, "outbox_id"); got != strconv.FormatInt(id, 10) || headerCount(l, "outbox_id") != 1 {
			t.Errorf("dead letter of id %d: outbox_id %q (x%d), want the row id once", id, got, headerCount(l, "outbox_id"))
		}
		if msg := headerValue(l, "dlq.error"); !strings.Contains(msg, strconv.Quote(key)) || !strings.Contains(msg, "rename") ||
			!strings.Contains(msg, "id="+strconv.FormatInt(id, 10)) {
			t.Errorf("dead letter of id %d: dlq.error %q, want it to name the key %q, the row and the fix", id, msg, key)
		}
	}
	waitFor(t, 30*time.Second, "slot past the forged rows", func() bool { return e.slotLSN(t) >= end })

	// The operator's side: replay is refused until the key is renamed.
	for id, key := range forged {
		idText := strconv.FormatInt(id, 10)
		if code, out := e.cli("dlq", "replay", "--id", idText); code != 1 || !strings.Contains(out, strconv.Quote(key)) || !strings.Contains(out, "reserved") {
			t.Errorf("replay of row %d with the reserved key %q: exit %d, %s; want 1 naming the key", id, key, code, out)
		}
		mustExec(t, e, "UPDATE "+e.Table+` SET headers = '{"x-forged": "renamed"}' WHERE id = $1`, id)
		if code, out := e.cli("dlq", "replay", "--id", idText); code != 0 {
			t.Errorf("replay of row %d after renaming the key: exit %d, %s", id, code, out)
		}
		break // one is enough
	}
	waitFor(t, 15*time.Second, "dead_lettered_total{reason=reserved_header} = every forged row", func() bool {
		ss, err := r.Scrape()
		v, _ := testkit.SumMetric(ss, "outbox_relay_dead_lettered_total", map[string]string{"reason": "reserved_header"})
		return err == nil && v == float64(len(forged))
	})
}

// headerValue is the last header of m named key (what Kafka's lastHeader
// returns), "" if none.
func headerValue(m *sarama.ConsumerMessage, key string) string {
	v := ""
	for _, h := range m.Headers {
		if string(h.Key) == key {
			v = string(h.Value)
		}
	}
	return v
}

// Under on_poison: dlq, rows too large for Kafka because of their headers
// (2 MB) or their aggregate_id (1.5 MB, the record key) are dead-lettered in
// a form that fits: no payload, no row headers, a bounded key, each omission
// said in a dlq.* header; an unroutable row keeps its payload in the dead
// letter only while that fits. The relay never halts, the 100 rows after
// them arrive, and the slot moves past all of them.
func TestOversizedRowsNeverHalt(t *testing.T) {
	t.Parallel() // own outbox, relay and topics; no service fault, no shared proxy
	e := newEnv(t, "oversize")
	ctx := context.Background()
	dlq := e.Prefix + ".dlq"
	r := e.startRelay("--dlq-topic", dlq, "--dlq-max-attempts", "2", "--dlq-retry-backoff", "50ms")

	bigKey := strings.Repeat("k", 1_500_000)
	bigHeaders := e.insertRow(t, "order", "order-1", "order.updated", `{"n": 1}`, `{"blob": "`+strings.Repeat("h", 2<<20)+`", "trace": "t"}`)
	bigAggID := e.insertRow(t, "order", bigKey, "order.updated", `{"n": 2}`, `{"trace": "t"}`)
	// Unroutable rows with large payloads: one whose dead letter still fits
	// with its payload, one where the payload must go (the real broker
	// checks the sizing: its message.max.bytes is the default, 1048588).
	fitPayload := `{"blob": "` + strings.Repeat("p", 990_000) + `"}`
	fits := e.insertRow(t, "bad topic!", "order-2", "order.updated", fitPayload, `{"trace": "t"}`)
	noFit := e.insertRow(t, "bad topic!", "order-3", "order.updated", `{"blob": "`+strings.Repeat("p", 999_950)+`"}`, `{"trace": "t"}`)
	w := e.newWriter(51)
	if err := w.run(ctx, 100, 5, 10, 0, ""); err != nil {
		t.Fatal(err)
	}
	end := e.currentLSN(t)

	ws := w.written()
	rs := consume(t, e.topics(), len(ws), 90*time.Second, 3*time.Second)
	requireClean(t, check(t, ws, rs, e.partitions(t)), false)

	letters := readRaw(t, []string{dlq}, 4, 60*time.Second, 2*time.Second)
	if len(letters) != 4 {
		t.Fatalf("%d dead letters, want 4", len(letters))
	}
	for _, l := range letters {
		id, _ := strconv.ParseInt(headerValue(l, "dlq.event_id"), 10, 64)
		switch id {
		case fits:
			if headerValue(l, "dlq.reason") != "invalid_topic" || string(l.Value) != fitPayload || headerValue(l, "trace") != "t" ||
				headerCount(l, "dlq.payload_omitted") != 0 || headerCount(l, "dlq.headers_omitted") != 0 {
				t.Errorf("dead letter of id %d: reason %q, %d payload bytes, trace %q; want invalid_topic with the whole row (it fits)",
					id, headerValue(l, "dlq.reason"), len(l.Value), headerValue(l, "trace"))
			}
			continue
		case noFit:
			if headerValue(l, "dlq.reason") != "invalid_topic" || len(l.Value) != 0 || headerValue(l, "dlq.payload_omitted") != "true" ||
				headerValue(l, "dlq.headers_omitted") != "true" || headerCount(l, "trace") != 0 {
				t.Errorf("dead letter of id %d: reason %q, %d payload bytes, headers %v; want invalid_topic without payload and row headers",
					id, headerValue(l, "dlq.reason"), len(l.Value), l.Headers)
			}
			continue
		}
		if headerValue(l, "dlq.reason") != "message_too_large" || len(l.Value) != 0 || headerValue(l, "dlq.payload_omitted") != "true" {
			t.Errorf("dead letter of id %d: reason %q, %d payload bytes, payload_omitted %q; want message_too_large without payload",
				id, headerValue(l, "dlq.reason"), len(l.Value), headerValue(l, "dlq.payload_omitted"))
		}
		if headerCount(l, "blob") != 0 || headerCount(l, "trace") != 0 || headerValue(l, "dlq.headers_omitted") != "true" {
			t.Errorf("dead letter of id %d: the row's headers must be dropped and dlq.headers_omitted true, got %d headers", id, len(l.Headers))
		}
		switch id {
		case bigHeaders:
			if string(l.Key) != "order-1" || headerCount(l, "dlq.key_truncated") != 0 {
				t.Errorf("dead letter of id %d: key %q, dlq.key_truncated %q; a short key stays as it is", id, l.Key, headerValue(l, "dlq.key_truncated"))
			}
		case bigAggID:
			if len(l.Key) > 128 || !strings.HasPrefix(string(l.Key), bigKey[:32]) ||
				headerValue(l, "dlq.key_truncated") != strconv.Itoa(len(bigKey)) || headerValue(l, "aggregate_id") != string(l.Key) {
				t.Errorf("dead letter of id %d: key of %d bytes %.40q, dlq.key_truncated %q, aggregate_id header of %d bytes; want a bounded key (<= 128 bytes) and the original length",
					id, len(l.Key), l.Key, headerValue(l, "dlq.key_truncated"), len(headerValue(l, "aggregate_id")))
			}
		default:
			t.Errorf("dead letter of id %d, which is not an oversized row", id)
		}
	}
	waitFor(t, 30*time.Second, "slot past the oversized rows and the 100 after them", func() bool { return e.slotLSN(t) >= end })
	waitFor(t, 15*time.Second, "dead-letter metric", func() bool { return r.metric("outbox_relay_dead_lettered_total") == 4 })
	if h := r.metric("outbox_relay_halted"); h != 0 {
		t.Errorf("outbox_relay_halted = %v, want 0", h)
	}
	if code, body := r.get("/readyz"); code != 200 {
		t.Errorf("/readyz = %d %q, want 200", code, body)
	}
}
