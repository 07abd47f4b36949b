//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/outbox-relay/outbox-relay/test/testkit"
)

// newMappedEnv is a test's private outbox whose tables are the user's: ddl
// (with {schema} replaced by the test's schema) creates them, then migrate
// runs with args (the relay's config flags, also used by startRelay): with
// compat, columns or tables it leaves the tables as they are and creates
// only the helper tables, the publication and the slot.
func newMappedEnv(t *testing.T, name, ddl string, args func(e *env) []string) *env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	o, err := testkit.NewOutbox(ctx, svcs, "e2e", name)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{Outbox: o, t: t, name: name, url: pgURL}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := o.Close(ctx); err != nil {
			t.Logf("cleanup: %v", err)
		}
	})
	if _, err := o.DB.Exec(ctx, "CREATE SCHEMA "+o.Schema+"; "+strings.ReplaceAll(ddl, "{schema}", o.Schema)); err != nil {
		t.Fatalf("create the outbox tables: %v", err)
	}
	e.args = args(e)
	if code, out, err := testkit.Run(ctx, os.Environ(), relayBin, append([]string{"migrate"}, e.args...)...); err != nil || code != 0 {
		t.Fatalf("migrate: exit %d %v\n%s", code, err, out)
	}
	return e
}

// baseArgs are the config flags every mapped test shares.
func (e *env) baseArgs() []string {
	return []string{"--postgres-url", e.url, "--kafka-brokers", strings.Join(brokers, ","),
		"--slot", e.Slot, "--publication", e.Pub, "--log-format", "json", "--kafka-auto-create-topics"}
}

// rawRecords reads every partition of topics until want records came,
// keeping what testkit.Record flattens: header order, repeats, null values.
func rawRecords(t *testing.T, topics []string, want int, d time.Duration) []*sarama.ConsumerMessage {
	t.Helper()
	var mu sync.Mutex
	var got []*sarama.ConsumerMessage
	c, err := testkit.Consume(brokers, topics, d, func(m *sarama.ConsumerMessage) {
		mu.Lock()
		got = append(got, m)
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	n := func() int { mu.Lock(); defer mu.Unlock(); return len(got) }
	waitFor(t, d, fmt.Sprintf("%d records on %v", want, topics), func() bool { return n() >= want })
	mu.Lock()
	defer mu.Unlock()
	return append([]*sarama.ConsumerMessage(nil), got...)
}

func headerList(hs []*sarama.RecordHeader) string {
	var b strings.Builder
	for _, h := range hs {
		v := "<null>"
		if h.Value != nil {
			v = fmt.Sprintf("%q", h.Value)
		}
		fmt.Fprintf(&b, "%s=%s;", h.Key, v)
	}
	return b.String()
}

// Issue 15: compat: debezium reads Debezium's recommended outbox table and
// writes what the EventRouter writes by default: topic
// outbox.event.<aggregatetype>, key aggregateid, value the payload's text,
// one header id (the uuid's text), and a NULL payload as a null value.
func TestCompatDebeziumRecords(t *testing.T) {
	t.Parallel()
	e := newMappedEnv(t, "compat", `CREATE TABLE {schema}.outbox (
		id uuid PRIMARY KEY, aggregatetype varchar(255) NOT NULL, aggregateid varchar(255) NOT NULL,
		type varchar(255) NOT NULL, payload jsonb)`,
		func(e *env) []string { return append(e.baseArgs(), "--table", e.Table, "--compat", "debezium") })
	ctx := context.Background()
	// migrate left Debezium's table alone: none of the relay's columns added.
	var cols int
	if err := e.DB.QueryRow(ctx, "SELECT count(*) FROM information_schema.columns WHERE table_schema = $1 AND table_name = 'outbox'", e.Schema).Scan(&cols); err != nil || cols != 5 {
		t.Fatalf("Debezium's table has %d columns after migrate (%v), want its 5", cols, err)
	}
	aggType := "e2ecompat" + e.Slot[len("e2e_compat_"):]
	topic := "outbox.event." + aggType
	t.Cleanup(func() { _ = testkit.DeleteTopics(brokers, topic) })
	r := e.startRelay()

	type row struct {
		id, key string
		payload *string
	}
	p := func(s string) *string { return &s }
	rows := []row{
		{"8b1d3a4e-0000-4000-8000-000000000001", "order-1", p(`{"b": 1, "a": "é \"q\"", "n": [1.50, null]}`)},
		{"8b1d3a4e-0000-4000-8000-000000000002", "order-2", p(`{}`)},
		{"8b1d3a4e-0000-4000-8000-000000000003", "order-1", nil}, // a tombstone
		{"8b1d3a4e-0000-4000-8000-000000000004", "order-1", p(`[1, 2]`)},
	}
	tx, err := e.DB.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range rows {
		if _, err := tx.Exec(ctx, "INSERT INTO "+e.Table+" (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, $3, 'OrderCreated', $4::jsonb)",
			x.id, aggType, x.key, x.payload); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	// What PostgreSQL renders for each payload: Debezium's value bytes.
	want := map[string]*string{}
	qrows, err := e.DB.Query(ctx, "SELECT id::text, payload::text FROM "+e.Table)
	if err != nil {
		t.Fatal(err)
	}
	for qrows.Next() {
		var id string
		var pl *string
		if err := qrows.Scan(&id, &pl); err != nil {
			t.Fatal(err)
		}
		want[id] = pl
	}
	if qrows.Err() != nil {
		t.Fatal(qrows.Err())
	}

	got := rawRecords(t, []string{topic}, len(rows), 60*time.Second)
	parts := partitionCount(t, topic)
	perKey := map[string][]string{}
	for _, m := range got {
		if len(m.Headers) != 1 || string(m.Headers[0].Key) != "id" {
			t.Errorf("record at %s/%d@%d has headers %s, want only id", m.Topic, m.Partition, m.Offset, headerList(m.Headers))
			continue
		}
		id := string(m.Headers[0].Value)
		pl, ok := want[id]
		switch {
		case !ok:
			t.Errorf("header id %q is no row's id", id)
		case pl == nil && m.Value != nil:
			t.Errorf("row %s: NULL payload published as %q, want a null value (tombstone)", id, m.Value)
		case pl != nil && !bytes.Equal(m.Value, []byte(*pl)):
			t.Errorf("row %s: value %q, want the payload's text %q", id, m.Value, *pl)
		}
		if wantP := testkit.Partition(m.Key, parts); m.Partition != wantP {
			t.Errorf("row %s key %q in partition %d, want %d (murmur2 of the key)", id, m.Key, m.Partition, wantP)
		}
		perKey[string(m.Key)] = append(perKey[string(m.Key)], id)
	}
	if len(got) != len(rows) {
		t.Errorf("got %d records, want %d", len(got), len(rows))
	}
	// Commit order per key.
	if w := []string{rows[0].id, rows[2].id, rows[3].id}; fmt.Sprint(perKey["order-1"]) != fmt.Sprint(w) {
		t.Errorf("key order-1 in order %v, want %v", perKey["order-1"], w)
	}
	if fmt.Sprint(perKey["order-2"]) != fmt.Sprint([]string{rows[1].id}) {
		t.Errorf("key order-2: %v", perKey["order-2"])
	}
	if !strings.Contains(r.log(), `"compat":"debezium"`) {
		t.Error("the start log does not say compat debezium")
	}
}
