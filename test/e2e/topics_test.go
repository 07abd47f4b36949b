//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/test/testkit"
)

// A writer that puts a new aggregate_type in every row cannot make the
// relay create topics, goroutines, memory or metric series without bound:
// with kafka.max_topics 20 the first 20 topics get their events, the other
// 4,980 events are dead-lettered with reason topic_limit, the slot moves
// past all of them, and the relay stays within bounds, even with topic
// auto-creation on.
func TestTopicLimitBoundsWhatWritersCreate(t *testing.T) {
	t.Parallel() // own outbox, relay and topics; no service fault, no shared proxy
	const (
		types    = 5000
		maxTopic = 20
		again    = 10 // more events per admitted topic after the flood
	)
	e := newEnv(t, "topiclimit")
	dlq := e.Prefix + ".dlq"
	r := e.startRelay("--kafka-max-topics", fmt.Sprint(maxTopic), "--dlq-topic", dlq, "--on-poison", "dlq")
	base := scrape(t, r)
	baseG, baseRSS := base.sum("go_goroutines"), base.sum("process_resident_memory_bytes")
	t.Logf("ready: %v goroutines, RSS %.0f MiB", baseG, baseRSS/(1<<20))

	ctx := context.Background()
	topic := func(i int) string { return fmt.Sprintf("%s.t%04d", e.Prefix, i) }
	// 5,000 rows in 50 transactions, aggregate types t0000..t4999 in
	// commit order, so the first 20 the relay sees are t0000..t0019.
	for i := 0; i < types; i += 100 {
		if _, err := e.DB.Exec(ctx, "INSERT INTO "+e.Table+" (aggregate_type, aggregate_id, event_type, payload) "+
			"SELECT 't' || lpad(g::text, 4, '0'), 'a' || g, 'flood', '{}' FROM generate_series($1::int, $2::int) g ORDER BY g",
			i, i+99); err != nil {
			t.Fatal(err)
		}
	}
	// Then the admitted topics keep working.
	if _, err := e.DB.Exec(ctx, "INSERT INTO "+e.Table+" (aggregate_type, aggregate_id, event_type, payload) "+
		"SELECT 't' || lpad((g % $1)::text, 4, '0'), 'b' || g, 'after', '{}' FROM generate_series(0, $2::int - 1) g ORDER BY g",
		maxTopic, maxTopic*again); err != nil {
		t.Fatal(err)
	}
	end := e.currentLSN(t)
	if err := e.WaitConfirmed(ctx, end, 3*time.Minute); err != nil {
		t.Fatalf("slot not confirmed past every event: %v", err)
	}

	admitted := make([]string, maxTopic)
	for i := range admitted {
		admitted[i] = topic(i)
	}
	rs := consume(t, admitted, maxTopic*(1+again), 60*time.Second, 2*time.Second)
	if len(rs) != maxTopic*(1+again) {
		t.Errorf("%d events in the %d admitted topics, want %d", len(rs), maxTopic, maxTopic*(1+again))
	}
	letters := consume(t, []string{dlq}, types-maxTopic, 90*time.Second, 2*time.Second)
	refused := map[string]bool{}
	for _, l := range letters {
		h := l.Headers
		if h["dlq.reason"] != "topic_limit" || !strings.Contains(h["dlq.error"], "kafka.max_topics") || slices.Contains(admitted, h["dlq.original_topic"]) {
			t.Fatalf("dead letter: reason %q, original topic %q, error %q", h["dlq.reason"], h["dlq.original_topic"], h["dlq.error"])
		}
		refused[h["dlq.original_topic"]] = true
	}
	if len(letters) != types-maxTopic || len(refused) != types-maxTopic {
		t.Errorf("%d dead letters for %d topics, want %d", len(letters), len(refused), types-maxTopic)
	}

	// The broker holds the admitted topics and the dead-letter topic, none other.
	onBroker, err := testkit.Topics(brokers, e.Prefix+".")
	if err != nil {
		t.Fatal(err)
	}
	if want := append(slices.Clone(admitted), dlq); !slices.Equal(onBroker, slices.Sorted(slices.Values(want))) {
		t.Errorf("%d topics on the broker under %s, want the %d admitted + the dead-letter topic; first: %v",
			len(onBroker), e.Prefix, maxTopic, onBroker[:min(len(onBroker), 25)])
	}

	m := scrape(t, r)
	series := m.series("outbox_relay_events_published_total")
	if len(series) > maxTopic+1 {
		t.Errorf("outbox_relay_events_published_total has %d series, want at most max_topics+1 = %d", len(series), maxTopic+1)
	}
	if got := m.sumWhere("outbox_relay_dead_lettered_total", map[string]string{"reason": "topic_limit"}); got != types-maxTopic {
		t.Errorf("outbox_relay_dead_lettered_total{reason=topic_limit} = %v, want %d", got, types-maxTopic)
	}
	// sarama keeps a topic producer goroutine per topic and one per
	// partition (4 here) for the producer's lifetime: 21 topics make about
	// 105; 5,000 would make 25,000. 300 leaves room for the broker
	// producers, the metadata and the dead-letter row marks.
	g, rss := m.sum("go_goroutines"), m.sum("process_resident_memory_bytes")
	t.Logf("after %d events: %v goroutines, RSS %.0f MiB, %d published series", types+maxTopic*again, g, rss/(1<<20), len(series))
	if g > baseG+300 {
		t.Errorf("go_goroutines %v after the flood, %v at start: grows with the writers' topics", g, baseG)
	}
	// Measured with the race-instrumented relay: about +75 MiB over the
	// start for this run. Per topic sarama adds goroutine stacks and
	// per-topic metric histograms: without the limit, 90 s into the same
	// flood the relay held 5,043 goroutines and +418 MiB, still growing.
	if rss > baseRSS+150<<20 {
		t.Errorf("RSS %.0f MiB after the flood, %.0f MiB at start: grows with the writers' topics", rss/(1<<20), baseRSS/(1<<20))
	}
	if code := r.readyStatus(); code != 200 {
		t.Errorf("/readyz = %d after dead-lettering, want 200", code)
	}
}

// With kafka.auto_create_topics off (the default), the relay does not
// create a topic that does not exist: its events wait, unconfirmed, within
// kafka.missing_topic_timeout, until the operator creates it, then flow;
// other topics flow meanwhile (TestMissingTopicIsolated: after the timeout).
func TestMissingTopicIsNotCreatedByTheRelay(t *testing.T) {
	t.Parallel() // own outbox, relay and topics; no service fault, no shared proxy
	e := newEnv(t, "nocreate")
	present, missing := e.Prefix+".order", e.Prefix+".missing"
	if err := testkit.CreateTopics(brokers, 1, nil, present, e.Prefix+".dlq"); err != nil {
		t.Fatal(err)
	}
	r := e.startRelay("--kafka-auto-create-topics=false", "--dlq-topic", e.Prefix+".dlq", "--log-level", "debug")
	e.insertRow(t, "order", "o-1", "created", `{"n":1}`, `{}`)
	if rs := consume(t, []string{present}, 1, 60*time.Second, time.Second); len(rs) != 1 {
		t.Fatalf("%d records on %s, want 1", len(rs), present)
	}
	e.insertRow(t, "missing", "m-1", "created", `{"n":2}`, `{}`)
	e.insertRow(t, "order", "o-2", "created", `{"n":3}`, `{}`)
	// The order event arrives; the other waits in the producer while the
	// relay looks its topic up.
	if rs := consume(t, []string{present}, 2, 60*time.Second, time.Second); len(rs) != 2 {
		t.Fatalf("%d records on %s, want 2", len(rs), present)
	}
	waitFor(t, 30*time.Second, "the relay reporting the missing topic", func() bool {
		return strings.Contains(r.log(), "topic does not exist") && r.metric("outbox_relay_kafka_missing_topics") == 1 &&
			r.metric("outbox_relay_inflight_events") == 1
	})
	if tps, err := testkit.Topics(brokers, missing); err != nil || len(tps) != 0 {
		t.Fatalf("topics %v (%v): the relay created %s with kafka.auto_create_topics off", tps, err, missing)
	}
	if held, end := e.slotLSN(t), e.currentLSN(t); held >= end {
		t.Fatalf("slot confirmed at %s, past the undelivered event (WAL end %s)", held, end)
	}
	// The operator creates it: the event is delivered and confirmed.
	if err := testkit.CreateTopics(brokers, 1, nil, missing); err != nil {
		t.Fatal(err)
	}
	if rs := consume(t, []string{missing}, 1, 60*time.Second, time.Second); len(rs) != 1 || string(rs[0].Key) != "m-1" {
		t.Fatalf("records on %s after creating it: %+v", missing, rs)
	}
	if err := e.WaitConfirmed(context.Background(), e.currentLSN(t), 60*time.Second); err != nil {
		t.Fatalf("slot not confirmed after the topic was created: %v", err)
	}
	if n := r.metric("outbox_relay_kafka_missing_topics"); n != 0 {
		t.Errorf("outbox_relay_kafka_missing_topics = %v after the topic was created, want 0", n)
	}
	if n := r.metric("outbox_relay_dead_lettered_total"); n != 0 {
		t.Errorf("%v events dead-lettered; the topic came within kafka.missing_topic_timeout", n)
	}
}

// metrics is one scrape of /metrics.
type metrics []testkit.Sample

func scrape(t *testing.T, r *relay) metrics {
	t.Helper()
	ss, err := r.Scrape()
	return testkit.Must(t, metrics(ss), err)
}

func (m metrics) sum(name string) float64 { return m.sumWhere(name, nil) }

func (m metrics) sumWhere(name string, match map[string]string) float64 {
	v, _ := testkit.SumMetric(m, name, match)
	return v
}

func (m metrics) series(name string) []testkit.Sample {
	var out []testkit.Sample
	for _, s := range m {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}
