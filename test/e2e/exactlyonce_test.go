//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/test/testkit"
)

// Exactly-once delivery (issue 14): what a read_committed consumer reads.

// eosFlags runs the relay with delivery: exactly_once and a checkpoint
// topic of the test's own (deleted with its topics).
func (e *env) eosFlags(extra ...string) []string {
	return append([]string{"--delivery", "exactly_once", "--exactly-once-checkpoint-topic", e.Prefix + ".checkpoints"}, extra...)
}

// consumeCommitted is consume with isolation.level=read_committed: records
// of aborted or still open Kafka transactions are never returned.
func consumeCommitted(t *testing.T, topics []string, want int, d, quiet time.Duration) []record {
	t.Helper()
	cfg := testkit.SaramaConfig()
	cfg.Consumer.IsolationLevel = sarama.ReadCommitted
	client, err := sarama.NewClient(brokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	ch := make(chan record, 1024)
	var pcs []sarama.PartitionConsumer
	defer func() {
		for _, pc := range pcs {
			pc.AsyncClose()
		}
	}()
	for _, tp := range topics {
		var parts []int32
		waitFor(t, d, "topic "+tp, func() bool {
			_ = client.RefreshMetadata(tp)
			parts, err = client.Partitions(tp)
			return err == nil && len(parts) > 0
		})
		for _, p := range parts {
			var pc sarama.PartitionConsumer
			waitFor(t, d, "partition leader", func() bool {
				pc, err = consumer.ConsumePartition(tp, p, sarama.OffsetOldest)
				return err == nil
			})
			pcs = append(pcs, pc)
			go func() {
				for m := range pc.Messages() {
					h := map[string]string{}
					for _, rh := range m.Headers {
						h[string(rh.Key)] = string(rh.Value)
					}
					ch <- record{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset, Key: string(m.Key), Value: m.Value, Headers: h, Timestamp: m.Timestamp}
				}
			}()
		}
	}
	var out []record
	deadline, last := time.Now().Add(d), time.Now()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case r := <-ch:
			out = append(out, r)
			last = time.Now()
		case <-tick.C:
		}
		if (len(out) >= want && time.Since(last) >= quiet) || time.Now().After(deadline) {
			go func() {
				for range ch {
				}
			}()
			return out
		}
	}
}

// lastCheckpoint returns the newest committed checkpoint record of key.
func lastCheckpoint(t *testing.T, topic, key string) map[string]string {
	t.Helper()
	var cp map[string]string
	for _, r := range consumeCommitted(t, []string{topic}, 1, 20*time.Second, time.Second) {
		if r.Key == key {
			var raw map[string]any
			if err := json.Unmarshal(r.Value, &raw); err != nil {
				t.Fatalf("checkpoint %s: %v", r.Value, err)
			}
			cp = map[string]string{}
			for k, v := range raw {
				cp[k] = fmt.Sprint(v) // numbers (timeline, generation, xid) as text
			}
		}
	}
	if cp == nil {
		t.Fatalf("no checkpoint record with key %s in %s", key, topic)
	}
	return cp
}

// (a) A clean run: every event exactly once and in order per key, read
// with read_committed; Kafka transactions committed and none aborted; the
// checkpoint in its compacted topic names the last commit.
func TestExactlyOnceCleanRun(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "eosclean")
	r := e.startRelay(e.eosFlags()...)
	w := e.newWriter(141)
	start := time.Now()
	if err := w.run(context.Background(), 3000, 20, 60, 0, ""); err != nil {
		t.Fatal(err)
	}
	ws := w.written()
	rs := consumeCommitted(t, e.topics(), len(ws), 60*time.Second, 2*time.Second)
	t.Logf("%d events in %s (write + deliver)", len(ws), time.Since(start).Round(time.Millisecond))
	requireClean(t, check(t, ws, rs, e.partitions(t)), false)
	committed := r.metric("outbox_relay_kafka_transactions_total")
	if committed < 1 {
		t.Fatalf("outbox_relay_kafka_transactions_total = %v, want > 0", committed)
	}
	ss, err := r.Scrape()
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := testkit.SumMetric(ss, "outbox_relay_kafka_transactions_total", map[string]string{"result": "aborted"}); v != 0 {
		t.Errorf("%v Kafka transactions aborted in a clean run", v)
	}
	if v, _ := testkit.SumMetric(ss, "outbox_relay_kafka_transaction_events_sum", nil); v != float64(len(ws)) {
		t.Errorf("outbox_relay_kafka_transaction_events_sum = %v, want %d", v, len(ws))
	}
	if got := r.metric("outbox_relay_events_published_total"); got != float64(len(ws)) {
		t.Errorf("outbox_relay_events_published_total = %v, want %d (the checkpoint records not counted)", got, len(ws))
	}
	waitFor(t, 10*time.Second, "the slot to confirm the last commit", func() bool { return e.slotLSN(t) > w.LastLSN() })
	cp := lastCheckpoint(t, e.Prefix+".checkpoints", "outbox-relay-"+e.Slot)
	if l, err := pglogrepl.ParseLSN(cp["commit_lsn"]); err != nil || l < w.LastLSN() {
		t.Errorf("checkpoint commit_lsn %s, want at least the last commit %s (%v)", cp["commit_lsn"], w.LastLSN(), err)
	}
	if cp["slot"] != e.Slot || cp["system_id"] == "" || cp["end_lsn"] == "" {
		t.Errorf("checkpoint record %v lacks slot, system_id or end_lsn", cp)
	}
	// The history it belongs to and the transaction at it (package history).
	for _, k := range []string{"timeline", "slot_lsn", "slot_xid", "generation", "xid", "commit_time"} {
		if cp[k] == "" || cp[k] == "0" {
			t.Errorf("checkpoint record %v lacks %s", cp, k)
		}
	}
	configs := describeTopic(t, e.Prefix+".checkpoints")
	if configs["cleanup.policy"] != "compact" {
		t.Errorf("checkpoint topic cleanup.policy = %q, want compact", configs["cleanup.policy"])
	}
	if code := r.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
		t.Fatalf("SIGTERM exit code %d, want 0", code)
	}
	t.Logf("%v Kafka transactions for %d events", committed, len(ws))
}

func describeTopic(t *testing.T, topic string) map[string]string {
	t.Helper()
	admin, err := sarama.NewClusterAdmin(brokers, testkit.SaramaConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	entries, err := admin.DescribeConfig(sarama.ConfigResource{Type: sarama.TopicResource, Name: topic})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, en := range entries {
		out[en.Name] = en.Value
	}
	return out
}

// (b) kill -9 mid-load, restart: nothing lost and, unlike at-least-once,
// nothing duplicated.
func TestExactlyOnceKill9NoLossNoDuplicates(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "eoskill9")
	r := e.startRelay(e.eosFlags()...)
	w := e.newWriter(142)
	errc := make(chan error, 1)
	go func() { errc <- w.run(context.Background(), 3000, 10, 40, 6*time.Second, "") }()
	waitFor(t, 30*time.Second, "first transactions committed", func() bool { return r.metric("outbox_relay_events_published_total") > 500 })
	r.stop(syscall.SIGKILL, 10*time.Second)
	killedAt := len(w.written())
	r2 := e.startRelay(e.eosFlags()...)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	ws := w.written()
	if killedAt >= len(ws) {
		t.Fatalf("the writer finished before the kill (%d of %d): the test proves nothing", killedAt, len(ws))
	}
	rs := consumeCommitted(t, e.topics(), len(ws), 60*time.Second, 2*time.Second)
	rep := check(t, ws, rs, e.partitions(t))
	requireClean(t, rep, false)
	// What a read_uncommitted consumer (or at-least-once) would have seen:
	// the records of the Kafka transaction the kill left open, aborted
	// when the new producer fenced the old one.
	uncommitted := check(t, ws, consume(t, e.topics(), len(ws), 30*time.Second, 2*time.Second), e.partitions(t))
	t.Logf("kill -9 after %d of %d events written: %d lost, %d duplicates; %v events skipped by the checkpoint after the restart; a read_uncommitted consumer sees %d duplicates",
		killedAt, len(ws), rep.Lost, rep.Duplicates, r2.metric("outbox_relay_exactly_once_skipped_events_total"), uncommitted.Duplicates)
	r2.stop(syscall.SIGTERM, 30*time.Second)
}

// (c) Poison events (a bad row, an invalid topic, one the broker refuses
// as too large) go to the dead-letter topic exactly once, inside the
// Kafka transaction of their PostgreSQL transaction; every good event is
// delivered once.
func TestExactlyOncePoisonDeadLetteredOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "eospoison")
	dlq := e.Prefix + ".dlq"
	createTopic(t, e.Prefix+".big", map[string]string{"max.message.bytes": "3000"})
	r := e.startRelay(e.eosFlags("--dlq-topic", dlq, "--dlq-max-attempts", "2", "--dlq-retry-backoff", "50ms")...)
	ctx := context.Background()
	poisons := map[int64]string{}
	w := e.newWriter(143)
	steps := []func(){
		func() {
			poisons[e.insertRow(t, "order", "order-1", "order.updated", `{"n": 1}`, `["not", "an", "object"]`)] = "bad_row"
		},
		func() {
			poisons[e.insertRow(t, "bad topic!", "order-1", "order.updated", `{"n": 2}`, `{}`)] = "invalid_topic"
		},
		func() {
			big := `{"blob":"` + strings.Repeat("x", 5000) + `"}`
			poisons[e.insertRow(t, "big", "order-1", "big.updated", big, `{}`)] = "message_too_large"
		},
	}
	for _, step := range append(steps, func() {}) {
		if err := w.run(ctx, 100, 5, 10, 0, ""); err != nil {
			t.Fatal(err)
		}
		step()
	}
	ws := w.written()
	rs := consumeCommitted(t, e.topics(), len(ws), 60*time.Second, 2*time.Second)
	requireClean(t, check(t, ws, rs, e.partitions(t)), false)
	letters := consumeCommitted(t, []string{dlq}, len(poisons), 30*time.Second, 2*time.Second)
	seen := map[int64]int{}
	for _, l := range letters {
		id, _ := strconv.ParseInt(l.Headers["dlq.event_id"], 10, 64)
		seen[id]++
		if want, ok := poisons[id]; !ok || l.Headers["dlq.reason"] != want {
			t.Errorf("dead letter of event %d has reason %q, want %q", id, l.Headers["dlq.reason"], want)
		}
	}
	for id := range poisons {
		if seen[id] != 1 {
			t.Errorf("event %d (%s) dead-lettered %d times, want exactly once", id, poisons[id], seen[id])
		}
	}
	if len(letters) != len(poisons) {
		t.Errorf("%d dead letters, want %d", len(letters), len(poisons))
	}
	waitFor(t, 20*time.Second, "the slot to pass every event", func() bool { return e.slotLSN(t) > w.LastLSN() })
	var marked int
	if err := e.DB.QueryRow(ctx, "SELECT count(*) FROM "+e.Table+" WHERE dead_lettered_at IS NOT NULL").Scan(&marked); err != nil {
		t.Fatal(err)
	}
	if marked != len(poisons) {
		t.Errorf("%d rows marked dead-lettered, want %d", marked, len(poisons))
	}
	t.Logf("%d dead letters, %v Kafka transactions aborted (the broker's refusals)", len(letters), abortedTxns(t, r))
	r.stop(syscall.SIGTERM, 30*time.Second)
}

func abortedTxns(t *testing.T, r *relay) float64 {
	ss, err := r.Scrape()
	if err != nil {
		t.Fatal(err)
	}
	v, _ := testkit.SumMetric(ss, "outbox_relay_kafka_transactions_total", map[string]string{"result": "aborted"})
	return v
}

// (d) The checkpoint skip: a relay restarts from a slot position before
// transactions it already committed to Kafka (the slot was not confirmed
// past them: here the slot is put back to where it was before the load,
// from a copy made then). It reads them again and publishes none of them
// twice.
func TestExactlyOnceCheckpointSkipsCommitted(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "eosskip")
	ctx := context.Background()
	saved := e.Slot + "_b"
	if _, err := e.DB.Exec(ctx, "SELECT pg_copy_logical_replication_slot($1, $2)", e.Slot, saved); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := testkit.DropSlot(context.Background(), e.DB, saved); err != nil {
			t.Logf("drop slot %s: %v", saved, err)
		}
	})
	r := e.startRelay(e.eosFlags()...)
	w := e.newWriter(144)
	if err := w.run(ctx, 400, 10, 30, 0, ""); err != nil {
		t.Fatal(err)
	}
	first := len(w.written())
	consumeCommitted(t, e.topics(), first, 30*time.Second, time.Second)
	r.stop(syscall.SIGKILL, 10*time.Second)
	// The slot back before the load, under its own name: everything
	// committed is read again.
	if err := testkit.DropSlot(ctx, e.DB, e.Slot); err != nil {
		t.Fatal(err)
	}
	if _, err := e.DB.Exec(ctx, "SELECT pg_copy_logical_replication_slot($1, $2)", saved, e.Slot); err != nil {
		t.Fatal(err)
	}
	r2 := e.startRelay(e.eosFlags()...)
	if err := w.run(ctx, 200, 10, 30, 0, ""); err != nil {
		t.Fatal(err)
	}
	ws := w.written()
	rs := consumeCommitted(t, e.topics(), len(ws), 30*time.Second, 2*time.Second)
	requireClean(t, check(t, ws, rs, e.partitions(t)), false)
	skipped := r2.metric("outbox_relay_exactly_once_skipped_events_total")
	if skipped != float64(first) {
		t.Errorf("outbox_relay_exactly_once_skipped_events_total = %v, want %d (every event committed before the restart)", skipped, first)
	}
	t.Logf("%v events re-read and skipped, %d published after the restart, 0 duplicates", skipped, len(ws)-first)
	r2.stop(syscall.SIGTERM, 30*time.Second)
}

// A transactional id two slots share (issue 35, case 3): the second relay
// would read the first one's checkpoint and skip its own transactions at
// or below it, never published. It refuses to start instead, naming the
// key, and publishes nothing.
func TestExactlyOnceSharedTransactionalIDRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "eosshared")
	ctx := context.Background()
	other := e.Slot + "_o"
	if _, err := e.DB.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", other); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := testkit.DropSlot(context.Background(), e.DB, other); err != nil {
			t.Logf("drop slot %s: %v", other, err)
		}
	})
	before := slotConfirmed(t, e, other)
	r := e.startRelay(e.eosFlags()...)
	w := e.newWriter(145)
	if err := w.run(ctx, 50, 5, 10, 0, ""); err != nil {
		t.Fatal(err)
	}
	consumeCommitted(t, e.topics(), len(w.written()), 30*time.Second, time.Second)
	if code := r.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
		t.Fatalf("first relay exit %d", code)
	}
	// The other slot has every event of the load ahead of it.
	code, out := e.runRelayToExit(90*time.Second, e.eosFlags("--slot", other, "--exactly-once-transactional-id", "outbox-relay-"+e.Slot)...)
	if code == 0 || !strings.Contains(out, "exactly_once.transactional_id outbox-relay-"+e.Slot+" is used by another slot") {
		t.Fatalf("relay on slot %s with slot %s's transactional id: exit %d, want a refusal naming exactly_once.transactional_id:\n%s", other, e.Slot, code, testkit.Tail(out, 3000))
	}
	if after := slotConfirmed(t, e, other); after != before {
		t.Fatalf("slot %s confirmed %s after the refused start, was %s: it skipped events it never published", other, after, before)
	}
	t.Logf("refused; slot %s stays at %s", other, before)
}

// slotConfirmed is the confirmed_flush_lsn of slot.
func slotConfirmed(t *testing.T, e *env, slot string) string {
	t.Helper()
	var lsn string
	if err := e.DB.QueryRow(context.Background(), "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	return lsn
}

// A broker stall longer than the transaction timeout, mid-load. When the
// coordinator aborts the open Kafka transaction first (it scans for timed
// out transactions every transaction.abort.timed.out.transaction.cleanup.interval.ms,
// 10 s by default, so it races the relay's commit after the stall), the
// relay's commit fails: it aborts, builds a new producer, reads the
// checkpoint and rewinds. Either way everything arrives exactly once. Not
// parallel: it stalls the shared broker.
func TestExactlyOnceBrokerStallLongerThanTransactionTimeout(t *testing.T) {
	e := newEnv(t, "eosstall")
	r := e.startRelay(e.eosFlags("--exactly-once-transaction-timeout", "2s")...)
	w := e.newWriter(145)
	errc := make(chan error, 1)
	go func() { errc <- w.run(context.Background(), 2000, 10, 40, 8*time.Second, "") }()
	waitFor(t, 30*time.Second, "first transactions committed", func() bool { return r.metric("outbox_relay_events_published_total") > 200 })
	svc(t, "kafka-pause")
	paused := time.Now()
	resumed := false
	defer func() {
		if !resumed {
			svc(t, "kafka-resume")
		}
	}()
	// The fault's length, not a synchronisation: well past the 2 s timeout.
	waitFor(t, 30*time.Second, "the stall to outlast the transaction timeout", func() bool { return time.Since(paused) > 5*time.Second })
	svc(t, "kafka-resume")
	resumed = true
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	ws := w.written()
	rs := consumeCommitted(t, e.topics(), len(ws), 90*time.Second, 3*time.Second)
	rep := check(t, ws, rs, e.partitions(t))
	requireClean(t, rep, false)
	t.Logf("broker stalled %s with a 2s transaction timeout: %d events, 0 lost, 0 duplicates; %v Kafka transactions aborted",
		5*time.Second, len(ws), abortedTxns(t, r))
	r.stop(syscall.SIGTERM, 30*time.Second)
}

// A PostgreSQL transaction larger than exactly_once.max_batch_events (and
// handed over by the decoder in chunks) is one Kafka transaction of its
// own, never split; one larger than the in-flight limits stops the relay
// with an error naming its LSN and the keys to raise, nothing of it
// visible.
func TestExactlyOnceLargeTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Run("larger than a batch: one Kafka transaction", func(t *testing.T) {
		e := newEnv(t, "eosbig")
		r := e.startRelay(e.eosFlags("--exactly-once-max-batch-events", "100")...)
		w := e.newWriter(146)
		if err := w.bigTxn(ctx, 2500, 20); err != nil { // first: it numbers its aggregates' events from 1
			t.Fatal(err)
		}
		if err := w.run(ctx, 200, 10, 20, 0, ""); err != nil {
			t.Fatal(err)
		}
		ws := w.written()
		rs := consumeCommitted(t, e.topics(), len(ws), 60*time.Second, 2*time.Second)
		requireClean(t, check(t, ws, rs, e.partitions(t)), false)
		ss, err := r.Scrape()
		if err != nil {
			t.Fatal(err)
		}
		small, _ := testkit.SumMetric(ss, "outbox_relay_kafka_transaction_events_bucket", map[string]string{"le": "1024"})
		all, _ := testkit.SumMetric(ss, "outbox_relay_kafka_transaction_events_count", nil)
		if all-small != 1 {
			t.Errorf("%v Kafka transactions of more than 1024 events, want exactly 1 (the 2500-event PostgreSQL transaction, whole)", all-small)
		}
		r.stop(syscall.SIGTERM, 30*time.Second)
	})
	t.Run("larger than the in-flight limits: stops, names the keys", func(t *testing.T) {
		e := newEnv(t, "eoshuge")
		w := e.newWriter(147)
		if err := w.bigTxn(ctx, 2500, 20); err != nil {
			t.Fatal(err)
		}
		code, out := e.runRelayToExit(60*time.Second, e.eosFlags("--max-inflight-events", "1000", "--exactly-once-max-batch-events", "500")...)
		if code == 0 || !strings.Contains(out, "inflight.max_events") || !strings.Contains(out, "committed at LSN") {
			t.Fatalf("exit %d, want an error naming the transaction's LSN and inflight.max_events:\n%s", code, testkit.Tail(out, 2000))
		}
		i := strings.Index(out, "committed at LSN ")
		commit, err := pglogrepl.ParseLSN(strings.Fields(out[i+len("committed at LSN "):])[0])
		if err != nil {
			t.Fatal(err)
		}
		if slot := e.slotLSN(t); slot > commit {
			t.Fatalf("the slot confirmed %s, past the refused transaction committed at %s", slot, commit)
		}
		// Records of its first chunks may have reached the broker (creating
		// the topic) inside the aborted Kafka transaction: none is visible.
		if tps, err := testkit.Topics(brokers, e.Prefix+".order"); err != nil {
			t.Fatal(err)
		} else if len(tps) > 0 {
			if rs := consumeCommitted(t, tps, 1, 3*time.Second, time.Second); len(rs) != 0 {
				t.Fatalf("%d records of the refused transaction visible", len(rs))
			}
		}
		t.Logf("the relay stopped: %s", testkit.Tail(out[max(0, i-300):], 700))
	})
}
