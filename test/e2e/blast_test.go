//go:build e2e

package e2e

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	mrand "math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/test/testkit"
)

// The acceptance tests of issue 36: one bad event must cost the events
// around it nothing, neither their delivery nor more than a few copies.

// insertInTx inserts one outbox row in tx (a transaction of the writer's,
// WriteAround) and returns its id and the WAL insert position read inside
// the transaction: a lower bound of its commit LSN.
func insertInTx(ctx context.Context, tx pgx.Tx, e *env, aggType, aggID, eventType, payload string) (int64, pglogrepl.LSN, error) {
	var id int64
	var at string
	err := tx.QueryRow(ctx, "INSERT INTO "+e.Table+" (aggregate_type, aggregate_id, event_type, payload, headers) VALUES ($1, $2, $3, $4, '{}') "+
		"RETURNING id, pg_current_wal_insert_lsn()::text", aggType, aggID, eventType, payload).Scan(&id, &at)
	if err != nil {
		return 0, 0, err
	}
	l, err := pglogrepl.ParseLSN(at)
	return id, l, err
}

// deadLettered returns the ids of the env's rows marked dead_lettered_at.
func (e *env) deadLettered(t *testing.T) []int64 {
	t.Helper()
	rows, err := e.DB.Query(context.Background(), "SELECT id FROM "+e.Table+" WHERE dead_lettered_at IS NOT NULL ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	return testkit.Must(t, ids, err)
}

// logPublishErrors logs the relay's publish errors by reason, and its
// rewinds; it returns the errors of reasons other than the given ones.
func logPublishErrors(t *testing.T, r *relay, except ...string) (rewinds, others float64) {
	t.Helper()
	m := scrape(t, r)
	var by []string
	for _, s := range m.series("outbox_relay_publish_errors_total") {
		if s.Value != 0 {
			by = append(by, fmt.Sprintf("%s=%v", s.Labels["reason"], s.Value))
		}
		if !slices.Contains(except, s.Labels["reason"]) {
			others += s.Value
		}
	}
	rewinds = m.sum("outbox_relay_rewinds_total")
	t.Logf("outbox_relay_rewinds_total=%v, outbox_relay_publish_errors_total by reason: %v", rewinds, by)
	return rewinds, others
}

// One event of 3 MB among 10,000 written while the relay runs: it is
// dead-lettered (message_too_large, at the first answer, the row marked),
// the 9,999 others all arrive in order with at most 100 duplicates in all,
// and the slot moves past the last commit.
func TestOversizedEventAmongTenThousand(t *testing.T) {
	t.Parallel() // own outbox, relay and topics; no service fault, no shared proxy
	const (
		total = 10000
		txn   = 100 // rows per transaction
		aggs  = 60
	)
	e := newEnv(t, "oversized")
	dlq := e.Prefix + ".dlq"
	// Made beforehand, so the first records of a topic the relay creates
	// cost no transient LEADER_NOT_AVAILABLE: any rewind below is the
	// oversized event's.
	if err := testkit.CreateTopics(brokers, 4, nil, append(e.topics(), dlq)...); err != nil {
		t.Fatal(err)
	}
	r := e.startRelay("--on-poison", "dlq", "--dlq-topic", dlq)
	ctx := context.Background()
	w := e.newWriter(36)
	big := `{"blob":"` + strings.Repeat("x", 3<<20) + `"}`
	var bigID int64
	start := time.Now()
	for done := 0; done < total; done += txn {
		if done != total/2 {
			if err := w.Write(ctx, txn, aggs, ""); err != nil {
				t.Fatal(err)
			}
			continue
		}
		// Row 5,000 or so, in the middle of a transaction of the writer's,
		// while the relay still publishes the ones before.
		t.Logf("%v events published when the 3 MB row is written", r.metric("outbox_relay_events_published_total"))
		err := w.WriteAround(ctx, txn-1, aggs, func(ctx context.Context, tx pgx.Tx) error {
			var err error
			bigID, _, err = insertInTx(ctx, tx, e, "order", "order-big", "order.updated", big)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	end := e.currentLSN(t)
	ws := w.written()
	if len(ws) != total-1 {
		t.Fatalf("%d good events written, want %d", len(ws), total-1)
	}
	t.Logf("%d events and the 3 MB one written in %s", len(ws), time.Since(start).Round(time.Millisecond))

	rs := consume(t, e.topics(), len(ws), 3*time.Minute, 3*time.Second)
	rep := check(t, ws, rs, e.partitions(t))
	t.Logf("duplicates=%d (records %d, distinct %d) in %s", rep.Duplicates, rep.Records, rep.Delivered, time.Since(start).Round(time.Millisecond))
	requireClean(t, rep, true) // 0 lost, order and partition per aggregate, headers
	if rep.Duplicates > 100 {
		t.Errorf("%d duplicates, want at most 100 in all for one oversized event", rep.Duplicates)
	}

	if err := e.WaitConfirmed(ctx, end, 60*time.Second); err != nil {
		t.Fatalf("slot not past the last commit: %v", err)
	}
	letters := consume(t, []string{dlq}, 1, 60*time.Second, 2*time.Second)
	if len(letters) != 1 {
		t.Fatalf("%d dead letters, want 1 (the 3 MB event)", len(letters))
	}
	h := letters[0].Headers
	if h["dlq.event_id"] != strconv.FormatInt(bigID, 10) || h["dlq.reason"] != "message_too_large" || h["dlq.attempts"] != "1" ||
		h["dlq.original_topic"] != e.Prefix+".order" || h["dlq.payload_omitted"] != "true" || letters[0].Key != "order-big" {
		t.Errorf("dead letter: key %q, headers %v; want row %d, reason message_too_large at attempt 1, topic %s.order, payload omitted",
			letters[0].Key, h, bigID, e.Prefix)
	}
	if got := e.deadLettered(t); !slices.Equal(got, []int64{bigID}) {
		t.Errorf("rows marked dead-lettered: %v, want only the 3 MB row %d", got, bigID)
	}
	// The producer refuses the record before any batch (larger than
	// kafka.max_message_bytes): nothing needs publishing again.
	rewinds, others := logPublishErrors(t, r, "message_too_large")
	if rewinds != 0 && others == 0 {
		t.Errorf("%v rewinds without a transient publish error: the oversized event's refusal is certain at once", rewinds)
	}
}

// missingTopicTimeout is kafka.missing_topic_timeout in the missing-topic
// tests.
const missingTopicTimeout = 10 * time.Second

// arrivals times the first arrival of each record of a topic, by outbox_id,
// from a consumer started before the writes (the topic exists: its first
// records are not held up by the consumer's own metadata retries).
type arrivals struct {
	mu   sync.Mutex
	at   map[string]time.Time
	last time.Time // of the latest first arrival
}

func watchArrivals(t *testing.T, topic string) *arrivals {
	t.Helper()
	a := &arrivals{at: map[string]time.Time{}}
	c, err := testkit.Consume(brokers, []string{topic}, 30*time.Second, func(m *sarama.ConsumerMessage) {
		now := time.Now()
		a.mu.Lock()
		defer a.mu.Unlock()
		for _, h := range m.Headers {
			if string(h.Key) == "outbox_id" {
				if _, ok := a.at[string(h.Value)]; !ok {
					a.at[string(h.Value)], a.last = now, now
				}
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return a
}

// distinct is how many events arrived and when the latest of them did.
func (a *arrivals) distinct() (int, time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.at), a.last
}

// topicExists reports whether topic is on the broker, asking without
// naming it (a metadata request for the topic could create it).
func topicExists(t *testing.T, topic string) bool {
	t.Helper()
	tps, err := testkit.Topics(brokers, topic)
	return slices.Contains(testkit.Must(t, tps, err), topic)
}

// One event for a topic that does not exist, with topic creation off, does
// not hold up the 1,000 events after it for an existing topic: they arrive
// within seconds, before kafka.missing_topic_timeout passes; then the event
// is dead-lettered (unknown_topic, naming the topic), the slot moves past
// it, and the topic is never created.
func TestMissingTopicIsolated(t *testing.T) {
	t.Parallel() // own outbox, relay and topics; no service fault, no shared proxy
	const good = 1000
	e := newEnv(t, "missingtopic")
	present, missing, dlq := e.Prefix+".order", e.Prefix+".ordr", e.Prefix+".dlq"
	// The broker auto-creates topics (test/services.sh): only the relay's
	// kafka.auto_create_topics=false keeps its metadata requests from
	// creating the missing one. The test never names it in a request.
	if err := testkit.CreateTopics(brokers, 4, nil, present, dlq); err != nil {
		t.Fatal(err)
	}
	r := e.startRelay("--kafka-auto-create-topics=false", "--on-poison", "dlq", "--dlq-topic", dlq,
		"--kafka-missing-topic-timeout", missingTopicTimeout.String())
	arrived := watchArrivals(t, present)
	ctx := context.Background()
	w := &writer{testkit.NewWriter(e.DB, e.Table, mrand.New(mrand.NewPCG(37, 99)), func(int) string { return "order" })}

	// The relay's first event is the missing topic's: the existing topic is
	// new to it too, and must not wait behind the missing one's lookups.
	t0 := time.Now()
	badID := e.insertRow(t, "ordr", "ordr-1", "ordr.created", `{"n": 1}`, `{}`)
	t1 := time.Now()
	for range good / 100 {
		if err := w.Write(ctx, 100, 20, ""); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d events for %s written in %s after the one for %s", good, present, time.Since(t1).Round(time.Millisecond), missing)
	var n int
	var last time.Time
	waitFor(t, 2*missingTopicTimeout, fmt.Sprintf("the %d events of %s", good, present), func() bool {
		n, last = arrived.distinct()
		return n == good
	})
	t.Logf("all %d events of %s arrived %s after their first insert, %s after the missing topic's event (timeout %s)",
		good, present, last.Sub(t1).Round(time.Millisecond), last.Sub(t0).Round(time.Millisecond), missingTopicTimeout)
	if last.Sub(t1) > missingTopicTimeout {
		t.Errorf("the %d events took %s to arrive, want them within %s of their insertion", good, last.Sub(t1).Round(time.Millisecond), missingTopicTimeout)
	}
	if !last.Before(t0.Add(missingTopicTimeout)) {
		t.Errorf("the %d events arrived %s after the missing topic's event: not before its timeout %s passed", good, last.Sub(t0).Round(time.Millisecond), missingTopicTimeout)
	}
	if topicExists(t, missing) {
		t.Fatalf("topic %s was created with kafka.auto_create_topics off", missing)
	}

	// After the timeout: the dead letter, and the slot past the event.
	letters := consume(t, []string{dlq}, 1, 3*missingTopicTimeout, 2*time.Second)
	if len(letters) != 1 {
		t.Fatalf("%d dead letters within %s, want 1 (the event for %s)", len(letters), 3*missingTopicTimeout, missing)
	}
	h := letters[0].Headers
	if h["dlq.event_id"] != strconv.FormatInt(badID, 10) || h["dlq.reason"] != "unknown_topic" ||
		h["dlq.original_topic"] != missing || !strings.Contains(h["dlq.error"], missing) || string(letters[0].Value) != `{"n": 1}` {
		t.Errorf("dead letter: value %s, headers %v; want row %d, reason unknown_topic, topic %s named in dlq.error, its payload", letters[0].Value, h, badID, missing)
	}
	if at, err := time.Parse(time.RFC3339Nano, h["dlq.failed_at"]); err != nil || at.Before(t0.Add(missingTopicTimeout)) {
		t.Errorf("dlq.failed_at %q (%v): dead-lettered %s after its insert, before the timeout %s", h["dlq.failed_at"], err, at.Sub(t0), missingTopicTimeout)
	} else {
		t.Logf("dead-lettered %s after its insert", at.Sub(t0).Round(time.Millisecond))
	}
	if err := e.WaitConfirmed(ctx, e.currentLSN(t), 30*time.Second); err != nil {
		t.Fatalf("slot not past the missing topic's event: %v", err)
	}
	if got := e.deadLettered(t); !slices.Equal(got, []int64{badID}) {
		t.Errorf("rows marked dead-lettered: %v, want only %d", got, badID)
	}

	rs := consume(t, []string{present}, good, 30*time.Second, 2*time.Second)
	rep := check(t, w.written(), rs, map[string]int{present: partitionCount(t, present)})
	t.Logf("duplicates=%d", rep.Duplicates)
	requireClean(t, rep, true)
	if topicExists(t, missing) {
		t.Errorf("topic %s was created with kafka.auto_create_topics off", missing)
	}
	logPublishErrors(t, r)
}

// With on_poison: halt, an event for a missing topic halts the relay once
// kafka.missing_topic_timeout passes, naming the topic; the slot stays before
// it, and the events of an existing topic before it were delivered.
func TestMissingTopicHalts(t *testing.T) {
	t.Parallel() // own outbox, relay and topics; no service fault, no shared proxy
	const timeout = 5 * time.Second
	e := newEnv(t, "missinghalt")
	present, missing := e.Prefix+".order", e.Prefix+".ordr"
	if err := testkit.CreateTopics(brokers, 4, nil, present); err != nil {
		t.Fatal(err)
	}
	r := e.startRelay("--kafka-auto-create-topics=false", "--on-poison", "halt", "--kafka-missing-topic-timeout", timeout.String())
	ctx := context.Background()
	w := &writer{testkit.NewWriter(e.DB, e.Table, mrand.New(mrand.NewPCG(38, 99)), func(int) string { return "order" })}
	if err := w.run(ctx, 50, 10, 10, 0, ""); err != nil {
		t.Fatal(err)
	}
	before := w.written()
	rs := consume(t, []string{present}, len(before), 60*time.Second, time.Second)
	requireClean(t, check(t, before, rs, map[string]int{present: partitionCount(t, present)}), true)

	var badID int64
	var badLSN pglogrepl.LSN
	if err := pgx.BeginFunc(ctx, e.DB, func(tx pgx.Tx) error {
		var err error
		badID, badLSN, err = insertInTx(ctx, tx, e, "ordr", "ordr-1", "ordr.created", `{"n": 1}`)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if err := w.run(ctx, 50, 10, 10, 0, ""); err != nil {
		t.Fatal(err)
	}
	waitFor(t, timeout+30*time.Second, "outbox_relay_halted = 1", func() bool { return r.metric("outbox_relay_halted") == 1 })
	t.Logf("halted %s after the missing topic's event", time.Since(t0).Round(time.Millisecond))
	if time.Since(t0) < timeout {
		t.Errorf("halted %s after the event, before kafka.missing_topic_timeout %s", time.Since(t0), timeout)
	}
	if code, body := r.get("/readyz"); code != 503 || !strings.Contains(body, "halted") || !strings.Contains(body, missing) {
		t.Errorf("/readyz = %d %q, want 503, halted, naming topic %s", code, body, missing)
	}
	log := r.log()
	for _, want := range []string{"HALTED", missing, fmt.Sprintf(`"id":%d`, badID)} {
		if !strings.Contains(log, want) {
			t.Errorf("the log does not name %q:\n%s", want, tail([]byte(log), 3000))
		}
	}
	at := r.haltedLSN()
	if at < badLSN {
		t.Errorf("halted at commit LSN %s, before the missing topic's event at %s", at, badLSN)
	}
	if c := e.slotLSN(t); c > at {
		t.Fatalf("slot confirmed %s past the commit LSN %s of the missing topic's event", c, at)
	}
	if code := r.stop(syscall.SIGTERM, 15*time.Second); code != 0 {
		t.Errorf("exit code %d after SIGTERM while halted, want 0", code)
	}
	if c := e.slotLSN(t); c > at {
		t.Fatalf("slot confirmed %s past the commit LSN %s of the missing topic's event at shutdown", c, at)
	}
	if topicExists(t, missing) {
		t.Errorf("topic %s was created with kafka.auto_create_topics off", missing)
	}
}

// A record batch the broker refuses as a whole for one record in it
// dead-letters that record only: every good record batched with it
// arrives, none is dead-lettered, nothing is rewound.
//
// The relay keeps its batches for a topic within the topic's
// max.message.bytes as it last read it (every few minutes) and sends a
// record larger than that alone, so the broker refuses a batch of several
// only when the limit is lowered after the relay read it (or the relay may
// not read topic configs). With compression the relay cannot tell the size
// on the wire either: gzip lets full batches of the small, alike good
// records through (300 KB at most, kafka.max_message_bytes) while the bad
// record (random base64, gzip leaves about 3/4 of it) is over the limit.
func TestRefusedBatchDeadLettersOnlyTheBadRecord(t *testing.T) {
	t.Parallel() // own outbox, relay and topics; no service fault, no shared proxy
	const (
		topicMax = 150000 // the order topic's max.message.bytes once lowered
		relayMax = 300000 // kafka.max_message_bytes: the producer's batches stay within it (uncompressed)
		txn      = 1000
	)
	e := newEnv(t, "refusedbatch")
	order, dlq := e.Prefix+".order", e.Prefix+".dlq"
	// One partition: every order event shares its batches with the others.
	// The broker's default limit (1 MB) for now.
	createTopic(t, order, nil)
	if err := testkit.CreateTopics(brokers, 4, nil, e.Prefix+".payment", dlq); err != nil {
		t.Fatal(err)
	}
	r := e.startRelay("--on-poison", "dlq", "--dlq-topic", dlq, "--kafka-compression", "gzip",
		"--kafka-max-message-bytes", strconv.Itoa(relayMax))
	ctx := context.Background()
	w := e.newWriter(39)
	// The relay reads the topic's limit with its first event for it.
	if err := w.Write(ctx, 100, 30, ""); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "the first 100 events published", func() bool { return r.metric("outbox_relay_events_published_total") >= 100 })
	// The operator lowers it.
	alterTopic(t, order, map[string]string{"max.message.bytes": strconv.Itoa(topicMax)})
	waitFor(t, 30*time.Second, "the broker to apply max.message.bytes", func() bool {
		return describeTopic(t, order)["max.message.bytes"] == strconv.Itoa(topicMax)
	})

	raw := make([]byte, 200000)
	rand.Read(raw)
	bad := `{"blob":"` + base64.StdEncoding.EncodeToString(raw) + `"}`
	var badID int64
	for i := range 5 {
		if i != 2 {
			if err := w.Write(ctx, txn, 30, ""); err != nil {
				t.Fatal(err)
			}
			continue
		}
		// In the middle of a transaction: published among the good records
		// before and after it, which queue behind one request in flight.
		err := w.WriteAround(ctx, txn, 30, func(ctx context.Context, tx pgx.Tx) error {
			var err error
			badID, _, err = insertInTx(ctx, tx, e, "order", "order-bad", "order.updated", bad)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	end := e.currentLSN(t)
	ws := w.written()
	if err := e.WaitConfirmed(ctx, end, 2*time.Minute); err != nil {
		t.Fatalf("slot not past the last commit: %v", err)
	}

	// The broker refused a batch of several records, then the bad one
	// alone: at least two refusals counted (one per refused batch whose
	// records go again, one per record completed with the refusal).
	refused := scrape(t, r).sumWhere("outbox_relay_publish_errors_total", map[string]string{"reason": "message_too_large"})
	rewinds, others := logPublishErrors(t, r, "message_too_large")
	if refused < 2 {
		t.Errorf("%v message_too_large refusals: the broker never refused a batch of several records, the test did not test it", refused)
	}
	if rewinds != 0 && others == 0 {
		t.Errorf("%v rewinds without a transient publish error: a refused batch goes again one record per batch, nothing is rewound", rewinds)
	}

	letters := consume(t, []string{dlq}, 1, 60*time.Second, 3*time.Second)
	var ids []string
	for _, l := range letters {
		ids = append(ids, l.Headers["dlq.event_id"]+":"+l.Headers["dlq.reason"]+":"+l.Headers["dlq.attempts"])
	}
	if len(letters) != 1 || letters[0].Headers["dlq.event_id"] != strconv.FormatInt(badID, 10) ||
		letters[0].Headers["dlq.reason"] != "message_too_large" || letters[0].Headers["dlq.attempts"] != "1" {
		t.Errorf("%d dead letters (row:reason:attempts) %v, want only the bad row %d, message_too_large at attempt 1", len(letters), ids[:min(len(ids), 20)], badID)
	}
	if got := e.deadLettered(t); !slices.Equal(got, []int64{badID}) {
		t.Errorf("%d rows marked dead-lettered (first %v), want only the bad row %d", len(got), got[:min(len(got), 20)], badID)
	}
	rs := consume(t, e.topics(), len(ws), 90*time.Second, 3*time.Second)
	rep := check(t, ws, rs, e.partitions(t))
	t.Logf("duplicates=%d (records %d, distinct %d of %d)", rep.Duplicates, rep.Records, rep.Delivered, len(ws))
	requireClean(t, rep, true)
	if rep.Duplicates > 100 {
		t.Errorf("%d duplicates, want at most 100 for one bad record", rep.Duplicates)
	}
}

// alterTopic sets configs of topic (the others keep their values).
func alterTopic(t *testing.T, topic string, configs map[string]string) {
	t.Helper()
	admin, err := sarama.NewClusterAdmin(brokers, testkit.SaramaConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	entries := map[string]sarama.IncrementalAlterConfigsEntry{}
	for k, v := range configs {
		entries[k] = sarama.IncrementalAlterConfigsEntry{Operation: sarama.IncrementalAlterConfigsOperationSet, Value: &v}
	}
	if err := admin.IncrementalAlterConfig(sarama.TopicResource, topic, entries, false); err != nil {
		t.Fatalf("alter topic %s: %v", topic, err)
	}
}
