// Command orders is a sample order service: each order change and its
// event commit in ONE transaction, written with package outbox.
//
//	go run ./examples/orders --postgres-url postgres://... [--rate 5] [--duration 30s]
//
// It creates its orders table, then creates and pays orders at --rate per
// second until Ctrl-C. Run outbox-relay against the same database to
// publish the events to outbox.event.order.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/internal/sample"
	"github.com/outbox-relay/outbox-relay/outbox"
)

// OrderCreated and OrderPaid are the payloads, version 1.
type OrderCreated struct {
	OrderID    string `json:"order_id"`
	Customer   string `json:"customer"`
	TotalCents int    `json:"total_cents"`
}

type OrderPaid struct {
	OrderID    string `json:"order_id"`
	TotalCents int    `json:"total_cents"`
}

func main() {
	pg := sample.PostgresURL()
	table := flag.String("table", outbox.DefaultTable, "outbox table (the relay's postgres.table)")
	rate := flag.Int("rate", 5, "order changes per second")
	duration := sample.Duration()
	flag.Parse()
	ctx, stop := sample.Context(*duration, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *pg, *table, *rate); err != nil && ctx.Err() == nil {
		fmt.Fprintln(os.Stderr, "orders:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, pgURL, table string, rate int) error {
	if pgURL == "" {
		return fmt.Errorf("--postgres-url (or OUTBOX_RELAY_POSTGRES_URL) is required")
	}
	w, err := outbox.NewWriter(outbox.WithTable(table))
	if err != nil {
		return err
	}
	db, err := pgxpool.New(ctx, pgURL)
	if err != nil {
		return err
	}
	defer db.Close()
	if _, err := db.Exec(ctx, `CREATE TABLE IF NOT EXISTS orders (
		id text PRIMARY KEY, customer text NOT NULL, total_cents int NOT NULL, status text NOT NULL)`); err != nil {
		return err
	}
	t := time.NewTicker(time.Second / time.Duration(max(rate, 1)))
	defer t.Stop()
	open := map[string]int{}
	run := time.Now().Unix() % 100000
	for n := 1; ; n++ {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		var id string
		for k := range open {
			if mrand.IntN(2) == 0 {
				id = k
				break
			}
		}
		if id != "" {
			err = pay(ctx, db, w, id, open[id])
			delete(open, id)
		} else {
			id = fmt.Sprintf("ord_%05d_%d", run, n)
			open[id] = 100 + mrand.IntN(20000)
			err = create(ctx, db, w, id, fmt.Sprintf("cust_%d", mrand.IntN(50)), open[id])
		}
		if err != nil {
			return err
		}
	}
}

// create inserts the order and its order.created event in one transaction.
func create(ctx context.Context, db *pgxpool.Pool, w *outbox.Writer, id, customer string, cents int) error {
	ctx = outbox.WithTraceparent(ctx, newTraceparent()) // as an incoming request would carry
	tx, err := db.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "INSERT INTO orders (id, customer, total_cents, status) VALUES ($1, $2, $3, 'created')", id, customer, cents); err != nil {
		return err
	}
	if err := w.Write(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: id, EventType: "order.created", SchemaVersion: 1,
		Payload: OrderCreated{OrderID: id, Customer: customer, TotalCents: cents}, Headers: map[string]string{"tenant_id": "acme"}}); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	fmt.Printf("orders   %-16s order.created %6.2f  (order row + outbox event, one transaction)\n", id, float64(cents)/100)
	return nil
}

// pay marks the order paid and writes order.paid in one transaction.
func pay(ctx context.Context, db *pgxpool.Pool, w *outbox.Writer, id string, cents int) error {
	ctx = outbox.WithTraceparent(ctx, newTraceparent())
	tx, err := db.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "UPDATE orders SET status = 'paid' WHERE id = $1", id); err != nil {
		return err
	}
	if err := w.Write(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: id, EventType: "order.paid", SchemaVersion: 1,
		Payload: OrderPaid{OrderID: id, TotalCents: cents}, Headers: map[string]string{"tenant_id": "acme"}}); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	fmt.Printf("orders   %-16s order.paid    %6.2f  (status + outbox event, one transaction)\n", id, float64(cents)/100)
	return nil
}

func newTraceparent() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return "00-" + hex.EncodeToString(b[:16]) + "-" + hex.EncodeToString(b[16:]) + "-01"
}
