// Command demo is the viewer behind `make demo`: while examples/orders
// writes orders and their outbox events and examples/billing consumes them
// with package inbox, it prints the relay's slot lag and, once, publishes a
// few records the relay already delivered a second time (as a relay restart
// or rewind would), so that billing shows "skipped duplicate".
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"
)

const topic = "outbox.event.order"

func main() {
	pg := flag.String("postgres-url", os.Getenv("OUTBOX_RELAY_POSTGRES_URL"), "PostgreSQL URL")
	brokers := flag.String("kafka-brokers", os.Getenv("OUTBOX_RELAY_KAFKA_BROKERS"), "Kafka brokers")
	metrics := flag.String("metrics", "http://127.0.0.1:9187/metrics", "relay metrics URL")
	after := flag.Duration("republish-after", 8*time.Second, "when to publish a few delivered records again")
	count := flag.Int("republish", 3, "how many records to publish again")
	duration := flag.Duration("duration", 0, "stop after this long (0 = until Ctrl-C)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if *duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *duration)
		defer cancel()
	}
	db, err := pgxpool.New(ctx, *pg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
	defer db.Close()
	go func() {
		select {
		case <-ctx.Done():
			return
		case <-time.After(*after):
		}
		if err := republish(strings.Split(*brokers, ","), *count); err != nil {
			fmt.Fprintln(os.Stderr, "demo: republish:", err)
		}
	}()
	printLag(ctx, *metrics, db)
}

// republish reads the last n records of the topic's first non-empty
// partition and produces them again, headers (event_id) included.
func republish(brokers []string, n int) error {
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V3_6_0_0
	cfg.Producer.Return.Successes = true
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	client, err := sarama.NewClient(brokers, cfg)
	if err != nil {
		return err
	}
	defer client.Close()
	parts, err := client.Partitions(topic)
	if err != nil {
		return err
	}
	for _, p := range parts {
		newest, err := client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil || newest == 0 {
			continue
		}
		consumer, err := sarama.NewConsumerFromClient(client)
		if err != nil {
			return err
		}
		defer consumer.Close()
		from := max(newest-int64(n), 0)
		pc, err := consumer.ConsumePartition(topic, p, from)
		if err != nil {
			return err
		}
		var again []*sarama.ProducerMessage
		var ids []string
		for m := range pc.Messages() {
			var hs []sarama.RecordHeader
			for _, h := range m.Headers {
				hs = append(hs, *h)
				if string(h.Key) == "event_id" {
					ids = append(ids, string(h.Value))
				}
			}
			again = append(again, &sarama.ProducerMessage{Topic: topic, Partition: p, Key: sarama.ByteEncoder(m.Key), Value: sarama.ByteEncoder(m.Value), Headers: hs})
			if m.Offset >= newest-1 {
				break
			}
		}
		pc.AsyncClose()
		producer, err := sarama.NewSyncProducerFromClient(client)
		if err != nil {
			return err
		}
		defer producer.Close()
		if err := producer.SendMessages(again); err != nil {
			return err
		}
		fmt.Printf("demo     published %d delivered records again (event_id %s), as a relay restart would: billing must skip them\n",
			len(again), strings.Join(ids, ", "))
		return nil
	}
	return fmt.Errorf("no record in %s yet", topic)
}

func printLag(ctx context.Context, url string, db *pgxpool.Pool) {
	t := time.NewTicker(3 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		m := scrape(url)
		var written int64
		_ = db.QueryRow(ctx, "SELECT count(*) FROM outbox").Scan(&written)
		fmt.Printf("relay    outbox rows=%d published=%.0f inflight=%.0f slot_lag_bytes=%.0f retained_wal_bytes=%.0f confirmed_lsn=%s\n",
			written, m["outbox_relay_events_published_total"], m["outbox_relay_inflight_events"],
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
