// Command demo is the sample service and viewer behind `make demo`: it
// writes orders and their outbox events in real transactions, reads the
// events back from Kafka and prints them with the relay's slot lag.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"
)

func main() {
	pg := flag.String("postgres-url", os.Getenv("OUTBOX_RELAY_POSTGRES_URL"), "PostgreSQL URL")
	brokers := flag.String("kafka-brokers", os.Getenv("OUTBOX_RELAY_KAFKA_BROKERS"), "Kafka brokers")
	metrics := flag.String("metrics", "http://127.0.0.1:9187/metrics", "relay metrics URL")
	rate := flag.Int("rate", 5, "orders per second")
	duration := flag.Duration("duration", 0, "stop after this long (0 = until Ctrl-C)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if *duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *duration)
		defer cancel()
	}
	if err := run(ctx, *pg, strings.Split(*brokers, ","), *metrics, *rate); err != nil && ctx.Err() == nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, pgURL string, brokers []string, metricsURL string, rate int) error {
	db, err := pgxpool.New(ctx, pgURL)
	if err != nil {
		return err
	}
	defer db.Close()
	if _, err := db.Exec(ctx, `CREATE TABLE IF NOT EXISTS orders (
		id text PRIMARY KEY, customer text NOT NULL, total numeric NOT NULL, status text NOT NULL)`); err != nil {
		return err
	}
	var written atomic.Int64
	go func() {
		if err := writeOrders(ctx, db, rate, &written); err != nil && ctx.Err() == nil {
			fmt.Fprintln(os.Stderr, "order service:", err)
		}
	}()
	go printLag(ctx, metricsURL, &written)
	return watch(ctx, brokers)
}

// writeOrders is the sample service: each business change and its event
// commit in ONE transaction.
func writeOrders(ctx context.Context, db *pgxpool.Pool, rate int, written *atomic.Int64) error {
	t := time.NewTicker(time.Second / time.Duration(max(rate, 1)))
	defer t.Stop()
	var open []string
	for n := 1; ; n++ {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		tx, err := db.Begin(ctx)
		if err != nil {
			return err
		}
		var id, event, status string
		if len(open) > 0 && rand.IntN(2) == 0 {
			id, open = open[0], open[1:]
			event, status = "order.paid", "paid"
			_, err = tx.Exec(ctx, "UPDATE orders SET status = $2 WHERE id = $1", id, status)
		} else {
			id = fmt.Sprintf("ord_%05d", n)
			open = append(open, id)
			event, status = "order.created", "created"
			_, err = tx.Exec(ctx, "INSERT INTO orders (id, customer, total, status) VALUES ($1, $2, $3, $4)",
				id, fmt.Sprintf("cust_%d", rand.IntN(50)), rand.IntN(20000)/100.0, status)
		}
		if err == nil {
			_, err = tx.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers)
				VALUES ('order', $1, $2, jsonb_build_object('order_id', $1::text, 'status', $3::text),
				        jsonb_build_object('trace_id', md5(random()::text), 'schema_version', '1'))`, id, event, status)
		}
		if err != nil {
			tx.Rollback(ctx)
			return err
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		written.Add(1)
	}
}

func watch(ctx context.Context, brokers []string) error {
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V3_6_0_0
	cfg.Consumer.MaxWaitTime = 10 * time.Millisecond // show commit->read, not the fetch wait
	var client sarama.Client
	var err error
	for {
		client, err = sarama.NewClient(brokers, cfg)
		if err == nil {
			if err = client.RefreshMetadata("outbox.event.order"); err == nil {
				if parts, _ := client.Partitions("outbox.event.order"); len(parts) > 0 {
					break
				}
			}
			client.Close()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(500 * time.Millisecond):
		}
	}
	defer client.Close()
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		return err
	}
	defer consumer.Close()
	parts, _ := client.Partitions("outbox.event.order")
	out := make(chan *sarama.ConsumerMessage)
	for _, p := range parts {
		pc, err := consumer.ConsumePartition("outbox.event.order", p, sarama.OffsetOldest)
		if err != nil {
			return err
		}
		defer pc.AsyncClose()
		go func() {
			for m := range pc.Messages() {
				out <- m
			}
		}()
	}
	fmt.Println("reading outbox.event.order from Kafka (Ctrl-C stops everything)")
	for {
		select {
		case <-ctx.Done():
			return nil
		case m := <-out:
			h := map[string]string{}
			for _, x := range m.Headers {
				h[string(x.Key)] = string(x.Value)
			}
			lag := time.Since(m.Timestamp).Round(time.Millisecond)
			fmt.Printf("kafka  %s/%d@%-5d key=%-9s %-13s event_id=%-5s pg_lsn=%-10s commit->read %s  %s\n",
				m.Topic, m.Partition, m.Offset, m.Key, h["event_type"], h["event_id"], h["pg_lsn"], lag, m.Value)
		}
	}
}

func printLag(ctx context.Context, url string, written *atomic.Int64) {
	t := time.NewTicker(3 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		m := scrape(url)
		fmt.Printf("relay  written=%d published=%.0f inflight=%.0f slot_lag_bytes=%.0f retained_wal_bytes=%.0f confirmed_lsn=%s\n",
			written.Load(), m["outbox_relay_events_published_total"], m["outbox_relay_inflight_events"],
			m["outbox_relay_slot_lag_bytes"], m["outbox_relay_slot_retained_wal_bytes"], lsn(m["outbox_relay_confirmed_lsn"]))
	}
}

func lsn(f float64) string {
	v := uint64(f)
	return fmt.Sprintf("%X/%X", v>>32, uint32(v))
}

func scrape(url string) map[string]float64 {
	out := map[string]float64{}
	resp, err := http.Get(url)
	if err != nil {
		return out
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		name := f[0]
		if i := strings.IndexByte(name, '{'); i >= 0 {
			name = name[:i]
		}
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
			out[name] += v
		}
	}
	return out
}
