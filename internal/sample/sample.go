// Package sample holds what the sample programs (examples/orders,
// examples/billing) and the viewer of `make demo` (test/demo) share: their
// connection flags and the context they run under. It is not part of the
// relay.
package sample

import (
	"context"
	"flag"
	"os"
	"os/signal"
	"time"
)

// PostgresURL defines the --postgres-url flag on the default flag set, its
// default taken from OUTBOX_RELAY_POSTGRES_URL. Call it from main before
// flag.Parse.
func PostgresURL() *string {
	return flag.String("postgres-url", os.Getenv("OUTBOX_RELAY_POSTGRES_URL"), "PostgreSQL URL (env OUTBOX_RELAY_POSTGRES_URL)")
}

// KafkaBrokers defines the --kafka-brokers flag on the default flag set, its
// default taken from OUTBOX_RELAY_KAFKA_BROKERS. Call it from main before
// flag.Parse.
func KafkaBrokers() *string {
	return flag.String("kafka-brokers", os.Getenv("OUTBOX_RELAY_KAFKA_BROKERS"), "Kafka brokers, comma-separated (env OUTBOX_RELAY_KAFKA_BROKERS)")
}

// Duration defines the --duration flag on the default flag set: how long the
// program runs, 0 for until Ctrl-C. Call it from main before flag.Parse.
func Duration() *time.Duration {
	return flag.Duration("duration", 0, "stop after this long (0 = until Ctrl-C)")
}

// Context returns a context that ends at the first of sigs (at least one:
// none would mean every signal) to arrive or,
// when d > 0, after d; stop releases its resources and restores the default
// handling of sigs. Call it once, from main.
func Context(d time.Duration, sigs ...os.Signal) (ctx context.Context, stop context.CancelFunc) {
	ctx, unnotify := signal.NotifyContext(context.Background(), sigs...)
	if d <= 0 {
		return ctx, unnotify
	}
	ctx, cancel := context.WithTimeout(ctx, d)
	return ctx, func() { cancel(); unnotify() }
}
