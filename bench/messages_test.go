package main

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
	"time"
)

// drainOf is a made-up 100/txn drain: pg_recvlogical at rec events/s, the
// relay at rel events/s with cpu seconds over the 1000 events.
func drainOf(rec, rel, cpu float64) *drainShape {
	d := &drainShape{PerTxn: 100, Events: 1000, WALBytes: 700_000}
	for rep := 1; rep <= 3; rep++ {
		d.Runs = append(d.Runs,
			drainRun{Tool: "pg_recvlogical", Rep: rep, Seconds: 1000 / rec, EventsPerS: rec, Walsender: 0.01, ToolCPU: 0.001, Broker: math.NaN()},
			drainRun{Tool: "relay", Rep: rep, Seconds: 1000 / rel, AckSeconds: 1000 / rel, EventsPerS: rel, ToolCPU: cpu, Walsender: 0.01, Broker: 0.02, PeakRSS: 40 << 20, Records: 1000})
	}
	return d
}

func TestIssue40Targets(t *testing.T) {
	sc, _ := scaleFor("small")
	for _, c := range []struct {
		name       string
		rows, msgs *drainShape
		want       []string
	}{
		{"both met", drainOf(100, 95, 0.0024), drainOf(100, 91, 0.0039), []string{
			"| Drain, 100 messages/txn: relay >= 0.9x pg_recvlogical of the same messages, <= 4 us/event | 0.91x (min 0.91x, max 0.91x), 3.90 us/event (min 3.90, max 3.90) | met |",
			"| Drain, 100 rows/txn: relay >= 0.9x pg_recvlogical, <= 2.5 us/event | 0.95x (min 0.95x, max 0.95x), 2.40 us/event (min 2.40, max 2.40) | met |"}},
		// Fast enough but too much CPU, and enough CPU but too slow: both miss.
		{"cpu and speed", drainOf(100, 95, 0.0026), drainOf(100, 80, 0.003), []string{
			"| Drain, 100 messages/txn: relay >= 0.9x pg_recvlogical of the same messages, <= 4 us/event | 0.80x (min 0.80x, max 0.80x), 3.00 us/event (min 3.00, max 3.00) | MISSED |",
			"| Drain, 100 rows/txn: relay >= 0.9x pg_recvlogical, <= 2.5 us/event | 0.95x (min 0.95x, max 0.95x), 2.60 us/event (min 2.60, max 2.60) | MISSED |"}},
		{"not run", nil, nil, []string{
			"| Drain, 100 messages/txn: relay >= 0.9x pg_recvlogical of the same messages, <= 4 us/event | not measured | n/a |"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			res := &results{Started: time.Now(), Scale: sc, Messages: c.msgs}
			if c.rows != nil {
				res.Drains = []*drainShape{c.rows}
			}
			md := res.markdown("x")
			for _, w := range c.want {
				if !strings.Contains(md, w) {
					t.Errorf("report lacks %q", w)
				}
			}
			if c.msgs != nil && !strings.Contains(md, "| **relay CPU, us per event** | ") {
				t.Errorf("report lacks the messages beside rows table")
			}
		})
	}
}

func TestMessagesAndDBCostReport(t *testing.T) {
	sc, _ := scaleFor("small")
	res := &results{Started: time.Now(), Scale: sc, Drains: []*drainShape{drainOf(100, 95, 0.0024)}, Messages: drainOf(160, 150, 0.003)}
	ph := func(rate int, cpu float64) *latPhase {
		return &latPhase{Rate: rate, Shapes: []int{1, 10}, LoadS: 5, RelayCPU: cpu, WalsenderCPU: 0.5, CatchUpS: 0.1, SteadyDelivered: float64(rate),
			Gen:  loadResult{Events: rate * 5, Executed: rate, DurationS: 5},
			AckQ: []float64{0.001, 0.002, 0.005, 0.01, 0.02}, ConsQ: []float64{1, 2, 6, 12, 25}}
	}
	res.Latency = &latencyRun{Phases: []*latPhase{ph(1000, 0.1), ph(5000, 0.3)}}
	res.LatencyMsg = &latencyRun{Phases: []*latPhase{ph(1000, 0.08), ph(5000, 0.25)}}
	res.DBCost = &dbCost{PerTxn: 100, Window: 10 * time.Second,
		Writers: []writerCost{{Name: "outbox.Write, COPY", How: "pgx", Events: 1000, Seconds: 0.1, WALBytes: 870_000, BackendCPU: 0.0075,
			Drain: drainRun{Walsender: 0.0044, EventsPerS: 90000}}},
		Relay: []pgCost{{Name: "idle, no relay", Seconds: 10, WALBytes: 100}, {Name: "idle, relay", Relay: true, Seconds: 10, WALBytes: 2400, Walsender: 0.002, Sessions: 0.01, NSessions: 5,
			Heartbeats: 10, SlotSaves: 10, Each: []sessionUse{{"SELECT pg_logical_emit_message(false, $1::text, $2::text)::text", 0.001}}}}}
	md := res.markdown("x")
	for _, w := range []string{
		"| **ratio relay / pg_recvlogical** | 0.95x (0.95x..0.95x) | 0.94x (0.94x..0.94x) |",
		"| 1000 | messages | 1000 | 1.0 ms | 5.0 ms | 1.0 ms | 6.0 ms | 25.0 ms | 16.0 | 10% | ok |",
		"| 5000 | rows | 5000 |",
		// 870 B, 7.5 us of backend CPU per event; walsender 4.4 ms over 1100 events
		"| outbox.Write, COPY | pgx | 870 | 7.5 | 4.0 | 10000 | 90000 |",
		// 230 B/s minus the 10 B/s without the relay
		"| idle, relay | 240 | 230 | 0.20 | 1.00 | 5 | 1.00 | 1.00 |",
		"| idle, relay | `SELECT pg_logical_emit_message(false, $1::text, $2::text)::text` | 0.10 |",
	} {
		if !strings.Contains(md, w) {
			t.Errorf("report lacks %q", w)
		}
	}
}

// TestEnvelope: the load generator's messages are outbox.WriteMessage's
// envelope, valid JSON with a UUID id, the payload and headers as written.
func TestEnvelope(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	payload := string(appendPayload(nil, 7, 42))
	env := appendEnvelope(nil, rng, "r1000n10", 7, payload, `{"tenant_id":"acme"}`)
	var e struct {
		ID, AggregateType, AggregateID, EventType string
		Payload, Headers                          json.RawMessage
	}
	if err := json.Unmarshal(env, &struct {
		ID            *string          `json:"id"`
		AggregateType *string          `json:"aggregate_type"`
		AggregateID   *string          `json:"aggregate_id"`
		EventType     *string          `json:"event_type"`
		Payload       *json.RawMessage `json:"payload"`
		Headers       *json.RawMessage `json:"headers"`
	}{&e.ID, &e.AggregateType, &e.AggregateID, &e.EventType, &e.Payload, &e.Headers}); err != nil {
		t.Fatalf("%s: %v", env, err)
	}
	if !regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-8[0-9a-f]{3}-[0-9a-f]{12}$`).MatchString(e.ID) {
		t.Errorf("id %q is not a version 4 UUID", e.ID)
	}
	if e.AggregateType != "r1000n10" || e.AggregateID != "agg-7" || e.EventType != "order.updated" || string(e.Payload) != payload || string(e.Headers) != `{"tenant_id":"acme"}` {
		t.Errorf("envelope %s", env)
	}
	if env2 := appendEnvelope(nil, rng, "r1000n10", 7, payload, "{}"); strings.Contains(string(env2), e.ID) {
		t.Errorf("two envelopes share the id %s", e.ID)
	}
}
