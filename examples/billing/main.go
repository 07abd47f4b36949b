// Command billing is a sample consumer of the order events, built on
// package inbox: it bills each order once, however often Kafka delivers
// its events.
//
//	go run ./examples/billing --postgres-url postgres://... --kafka-brokers localhost:9092
//
// order.created (schema_version 1) opens an invoice, order.paid (versions 1
// and 2) records the payment; each in the transaction that records the
// event_id in processed_events, so a redelivered event is skipped
// ("skipped duplicate") and never bills twice.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/outbox-relay/outbox-relay/inbox"
	"github.com/outbox-relay/outbox-relay/internal/sample"
)

func main() {
	pg, brokers := sample.PostgresURL(), sample.KafkaBrokers()
	group := flag.String("group", "billing", "Kafka consumer group")
	topic := flag.String("topic", "outbox.event.order", "topic to consume")
	duration := sample.Duration()
	flag.Parse()
	ctx, stop := sample.Context(*duration, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *pg, strings.Split(*brokers, ","), *group, *topic); err != nil {
		fmt.Fprintln(os.Stderr, "billing:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, pgURL string, brokers []string, group, topic string) error {
	if pgURL == "" || brokers[0] == "" {
		return fmt.Errorf("--postgres-url and --kafka-brokers (or OUTBOX_RELAY_POSTGRES_URL, OUTBOX_RELAY_KAFKA_BROKERS) are required")
	}
	db, err := pgxpool.New(ctx, pgURL)
	if err != nil {
		return err
	}
	defer db.Close()
	if err := inbox.Migrate(ctx, db, ""); err != nil { // public.processed_events
		return err
	}
	if _, err := db.Exec(ctx, `CREATE TABLE IF NOT EXISTS invoices (
		order_id text PRIMARY KEY, total_cents int NOT NULL, paid_cents int NOT NULL DEFAULT 0, payments int NOT NULL DEFAULT 0)`); err != nil {
		return err
	}

	r := inbox.NewRouter()
	r.Handle("order.created", 1, func(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
		var ev struct {
			OrderID    string `json:"order_id"`
			TotalCents int    `json:"total_cents"`
		}
		if err := json.Unmarshal(m.Payload, &ev); err != nil {
			return fmt.Errorf("order.created v1 payload: %w", err)
		}
		_, err := tx.Exec(ctx, "INSERT INTO invoices (order_id, total_cents) VALUES ($1, $2)", ev.OrderID, ev.TotalCents)
		return err
	})
	paid := func(cents func(payload []byte) (string, int, error)) inbox.Handler {
		return func(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
			id, c, err := cents(m.Payload)
			if err != nil {
				return err
			}
			// Not idempotent on purpose: run twice, it would bill twice.
			_, err = tx.Exec(ctx, "UPDATE invoices SET paid_cents = paid_cents + $2, payments = payments + 1 WHERE order_id = $1", id, c)
			return err
		}
	}
	r.Handle("order.paid", 1, paid(func(p []byte) (string, int, error) { // N-1: total_cents
		var ev struct {
			OrderID    string `json:"order_id"`
			TotalCents int    `json:"total_cents"`
		}
		err := json.Unmarshal(p, &ev)
		return ev.OrderID, ev.TotalCents, err
	}))
	r.Handle("order.paid", 2, paid(func(p []byte) (string, int, error) { // N: amount.cents
		var ev struct {
			OrderID string `json:"order_id"`
			Amount  struct {
				Cents int `json:"cents"`
			} `json:"amount"`
		}
		err := json.Unmarshal(p, &ev)
		return ev.OrderID, ev.Amount.Cents, err
	}))

	cfg := inbox.DefaultConfig()
	cfg.Brokers, cfg.GroupID, cfg.Topics = brokers, group, []string{topic}
	cfg.Logger = zerolog.New(zerolog.ConsoleWriter{Out: os.Stderr, TimeFormat: time.TimeOnly}).Level(zerolog.WarnLevel).With().Timestamp().Logger()
	cfg.Observe = func(m *inbox.Message, o inbox.Outcome) {
		what := map[inbox.Outcome]string{inbox.Applied: "applied          ", inbox.Duplicate: "skipped duplicate", inbox.GaveUp: "gave up          "}[o]
		fmt.Printf("billing  %s event_id=%-5s %-13s %-16s %s/%d@%d\n", what, m.EventID, m.EventType, m.AggregateID, m.Topic, m.Partition, m.Offset)
	}
	c, err := inbox.New(cfg, db, r.Dispatch)
	if err != nil {
		return err
	}
	go func() {
		t := time.NewTicker(5 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				s := c.Stats()
				fmt.Printf("billing  records consumed=%d applied=%d duplicates skipped=%d handler errors=%d\n", s.Consumed, s.Applied, s.Duplicates, s.HandlerErrors)
			}
		}
	}()
	err = c.Run(ctx)
	s := c.Stats()
	fmt.Printf("billing  stopped: records consumed=%d applied=%d duplicates skipped=%d handler errors=%d\n", s.Consumed, s.Applied, s.Duplicates, s.HandlerErrors)
	return err
}
