//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/rs/zerolog"

	"github.com/outbox-relay/outbox-relay/replication"
)

// readSyscalls is this process's read system calls so far (/proc/self/io).
func readSyscalls(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "syscr: "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no syscr in /proc/self/io")
	return 0
}

// A stream catching up on a backlog reads it in large chunks: the
// walsender flushes every message on its own, so a reader that keeps up
// would make a read system call per message. Not parallel: the count is the whole process's.
func TestStreamCatchingUpReadsInChunks(t *testing.T) {
	e := newEnv(t, "catchup")
	ctx := context.Background()
	const txns, rows = 200, 100 // 20,000 inserts of ~600 bytes: 12 MB of messages
	for i := range txns {
		if _, err := e.DB.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (aggregate_type, aggregate_id, event_type, payload)
			SELECT 'order', 'agg-' || g, 'order.created', jsonb_build_object('seq', g, 'pad', repeat('x', 500))
			FROM generate_series(%d, %d) AS g`, e.Table, i*rows, i*rows+rows-1)); err != nil {
			t.Fatal(err)
		}
	}
	cfg := replication.DefaultConfig()
	cfg.URL, cfg.Slot, cfg.Publication, cfg.Table = pgURL, e.Slot, e.Pub, e.Table
	var logs bytes.Buffer
	s, err := replication.NewStream(cfg, &progress{}, zerolog.New(&logs), nil)
	if err != nil {
		t.Fatal(err)
	}
	var inserts, messages atomic.Int64
	var before atomic.Int64
	before.Store(-1)
	done := make(chan error, 1)
	go func() {
		done <- s.Run(ctx, func(_ context.Context, _ pglogrepl.LSN, data []byte) error {
			if messages.Add(1) == 1 {
				before.Store(readSyscalls(t)) // from the first message: the session's setup reads are not the point
			}
			if len(data) > 0 && data[0] == 'I' {
				inserts.Add(1)
			}
			return nil
		})
	}()
	waitFor(t, 60*time.Second, "every insert streamed", func() bool { return inserts.Load() >= txns*rows })
	reads := readSyscalls(t) - before.Load()
	s.Close()
	if err := <-done; err != nil {
		t.Fatalf("run: %v\n%s", err, logs.String())
	}
	t.Logf("%d WAL messages (%d inserts) in %d read system calls of the whole process", messages.Load(), inserts.Load(), reads)
	// Measured on a 2-core box: about 0.75 reads per message without the
	// catch-up waits, one per 8-9 messages with 50 us sleeps, one per ~22
	// with the receive low-water mark (938 reads). The bound holds on a
	// walsender slower than a mark per catchUpMaxWait too.
	if reads*4 > messages.Load() {
		t.Fatalf("%d read system calls for %d WAL messages: the stream read the backlog a message or two at a time, want at most one read per 4 messages", reads, messages.Load())
	}
}

// A backlog of one-row transactions goes to Kafka in large produce
// requests (the stream reads it in batches, and the direct producer sends
// at most one request per broker every 5 ms while catching up: 7 requests
// for these 4000 events, 20 without the 5 ms), and the consumer sees every
// event once.
func TestBacklogOfSmallTransactionsGoesInLargeRequests(t *testing.T) {
	t.Parallel() // own outbox, relay and topics
	e := newEnv(t, "catchupreq")
	ctx := context.Background()
	const n = 4000 // ~3 MB of WAL: far more than the 256 KiB that counts as a backlog
	if _, err := e.DB.Exec(ctx, fmt.Sprintf(`DO $$ BEGIN FOR i IN 0..%d LOOP
		INSERT INTO %s (aggregate_type, aggregate_id, event_type, payload)
		VALUES ('order', 'agg-' || (i %% 50), 'order.created', jsonb_build_object('seq', i, 'pad', repeat('x', 400)));
		COMMIT; END LOOP; END $$`, n-1, e.Table)); err != nil {
		t.Fatal(err)
	}
	r := e.startRelay()
	waitFor(t, 60*time.Second, "every event published", func() bool { return r.metric("outbox_relay_events_published_total") >= n })
	requests := r.metric("outbox_relay_kafka_produce_requests_total")
	t.Logf("%d events of one-row transactions in %.0f produce requests", n, requests)
	if requests <= 0 || requests*10 > n {
		t.Fatalf("%.0f produce requests for a backlog of %d one-row transactions: want at most one per 10 events (records batched while catching up)", requests, n)
	}
	got := consume(t, e.topics()[:1], n, 60*time.Second, 2*time.Second)
	seen := map[string]bool{}
	for _, rec := range got {
		if seen[string(rec.Value)] {
			t.Fatalf("event delivered twice: %s", rec.Value)
		}
		seen[string(rec.Value)] = true
	}
	if len(seen) != n {
		t.Fatalf("consumer read %d distinct events, want %d", len(seen), n)
	}
}
