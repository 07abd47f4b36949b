//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outbox-relay/outbox-relay/backoff"
	"github.com/outbox-relay/outbox-relay/inbox"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/test/testkit"
)

// inboxEnv is an inbox consumer's database side in a test's schema: the
// processed events table and a charges table, the handler's side effect,
// without any unique constraint, so that a second application shows.
type inboxEnv struct {
	t               *testing.T
	db              *pgxpool.Pool
	processed       string // schema.processed_events
	charges         string // schema.charges
	group, consumer string
}

func newInboxEnv(t *testing.T, db *pgxpool.Pool, schema string) *inboxEnv {
	t.Helper()
	ctx := context.Background()
	ie := &inboxEnv{t: t, db: db, processed: schema + ".processed_events", charges: schema + ".charges", group: "g-" + schema}
	if _, err := db.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+schema); err != nil {
		t.Fatal(err)
	}
	for range 2 { // idempotent
		if err := inbox.Migrate(ctx, db, ie.processed); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.Exec(ctx, "CREATE TABLE "+ie.charges+" (event_id text NOT NULL, aggregate_id text, at timestamptz DEFAULT clock_timestamp())"); err != nil {
		t.Fatal(err)
	}
	return ie
}

func (ie *inboxEnv) config(topics ...string) inbox.Config {
	cfg := inbox.DefaultConfig()
	cfg.Brokers, cfg.GroupID, cfg.Topics, cfg.Table = brokers, ie.group, topics, ie.processed
	cfg.Retry = backoff.Policy{Initial: 10 * time.Millisecond, Max: 100 * time.Millisecond}
	return cfg
}

// charge is the side effect: one row per application.
func (ie *inboxEnv) charge(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
	_, err := tx.Exec(ctx, "INSERT INTO "+ie.charges+" (event_id, aggregate_id) VALUES ($1, $2)", m.EventID, m.AggregateID)
	return err
}

// applications maps event_id to the number of charge rows.
func (ie *inboxEnv) applications() map[string]int {
	ie.t.Helper()
	rows, err := ie.db.Query(context.Background(), "SELECT event_id, count(*) FROM "+ie.charges+" GROUP BY event_id")
	if err != nil {
		ie.t.Fatal(err)
	}
	out := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			ie.t.Fatal(err)
		}
		out[id] = n
	}
	if rows.Err() != nil {
		ie.t.Fatal(rows.Err())
	}
	return out
}

func (ie *inboxEnv) count(q string, args ...any) int {
	ie.t.Helper()
	var n int
	if err := ie.db.QueryRow(context.Background(), q, args...).Scan(&n); err != nil {
		ie.t.Fatal(err)
	}
	return n
}

// running is a Consumer started in a goroutine.
type running struct {
	*inbox.Consumer
	done chan error
}

func startConsumer(t *testing.T, cfg inbox.Config, db inbox.DB, h inbox.Handler) *running {
	t.Helper()
	c, err := inbox.New(cfg, db, h)
	if err != nil {
		t.Fatal(err)
	}
	r := &running{Consumer: c, done: make(chan error, 1)}
	go func() { r.done <- c.Run(context.Background()) }()
	t.Cleanup(func() { c.Close() })
	return r
}

func (r *running) waitConsumed(t *testing.T, n int64, d time.Duration) {
	t.Helper()
	waitFor(t, d, fmt.Sprintf("%d records consumed", n), func() bool {
		select {
		case err := <-r.done:
			t.Fatalf("consumer stopped: %v", err)
		default:
		}
		return r.Stats().Consumed >= n
	})
}

// produce writes records to topic as they are (a duplicate keeps the
// relay's headers, event_id included).
func produce(t *testing.T, topic string, recs []*sarama.ProducerMessage) {
	t.Helper()
	cfg := testkit.SaramaConfig()
	cfg.Producer.Return.Successes = true
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	p, err := sarama.NewSyncProducer(brokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for _, r := range recs {
		r.Topic = topic
	}
	if err := p.SendMessages(recs); err != nil {
		t.Fatal(err)
	}
}

func again(r record) *sarama.ProducerMessage {
	var hs []sarama.RecordHeader
	for k, v := range r.Headers {
		hs = append(hs, sarama.RecordHeader{Key: []byte(k), Value: []byte(v)})
	}
	return &sarama.ProducerMessage{Key: sarama.StringEncoder(r.Key), Value: sarama.ByteEncoder(r.Value), Headers: hs, Partition: r.Partition}
}

// The whole path: events written with outbox.Write, published by the
// relay, then a second copy of some of them in the topic (as a relay
// restart or rewind leaves): the inbox consumer reads every record and
// applies each event exactly once, counting the duplicates it skipped.
func TestInboxTopicWithDuplicatesAppliesEachEventOnce(t *testing.T) {
	t.Parallel() // own outbox, relay and topics; no service fault, no shared proxy
	e := newEnv(t, "inboxdup")
	topic := e.Prefix + ".order"
	if err := testkit.CreateTopics(brokers, 3, nil, topic); err != nil {
		t.Fatal(err)
	}
	r := e.startRelay()
	ctx := context.Background()
	w, err := outbox.NewWriter(outbox.WithTable(e.Table))
	if err != nil {
		t.Fatal(err)
	}
	const txns, perTxn = 15, 4
	for i := range txns {
		tx, err := e.DB.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		evs := make([]outbox.Event, perTxn)
		for j := range evs {
			evs[j] = outbox.Event{AggregateType: "order", AggregateID: fmt.Sprintf("ord_%d", (i*perTxn+j)%7), EventType: "order.created",
				SchemaVersion: 1, Payload: map[string]int{"txn": i, "n": j}}
		}
		if err := w.Write(ctx, tx, evs...); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	events := txns * perTxn
	published := consume(t, []string{topic}, events, 60*time.Second, time.Second)
	if len(published) != events {
		t.Fatalf("the relay published %d records for %d events", len(published), events)
	}
	// A second copy of every other record, and a third of every fifth.
	var dups []*sarama.ProducerMessage
	for i, rec := range published {
		if i%2 == 0 {
			dups = append(dups, again(rec))
		}
		if i%5 == 0 {
			dups = append(dups, again(rec))
		}
	}
	produce(t, topic, dups)
	total := int64(events + len(dups))

	ie := newInboxEnv(t, e.DB, e.Schema)
	reg := prometheus.NewRegistry()
	cfg := ie.config(topic)
	cfg.Registerer = reg
	c := startConsumer(t, cfg, e.DB, ie.charge)
	c.waitConsumed(t, total, 60*time.Second)
	st := c.Stats()
	apps := ie.applications()
	t.Logf("records consumed %d (%d events + %d duplicates produced), duplicates skipped %d, side effects applied %d (charge rows %d for %d distinct events), handler errors %d",
		st.Consumed, events, len(dups), st.Duplicates, st.Applied, sumValues(apps), len(apps), st.HandlerErrors)
	if st.Applied != int64(events) || st.Duplicates != int64(len(dups)) || st.Consumed != total {
		t.Errorf("stats %+v, want %d applied and %d duplicates", st, events, len(dups))
	}
	for _, rec := range published {
		if n := apps[rec.Headers["event_id"]]; n != 1 {
			t.Errorf("event %s applied %d times", rec.Headers["event_id"], n)
		}
	}
	if len(apps) != events {
		t.Errorf("%d events applied, want %d", len(apps), events)
	}
	if n := ie.count("SELECT count(*) FROM "+ie.processed+" WHERE consumer = $1", ie.group); n != events {
		t.Errorf("%d processed_events rows, want %d", n, events)
	}
	if got := metricValue(t, reg, "outbox_relay_inbox_records_total", "duplicate"); got != float64(len(dups)) {
		t.Errorf("outbox_relay_inbox_records_total{outcome=duplicate} = %v, want %d", got, len(dups))
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-c.done; err != nil {
		t.Errorf("Run: %v", err)
	}
	r.stop(syscall.SIGTERM, 30*time.Second)
}

func sumValues(m map[string]int) (n int) {
	for _, v := range m {
		n += v
	}
	return n
}

// metricValue is the value of name{outcome=outcome} in reg (-1 if absent).
func metricValue(t *testing.T, reg *prometheus.Registry, name, outcome string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if mf.GetName() == name && l.GetName() == "outcome" && l.GetValue() == outcome {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return -1
}

// directRecords are n records shaped like the relay's, event ids
// prefix-1..prefix-n, on partition 0 (one aggregate: in order).
func directRecords(prefix string, n int) []*sarama.ProducerMessage {
	out := make([]*sarama.ProducerMessage, n)
	for i := range out {
		id := fmt.Sprintf("%s-%d", prefix, i+1)
		out[i] = &sarama.ProducerMessage{Key: sarama.StringEncoder("ord_1"), Value: sarama.StringEncoder(fmt.Sprintf(`{"n":%d}`, i+1)),
			Headers: []sarama.RecordHeader{{Key: []byte("event_id"), Value: []byte(id)}, {Key: []byte("event_type"), Value: []byte("order.created")},
				{Key: []byte("aggregate_type"), Value: []byte("order")}, {Key: []byte("aggregate_id"), Value: []byte("ord_1")}}}
	}
	return out
}

// helperEnv names the variables of the consumer process TestInboxKill9...
// starts from this test binary.
const helperEnv = "OUTBOX_INBOX_HELPER"

// TestInboxHelperProcess is the consumer process of
// TestInboxKilledBetweenCommitAndOffsetCommit: it only runs when that test
// starts it; otherwise it passes at once.
func TestInboxHelperProcess(t *testing.T) {
	spec := os.Getenv(helperEnv)
	if spec == "" {
		return
	}
	f := strings.Split(spec, "|") // schema|topic
	schema, topic := f[0], f[1]
	db, err := pgxpool.New(context.Background(), pgURL)
	if err != nil {
		t.Fatal(err)
	}
	ie := &inboxEnv{t: t, db: db, processed: schema + ".processed_events", charges: schema + ".charges", group: "g-" + schema}
	cfg := ie.config(topic)
	// Offsets are committed an hour after they are marked, i.e. never
	// before the kill: every transaction this process commits is one whose
	// offset the group does not have.
	cfg.Sarama = inbox.SaramaConfig()
	cfg.Sarama.Consumer.Offsets.AutoCommit.Interval = time.Hour
	c, err := inbox.New(cfg, db, func(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
		if _, err := tx.Exec(ctx, "SELECT pg_sleep(0.02)"); err != nil { // slow enough to be killed mid-stream
			return err
		}
		return ie.charge(ctx, tx, m)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Fatal(c.Run(context.Background())) // runs until killed
}

// A consumer killed (SIGKILL) after its database commits and before its
// offsets were committed: the group redelivers those records, the next
// consumer skips them as duplicates, and every event is applied once.
func TestInboxKilledBetweenCommitAndOffsetCommit(t *testing.T) {
	t.Parallel() // own outbox, relay and topics; no service fault, no shared proxy
	e := newEnv(t, "inboxkill")
	topic := e.Prefix + ".order"
	if err := testkit.CreateTopics(brokers, 1, nil, topic); err != nil {
		t.Fatal(err)
	}
	const events = 80
	produce(t, topic, directRecords("k", events))
	ie := newInboxEnv(t, e.DB, e.Schema)

	cmd := exec.Command(os.Args[0], "-test.run", "^TestInboxHelperProcess$", "-test.v")
	cmd.Env = append(os.Environ(), helperEnv+"="+e.Schema+"|"+topic)
	out := &strings.Builder{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "the first consumer to apply 20 events", func() bool {
		return ie.count("SELECT count(*) FROM "+ie.charges) >= 20
	})
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	// A commit already sent when the process died still lands; the
	// backend's own transaction rolls back. Wait for the backends to go.
	waitFor(t, 30*time.Second, "the killed consumer's sessions to end", func() bool {
		return ie.count("SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%pg_sleep(0.02)%' AND pid <> pg_backend_pid()") == 0
	})
	before := ie.applications()
	if len(before) == 0 || len(before) == events {
		t.Fatalf("the killed consumer applied %d of %d events; the kill must land mid-stream\n%s", len(before), events, out)
	}

	c := startConsumer(t, ie.config(topic), e.DB, ie.charge)
	c.waitConsumed(t, events, 60*time.Second)
	st := c.Stats()
	apps := ie.applications()
	t.Logf("killed consumer applied %d events (offsets uncommitted); after restart: records consumed %d, duplicates skipped %d, side effects applied %d; charge rows %d for %d events",
		len(before), st.Consumed, st.Duplicates, st.Applied, sumValues(apps), len(apps))
	if st.Duplicates != int64(len(before)) || st.Applied != int64(events-len(before)) {
		t.Errorf("restarted consumer: %+v, want %d duplicates skipped and %d applied", st, len(before), events-len(before))
	}
	for i := 1; i <= events; i++ {
		if n := apps[fmt.Sprintf("k-%d", i)]; n != 1 {
			t.Errorf("event k-%d applied %d times", i, n)
		}
	}
}

// A handler error rolls back the side effect and the processed_events row
// together; the record is retried until it succeeds. A record that keeps
// failing, and one without event_id, go to OnGiveUp after MaxAttempts
// (with its id recorded, nothing else applied); without OnGiveUp the
// consumer stops at it, offset not marked.
func TestInboxHandlerErrorRollsBackBoth(t *testing.T) {
	t.Parallel() // own outbox, relay and topics; no service fault, no shared proxy
	e := newEnv(t, "inboxerr")
	topic := e.Prefix + ".order"
	if err := testkit.CreateTopics(brokers, 1, nil, topic); err != nil {
		t.Fatal(err)
	}
	recs := directRecords("h", 10)
	noID := &sarama.ProducerMessage{Key: sarama.StringEncoder("ord_1"), Value: sarama.StringEncoder(`{}`),
		Headers: []sarama.RecordHeader{{Key: []byte("event_type"), Value: []byte("order.created")}}}
	recs = append(recs[:5], append([]*sarama.ProducerMessage{noID}, recs[5:]...)...)
	produce(t, topic, recs)
	ie := newInboxEnv(t, e.DB, e.Schema)
	if _, err := e.DB.Exec(context.Background(), "CREATE TABLE "+e.Schema+".parked (event_id text, error text)"); err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	var problems []string
	seen := map[string]int{}                                      // event -> attempts
	failing := map[string]int{"h-3": 2, "h-7": 2, "h-9": 1 << 30} // event -> attempts that fail
	handler := func(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
		mu.Lock()
		seen[m.EventID]++
		attempt := seen[m.EventID]
		mu.Unlock()
		if attempt > 1 {
			// What the previous, failed attempt left, seen from another
			// connection: nothing.
			var charges, processed int
			if err := e.DB.QueryRow(ctx, "SELECT (SELECT count(*) FROM "+ie.charges+" WHERE event_id = $1), (SELECT count(*) FROM "+ie.processed+" WHERE event_id = $1)",
				m.EventID).Scan(&charges, &processed); err != nil {
				return err
			}
			if charges != 0 || processed != 0 || m.Attempt != attempt {
				mu.Lock()
				problems = append(problems, fmt.Sprintf("%s attempt %d (Message.Attempt %d): %d charges and %d processed rows left by the failed attempt", m.EventID, attempt, m.Attempt, charges, processed))
				mu.Unlock()
			}
		}
		if err := ie.charge(ctx, tx, m); err != nil {
			return err
		}
		if attempt <= failing[m.EventID] {
			return fmt.Errorf("charge %s: card declined (attempt %d)", m.EventID, attempt)
		}
		return nil
	}

	// Without OnGiveUp: the consumer stops at the record without event_id
	// (offset 5), after h-3 healed on its third attempt.
	cfg := ie.config(topic)
	cfg.MaxAttempts = 4
	c := startConsumer(t, cfg, e.DB, handler)
	var err error
	select {
	case err = <-c.done:
	case <-time.After(60 * time.Second):
		t.Fatal("the consumer did not stop at the record without event_id")
	}
	var failed *inbox.FailedError
	if !errors.As(err, &failed) || !errors.Is(err, inbox.ErrNoEventID) || failed.Offset != 5 {
		t.Fatalf("Run: %v, want a *FailedError for offset 5 without event_id", err)
	}
	t.Logf("without OnGiveUp: %v", err)

	// With OnGiveUp: the same group resumes (offsets 0..4 committed at
	// Close), parks the no-id record and h-9, applies the rest once.
	cfg.OnGiveUp = func(ctx context.Context, tx pgx.Tx, m *inbox.Message, cause error) error {
		_, err := tx.Exec(ctx, "INSERT INTO "+e.Schema+".parked VALUES ($1, $2)", m.EventID, cause.Error())
		return err
	}
	c = startConsumer(t, cfg, e.DB, handler)
	c.waitConsumed(t, int64(len(recs)-5), 60*time.Second)
	st := c.Stats()
	apps := ie.applications()
	mu.Lock()
	defer mu.Unlock()
	for _, p := range problems {
		t.Error(p)
	}
	t.Logf("records %d, applied %d, gave up %d, handler errors %d; attempts %v; charges %v", st.Consumed, st.Applied, st.GaveUp, st.HandlerErrors, seen, apps)
	for i := 1; i <= 10; i++ {
		id, want := fmt.Sprintf("h-%d", i), 1
		if id == "h-9" {
			want = 0
		}
		if apps[id] != want {
			t.Errorf("event %s applied %d times, want %d", id, apps[id], want)
		}
	}
	if seen["h-3"] != 3 || seen["h-7"] != 3 || seen["h-9"] != 4 {
		t.Errorf("attempts %v: want h-3 and h-7 3 times, h-9 MaxAttempts (4) times", seen)
	}
	if st.GaveUp != 2 || st.HandlerErrors != 1+2+4 {
		t.Errorf("stats %+v: want 2 given up, 7 handler errors (no id 1, h-7 2, h-9 4)", st)
	}
	var parked []string
	rows, _ := e.DB.Query(context.Background(), "SELECT event_id || ': ' || error FROM "+e.Schema+".parked ORDER BY 1")
	for rows.Next() {
		var s string
		_ = rows.Scan(&s)
		parked = append(parked, s)
	}
	if len(parked) != 2 || !strings.HasPrefix(parked[0], ": record has no event_id") ||
		!slices.ContainsFunc(parked, func(s string) bool { return strings.HasPrefix(s, "h-9: charge h-9: card declined (attempt 4)") }) {
		t.Errorf("parked %q", parked)
	}
	if n := ie.count("SELECT count(*) FROM " + ie.processed + " WHERE event_id = 'h-9'"); n != 1 {
		t.Errorf("h-9 given up: %d processed rows, want 1 (a redelivery must not re-run it)", n)
	}
}

// Cleanup deletes this consumer's ids older than TTL in batches, and
// nothing newer or of another consumer.
func TestInboxCleanupDeletesExpiredIDsInBatches(t *testing.T) {
	ctx := context.Background()
	schema := "e2e_inboxttl_" + fmt.Sprint(time.Now().UnixNano()%1e9)
	db, err := pgxpool.New(ctx, pgURL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	t.Cleanup(func() { db.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") })
	ie := newInboxEnv(t, db, schema)
	if _, err := db.Exec(ctx, `INSERT INTO `+ie.processed+` (consumer, event_id, processed_at)
		SELECT $1, 'old-' || i, now() - interval '15 days' FROM generate_series(1, 25) i
		UNION ALL SELECT $1, 'new-' || i, now() - interval '13 days' FROM generate_series(1, 5) i
		UNION ALL SELECT 'other', 'old-' || i, now() - interval '15 days' FROM generate_series(1, 5) i`, ie.group); err != nil {
		t.Fatal(err)
	}
	cfg := ie.config("unused")
	cfg.CleanupBatch = 10
	c, err := inbox.New(cfg, db, ie.charge)
	if err != nil {
		t.Fatal(err)
	}
	n, err := c.Cleanup(ctx)
	if err != nil || n != 25 || c.Stats().Deleted != 25 {
		t.Fatalf("Cleanup: %d deleted, %v; want 25", n, err)
	}
	if left := ie.count("SELECT count(*) FROM " + ie.processed); left != 10 {
		t.Errorf("%d rows left, want the 5 recent ones and the other consumer's 5", left)
	}
}
