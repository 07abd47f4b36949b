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
