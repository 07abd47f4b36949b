package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/outbox"
)

type OrderCreated struct {
	OrderID string `json:"order_id"`
	Total   string `json:"total"`
}

// Write the business change and its event in one transaction.
func ExampleWrite() {
	ctx := context.Background()
	var pool *pgxpool.Pool // pgxpool.New(ctx, url)
	createOrder := func(id, total string) error {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx) // after Commit: a no-op
		if _, err := tx.Exec(ctx, "INSERT INTO orders (id, total) VALUES ($1, $2)", id, total); err != nil {
			return err
		}
		if err := outbox.Write(ctx, tx, outbox.Event{
			AggregateType: "order", AggregateID: id, EventType: "order.created", SchemaVersion: 1,
			Payload: OrderCreated{OrderID: id, Total: total},
		}); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
	_ = createOrder
}

// Invalid events are refused before anything is written, by index and field.
func ExampleWrite_invalidEvents() {
	ctx := context.Background()
	ok := outbox.Event{AggregateType: "order", AggregateID: "ord_1", EventType: "order.created", Payload: json.RawMessage(`{"order_id":"ord_1"}`)}
	for _, bad := range []outbox.Event{
		{AggregateType: "order", AggregateID: "ord_1", Payload: json.RawMessage(`{}`)},
		{AggregateType: "order", AggregateID: "ord_1", EventType: "order.created", Payload: json.RawMessage(`{"order_id":`)},
		{AggregateType: "order", AggregateID: "ord_1", EventType: "order.created", Payload: json.RawMessage(`{}`), Headers: map[string]string{"Event_ID": "42"}},
	} {
		// The events are checked before the transaction is used: nil here.
		fmt.Println(outbox.Write(ctx, nil, ok, bad))
	}
	// Output:
	// outbox: event 1: EventType is empty
	// outbox: event 1: Payload is not valid JSON (unexpected end of JSON input); pass JSON text as json.RawMessage, or a Go value to marshal
	// outbox: event 1: Headers: header name "Event_ID" is reserved: the relay sets event_id, event_type, aggregate_type, aggregate_id, pg_lsn, outbox_id, outbox_replayed_from, outbox_replay and every dlq.* header itself (names compared ignoring case); rename it, e.g. "x-Event_ID"
}

// Carry the W3C trace context of the request into the event's headers
// (traceparent, tracestate) without a tracing dependency: WithTraceparent,
// or set outbox.TraceparentFrom once for a tracer (see its documentation
// for the OpenTelemetry one-liner).
func ExampleWithTraceparent() {
	var pool *pgxpool.Pool
	handle := func(ctx context.Context, incomingTraceparent string) error {
		ctx = outbox.WithTraceparent(ctx, incomingTraceparent)
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx)
		if err := outbox.Write(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: "ord_1", EventType: "order.paid",
			Payload: map[string]int{"cents": 1250}}); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
	_ = handle
}

// Write the event into the WAL only (the table-less outbox): the relay
// publishes it when its messages.prefix is "orders-outbox".
func ExampleWriteMessage() {
	ctx := context.Background()
	var pool *pgxpool.Pool // pgxpool.New(ctx, url)
	payOrder := func(id string) error {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx) // after Commit: a no-op
		if _, err := tx.Exec(ctx, "UPDATE orders SET status = 'paid' WHERE id = $1", id); err != nil {
			return err
		}
		if err := outbox.WriteMessage(ctx, tx, "orders-outbox", outbox.Event{
			AggregateType: "order", AggregateID: id, EventType: "order.paid",
			Payload: json.RawMessage(`{"paid":true}`),
		}); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
	_ = payOrder
}
