package inbox_test

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/inbox"
)

// One consumer serves versions 1 and 2 of order.created during a rolling
// deploy; an unknown version is an error (retried) that says what is
// handled.
func ExampleRouter() {
	r := inbox.NewRouter()
	r.Handle("order.created", 1, func(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
		var v1 struct{ Total float64 } // v1: total in currency units
		if err := json.Unmarshal(m.Payload, &v1); err != nil {
			return err
		}
		fmt.Printf("v1 order %s: %d cents\n", m.AggregateID, int(v1.Total*100))
		return nil
	})
	r.Handle("order.created", 2, func(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
		var v2 struct{ TotalCents int } // v2: integer cents
		if err := json.Unmarshal(m.Payload, &v2); err != nil {
			return err
		}
		fmt.Printf("v2 order %s: %d cents\n", m.AggregateID, v2.TotalCents)
		return nil
	})
	r.Ignore("order.viewed")

	record := func(id, typ, version, payload string) *inbox.Message {
		return inbox.NewMessage(&sarama.ConsumerMessage{Key: []byte("ord_1"), Value: []byte(payload), Headers: []*sarama.RecordHeader{
			{Key: []byte("event_id"), Value: []byte(id)}, {Key: []byte("event_type"), Value: []byte(typ)},
			{Key: []byte("aggregate_id"), Value: []byte("ord_1")}, {Key: []byte("schema_version"), Value: []byte(version)}}})
	}
	ctx := context.Background()
	var tx pgx.Tx // the Consumer passes the transaction that recorded the event_id
	for _, m := range []*inbox.Message{
		record("1", "order.created", "1", `{"Total":12.5}`),
		record("2", "order.created", "2", `{"TotalCents":1250}`),
		record("3", "order.viewed", "1", `{}`),
		record("4", "order.created", "3", `{}`),
	} {
		if err := r.Dispatch(ctx, tx, m); err != nil {
			fmt.Println(err)
		}
	}
	// Output:
	// v1 order ord_1: 1250 cents
	// v2 order ord_1: 1250 cents
	// inbox: route event 4: no handler for order.created schema_version 3 (handled: versions 1, 2)
}

// A consumer whose side effect (a charge row) commits with the record of
// its event_id: a redelivered event is skipped.
func ExampleNew() {
	run := func(ctx context.Context, pool inbox.DB) error {
		if err := inbox.Migrate(ctx, pool, ""); err != nil { // public.processed_events
			return err
		}
		cfg := inbox.DefaultConfig()
		cfg.Brokers, cfg.GroupID, cfg.Topics = []string{"localhost:9092"}, "billing", []string{"outbox.event.order"}
		c, err := inbox.New(cfg, pool, func(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
			_, err := tx.Exec(ctx, "INSERT INTO charges (order_id, event_id) VALUES ($1, $2)", m.AggregateID, m.EventID)
			return err
		})
		if err != nil {
			return err
		}
		return c.Run(ctx) // until ctx ends; then c.Stats().Duplicates says how many were skipped
	}
	_ = run
}

// Records written as CloudEvents (binary and structured content modes) and
// in the Schema Registry wire format read the same way: the handler sees
// the event's id, type, subject and data; m.CloudEvent and m.SchemaID say
// how it came. The Consumer does this for every record (with
// Config.Decoder for the wire format); ParseMessage shows it on one.
func ExampleParseMessage() {
	header := func(kv ...string) (h []*sarama.RecordHeader) {
		for i := 0; i < len(kv); i += 2 {
			h = append(h, &sarama.RecordHeader{Key: []byte(kv[i]), Value: []byte(kv[i+1])})
		}
		return h
	}
	binary := &sarama.ConsumerMessage{Topic: "orders", Value: []byte(`{"total_cents":1250}`), Headers: header(
		"ce_specversion", "1.0", "ce_id", "0190a1b2-c3d4-7e5f-8a6b-7c8d9e0f1a2b", "ce_source", "/outbox-relay/public/outbox",
		"ce_type", "order.created", "ce_subject", "ord_1", "ce_time", "2026-12-05T10:00:00Z", "content-type", "application/json",
		"ce_tenant", "acme")}
	structured := &sarama.ConsumerMessage{Topic: "orders", Headers: header("content-type", "application/cloudevents+json; charset=UTF-8"),
		Value: []byte(`{"specversion":"1.0","id":"e-2","source":"/outbox-relay/public/outbox","type":"order.paid","subject":"ord_1",` +
			`"datacontenttype":"application/json","data":{"paid":true}}`)}
	notJSON := &sarama.ConsumerMessage{Topic: "orders", Partition: 1, Offset: 7, Headers: structured.Headers, Value: []byte(`{"id":`)}
	for _, r := range []*sarama.ConsumerMessage{binary, structured, notJSON} {
		m, err := inbox.ParseMessage(r)
		if err != nil {
			fmt.Println(err) // the Consumer hands such a record to OnGiveUp, or stops
			continue
		}
		fmt.Printf("%s %s %s %s %s ext=%v\n", m.CloudEvent.Mode, m.EventID, m.EventType, m.AggregateID, m.Payload, m.CloudEvent.Extensions)
	}

	// A value in the Schema Registry wire format: magic byte 0, schema id 7.
	wire := append([]byte{0, 0, 0, 0, 7}, `{"total_cents":1250}`...)
	id, ok := inbox.WireSchemaID(wire)
	fmt.Println("schema id", id, ok)
	// Output:
	// binary 0190a1b2-c3d4-7e5f-8a6b-7c8d9e0f1a2b order.created ord_1 {"total_cents":1250} ext=map[tenant:acme]
	// structured e-2 order.paid ord_1 {"paid":true} ext=map[]
	// inbox: record orders/1@7: not a valid CloudEvent: the value is not a JSON object: unexpected end of JSON input
	// schema id 7 true
}

// jsonDecoder stands for the serialize package's *Serializer: it turns a
// wire-format value into JSON (here the data after the 5-byte header is
// JSON already).
type jsonDecoder struct{}

func (jsonDecoder) Decode(_ context.Context, topic string, v []byte) ([]byte, int, error) {
	id, ok := inbox.WireSchemaID(v)
	if !ok {
		return nil, 0, fmt.Errorf("topic %s: not the wire format", topic)
	}
	return v[5:], id, nil
}

// A consumer of a topic the relay writes with Schema Registry
// serialisation: the handler reads JSON and the schema id.
func ExampleConfig_decoder() {
	cfg := inbox.DefaultConfig()
	cfg.Brokers, cfg.GroupID, cfg.Topics = []string{"localhost:9092"}, "billing", []string{"outbox.event.order"}
	cfg.Decoder = jsonDecoder{} // in production: the serialize package's *Serializer
	handler := func(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
		var order struct {
			TotalCents int `json:"total_cents"`
		}
		if err := json.Unmarshal(m.Payload, &order); err != nil {
			return fmt.Errorf("event %s (schema %d): %w", m.EventID, m.SchemaID, err)
		}
		_, err := tx.Exec(ctx, "INSERT INTO charges (order_id, cents) VALUES ($1, $2)", m.AggregateID, order.TotalCents)
		return err
	}
	_ = func(pool inbox.DB) (*inbox.Consumer, error) { return inbox.New(cfg, pool, handler) }
}
