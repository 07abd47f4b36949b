package inbox

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
)

func msg(eventType string, headers map[string]string) *Message {
	h := map[string]string{"event_id": "42", "event_type": eventType}
	for k, v := range headers {
		h[k] = v
	}
	return &Message{EventID: "42", EventType: eventType, Headers: h}
}

func TestRouter(t *testing.T) {
	var got string
	h := func(name string) Handler {
		return func(context.Context, pgx.Tx, *Message) error { got = name; return nil }
	}
	r := NewRouter()
	r.Handle("order.created", 1, h("created v1"))
	r.Handle("order.created", 2, h("created v2"))
	r.Handle("order.paid", 0, h("paid unversioned"))
	r.Ignore("order.viewed")
	tests := []struct {
		name      string
		m         *Message
		want      string // handler called
		wantErr   string
		unroutabe bool
	}{
		{"N-1", msg("order.created", map[string]string{"schema_version": "1"}), "created v1", "", false},
		{"N", msg("order.created", map[string]string{"schema_version": "2"}), "created v2", "", false},
		{"no version header is 0", msg("order.paid", nil), "paid unversioned", "", false},
		{"ignored", msg("order.viewed", map[string]string{"schema_version": "9"}), "", "", false},
		{"unknown version", msg("order.created", map[string]string{"schema_version": "3"}), "",
			"no handler for order.created schema_version 3 (handled: versions 1, 2)", true},
		{"missing version of a versioned type", msg("order.created", nil), "", "schema_version 0 (handled: versions 1, 2)", true},
		{"unknown type", msg("order.shipped", nil), "",
			`no handler for event_type "order.shipped" (handled: "order.created", "order.paid", "order.viewed" (ignored))`, true},
		{"bad version", msg("order.created", map[string]string{"schema_version": "v2"}), "", `header schema_version="v2" is not a non-negative integer`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got = ""
			err := r.Dispatch(context.Background(), nil, tt.m)
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("error %v, want %q", err, tt.wantErr)
			}
			if errors.Is(err, ErrUnroutable) != tt.unroutabe {
				t.Errorf("errors.Is(ErrUnroutable) = %v", !tt.unroutabe)
			}
			if got != tt.want {
				t.Errorf("called %q, want %q", got, tt.want)
			}
		})
	}
}

func TestRouterPanicsOnMisuse(t *testing.T) {
	nop := func(context.Context, pgx.Tx, *Message) error { return nil }
	for name, f := range map[string]func(r *Router){
		"twice":           func(r *Router) { r.Handle("a", 1, nop); r.Handle("a", 1, nop) },
		"negative":        func(r *Router) { r.Handle("a", -1, nop) },
		"nil":             func(r *Router) { r.Handle("a", 1, nil) },
		"handled ignored": func(r *Router) { r.Ignore("a"); r.Handle("a", 1, nop) },
		"ignore handled":  func(r *Router) { r.Handle("a", 1, nop); r.Ignore("a") },
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Error("no panic")
				}
			}()
			f(NewRouter())
		})
	}
}

func TestConfigValidate(t *testing.T) {
	ok := DefaultConfig()
	ok.Brokers, ok.GroupID, ok.Topics = []string{"k:9092"}, "billing", []string{"outbox.event.order"}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	tests := []struct {
		name   string
		change func(c *Config)
		want   []string
	}{
		{"empty", func(c *Config) { *c = Config{} }, []string{"Brokers is empty", "GroupID is empty", "Topics is empty", "Table", "TTL is 0s", "CleanupBatch is 0", "Retry is 0s..0s"}},
		{"table", func(c *Config) { c.Table = `"x"` }, []string{`Table "\"x\"": quoted identifiers`}},
		{"attempts", func(c *Config) { c.MaxAttempts = -1 }, []string{"MaxAttempts is -1"}},
		{"retry", func(c *Config) { c.Retry.Max = time.Millisecond }, []string{"Retry is 100ms..1ms"}},
		{"ttl", func(c *Config) { c.TTL = -time.Hour }, []string{"TTL is -1h0m0s"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := ok
			tt.change(&c)
			err := c.Validate()
			for _, w := range tt.want {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("error %v, want it to contain %q", err, w)
				}
			}
		})
	}
}

func TestMigrationSQL(t *testing.T) {
	q, err := MigrationSQL("")
	if err != nil || !strings.Contains(q, `CREATE TABLE IF NOT EXISTS "public"."processed_events"`) || !strings.Contains(q, `PRIMARY KEY (consumer, event_id)`) ||
		!strings.Contains(q, `CREATE INDEX IF NOT EXISTS "processed_events_processed_at_idx" ON "public"."processed_events" (consumer, processed_at)`) {
		t.Errorf("default: %v\n%s", err, q)
	}
	if q, err := MigrationSQL("Billing.Seen"); err != nil || !strings.Contains(q, `"Billing"."Seen"`) {
		t.Errorf("named: %v\n%s", err, q)
	}
	if _, err := MigrationSQL("a;drop table x"); err == nil {
		t.Error("an injected name was accepted")
	}
}

func TestNewMessage(t *testing.T) {
	m := NewMessage(&sarama.ConsumerMessage{Topic: "outbox.event.order", Partition: 2, Offset: 7, Key: []byte("ord_1"), Value: []byte(`{}`),
		Headers: []*sarama.RecordHeader{{Key: []byte("event_id"), Value: []byte("42")}, {Key: []byte("event_type"), Value: []byte("order.created")},
			{Key: []byte("aggregate_type"), Value: []byte("order")}, {Key: []byte("aggregate_id"), Value: []byte("ord_1")},
			{Key: []byte("schema_version"), Value: []byte("2")}, nil}})
	v, err := m.SchemaVersion()
	if m.EventID != "42" || m.EventType != "order.created" || m.AggregateType != "order" || m.AggregateID != "ord_1" || v != 2 || err != nil ||
		m.Topic != "outbox.event.order" || m.Partition != 2 || m.Offset != 7 {
		t.Errorf("%+v %d %v", m, v, err)
	}
}

// event_id is text: a UUID (rows since migration 0006, message events) and
// a decimal row id (older rows) are both dedup keys, and never equal.
func TestNewMessageEventIDKinds(t *testing.T) {
	for _, id := range []string{"0190a1b2-c3d4-7e5f-8a6b-7c8d9e0f1a2b", "42"} {
		m := NewMessage(&sarama.ConsumerMessage{Headers: []*sarama.RecordHeader{{Key: []byte("event_id"), Value: []byte(id)},
			{Key: []byte("outbox_id"), Value: []byte("42")}, {Key: []byte("outbox_replay"), Value: []byte("2026-05-06T07:00:00Z")}}})
		if m.EventID != id || m.Headers["outbox_id"] != "42" {
			t.Errorf("event_id %q: Message %+v", id, m)
		}
	}
	if q, _ := MigrationSQL(""); !strings.Contains(q, "event_id     text") {
		t.Errorf("processed_events.event_id must be text, for UUIDs and ids alike:\n%s", q)
	}
}

func TestFailedErrorSaysWhatToDo(t *testing.T) {
	err := error(&FailedError{Topic: "t", Partition: 1, Offset: 9, EventID: "", Attempts: 1, Err: ErrNoEventID})
	if !errors.Is(err, ErrNoEventID) || !strings.Contains(err.Error(), "t/1@9") || !strings.Contains(err.Error(), "OnGiveUp") {
		t.Errorf("%v", err)
	}
}

// The default consumer skips what aborted Kafka transactions wrote
// (delivery: exactly_once): read_uncommitted would hand it the relay's
// aborted copies.
func TestSaramaConfigReadsCommitted(t *testing.T) {
	if got := SaramaConfig().Consumer.IsolationLevel; got != sarama.ReadCommitted {
		t.Fatalf("Consumer.IsolationLevel = %v, want sarama.ReadCommitted", got)
	}
}
