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

	// The other commands on a table that is not the relay's own: status
	// and check work, those that need its bookkeeping columns refuse.
	cmd := func(args ...string) (int, string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		code, out, err := testkit.Run(ctx, os.Environ(), relayBin, append(args, e.args...)...)
		if err != nil {
			t.Fatal(err)
		}
		return code, out
	}
	if code, out := cmd("status", "--json"); code != 0 || !strings.Contains(out, `"mapped": true`) || !strings.Contains(out, `"name": "delivery"`) {
		t.Errorf("status: exit %d, want 0 with mapped and the delivery check off:\n%s", code, testkit.Tail(out, 3000))
	}
	if code, out := cmd("check", "--json"); code == 3 || !strings.Contains(out, "columns fit the mapping") {
		t.Errorf("check: exit %d, want no failure and the mapping checked:\n%s", code, testkit.Tail(out, 3000))
	}
	for _, c := range [][]string{{"replay", "--since", "2020-01-01"}, {"dlq", "list"}, {"cleanup", "--dry-run"}} {
		if code, out := cmd(c...); code != 2 || !strings.Contains(out, "works only on the relay's own outbox table") {
			t.Errorf("%v: exit %d, want 2 saying why:\n%s", c, code, testkit.Tail(out, 2000))
		}
	}
}

// writeConfig writes a YAML config file for the relay and returns its path.
func writeConfig(t *testing.T, yaml string) string {
	t.Helper()
	p := t.TempDir() + "/relay.yaml"
	if err := os.WriteFile(p, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// Issue 15: a mapped table with a TEXT id, a BYTEA payload, the key from
// another column and placed columns: the record is the payload's raw bytes,
// event_id the text id, the placements headers (a NULL one a null value).
func TestMappedTableTextIDByteaPayload(t *testing.T) {
	t.Parallel()
	e := newMappedEnv(t, "mapped", `CREATE TABLE {schema}.events (
		event_ref text PRIMARY KEY, tenant bigint, stream text NOT NULL, kind text, body bytea, trace text)`,
		func(e *env) []string {
			return append(e.baseArgs(), "--table", e.Schema+".events", "--topic-template", e.Prefix+".{aggregate_type}",
				"--columns-id", "event_ref", "--columns-key", "tenant", "--columns-payload", "body", "--columns-route-by", "stream",
				"--columns-type", "kind", "--columns-headers", "none", "--columns-additional", "trace:header:x-trace,kind:header",
				"--dlq-topic", e.Prefix+".dlq")
		})
	r := e.startRelay()
	ctx := context.Background()
	raw := []byte{0x00, 0xff, '\\', 'x', 0x80, '\n'}
	tx, err := e.DB.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i, q := range []string{
		"INSERT INTO " + e.Schema + ".events VALUES ('ev-1', 7, 'order', 'Created', $1, 't-1')",
		"INSERT INTO " + e.Schema + ".events VALUES ('ev-2', 7, 'order', 'Paid', $1, NULL)",
		"INSERT INTO " + e.Schema + ".events VALUES ('ev-3', 8, 'order', 'Created', $1, 't-3')",
		"INSERT INTO " + e.Schema + ".events VALUES ('ev-4', NULL, 'order', 'Created', $1, 't-4')", // poison: NULL key
	} {
		if _, err := tx.Exec(ctx, q, append(raw, byte(i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	got := rawRecords(t, []string{e.Prefix + ".order"}, 3, 60*time.Second)
	byID := map[string]*sarama.ConsumerMessage{}
	for _, m := range got {
		for _, h := range m.Headers {
			if string(h.Key) == "event_id" {
				byID[string(h.Value)] = m
			}
		}
	}
	for i, w := range []struct{ id, key, headers string }{
		{"ev-1", "7", `x-trace="t-1";kind="Created";`},
		{"ev-2", "7", `x-trace=<null>;kind="Paid";`},
		{"ev-3", "8", `x-trace="t-3";kind="Created";`},
	} {
		m := byID[w.id]
		if m == nil {
			t.Errorf("no record with event_id %q (got %d records)", w.id, len(got))
			continue
		}
		if want := append(append([]byte(nil), raw...), byte(i)); !bytes.Equal(m.Value, want) {
			t.Errorf("%s: value %q, want the bytea's raw bytes %q", w.id, m.Value, want)
		}
		if string(m.Key) != w.key {
			t.Errorf("%s: key %q, want %q", w.id, m.Key, w.key)
		}
		// The relay's own headers, then the placements in their order.
		if h := headerList(m.Headers); !strings.HasSuffix(h, w.headers) || !strings.HasPrefix(h, `event_id="`+w.id+`";event_type="`) {
			t.Errorf("%s: headers %s, want the relay's then %s", w.id, h, w.headers)
		}
	}
	if !strings.Contains(r.log(), "are off for this table") {
		t.Error("the start log does not say which features are off for a mapped table")
	}
	// The poison row is dead-lettered without a row mark (the table has no
	// bookkeeping columns), and then the slot passes it.
	letters := rawRecords(t, []string{e.Prefix + ".dlq"}, 1, 60*time.Second)
	h := map[string]string{}
	for _, x := range letters[0].Headers {
		h[string(x.Key)] = string(x.Value)
	}
	if h["dlq.event_id"] != "ev-4" || h["dlq.reason"] != "bad_row" || h["dlq.table"] != e.Schema+".events" || !strings.Contains(h["dlq.error"], `column "tenant": is NULL`) {
		t.Errorf("dead letter headers %v, want dlq.event_id ev-4, bad_row, column tenant is NULL", h)
	}
	end, err := e.LSN(ctx, "SELECT pg_current_wal_lsn()")
	if err != nil {
		t.Fatal(err)
	}
	if err := e.WaitConfirmed(ctx, end, 30*time.Second); err != nil {
		t.Errorf("slot not confirmed past the dead-lettered row: %v", err)
	}
}

// Issue 15: a table that does not fit its mapping is refused at start,
// naming the key, the column, its type and the fix.
func TestMappedTableRefusedAtStart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	o, err := testkit.NewOutbox(ctx, svcs, "e2e", "refuse")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = o.Close(context.Background()) })
	if _, err := o.DB.Exec(ctx, "CREATE SCHEMA "+o.Schema+"; CREATE TABLE "+o.Schema+`.outbox (
		id numeric PRIMARY KEY, aggregatetype text, aggregateid text, type text, payload xml)`); err != nil {
		t.Fatal(err)
	}
	e := &env{Outbox: o, t: t, url: pgURL}
	args := append(e.baseArgs(), "--table", o.Table, "--compat", "debezium")
	rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	code, out, err := testkit.Run(rctx, os.Environ(), relayBin, append([]string{"migrate"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`columns.id: column \"id\" of ` + o.Table + ` has type numeric, but the event id must be int8, int4, int2, uuid, text, varchar`,
		`columns.payload: column \"payload\" of ` + o.Table + ` has type xml`,
		`ALTER TABLE`,
	} {
		if code != 1 || !strings.Contains(out, want) {
			t.Errorf("migrate: exit %d, want 1 and %q in:\n%s", code, want, testkit.Tail(out, 3000))
		}
	}
	// The config itself: a placement that would forge the id header.
	code, out, err = testkit.Run(rctx, os.Environ(), relayBin, append([]string{"run"}, append(args, "--columns-additional", "type:header:ID")...)...)
	if err != nil {
		t.Fatal(err)
	}
	if code != 2 || !strings.Contains(out, `columns.additional: header name "ID" (column type) is reserved`) {
		t.Errorf("run: exit %d, want 2 naming columns.additional:\n%s", code, testkit.Tail(out, 2000))
	}
}

// Issue 15: two outbox tables in two schemas, one slot and one
// publication, each with its own mapping (BIGINT and TEXT ids) and topic
// template ({schema}, {table}); order per key holds per table while both
// are written in the same transactions with the same keys.
func TestTwoOutboxTablesOneSlot(t *testing.T) {
	t.Parallel()
	var cfg string
	e := newMappedEnv(t, "tables", `CREATE TABLE {schema}.outbox (
			id bigserial PRIMARY KEY, aggregate_type text NOT NULL, aggregate_id text NOT NULL,
			event_type text NOT NULL, payload jsonb NOT NULL, headers jsonb);
		CREATE SCHEMA {schema}_b;
		CREATE TABLE {schema}_b.events (ref text PRIMARY KEY, customer text NOT NULL, body text NOT NULL)`,
		func(e *env) []string {
			cfg = writeConfig(t, fmt.Sprintf(`tables:
  - name: %[1]s.outbox
    topic_template: "%[2]s.{table}.{aggregate_type}"
  - name: %[1]s_b.events
    columns: {id: ref, key: customer, payload: body, type: none, route_by: none, headers: none}
    topic_template: "%[2]s.{schema}.{table}"
`, e.Schema, e.Prefix))
			return append(e.baseArgs(), "--config", cfg)
		})
	t.Cleanup(func() {
		ctx := context.Background()
		_, _ = e.DB.Exec(ctx, "DROP SCHEMA IF EXISTS "+e.Schema+"_b CASCADE")
		// With tables, the helper tables are beside postgres.table's default, in public.
		_, _ = e.DB.Exec(ctx, "DELETE FROM public.outbox_relay_slots WHERE slot_name = $1", e.Slot)
		_, _ = e.DB.Exec(ctx, "DELETE FROM public.outbox_relay_leader WHERE slot_name = $1", e.Slot)
	})
	r := e.startRelay()
	ctx := context.Background()
	const txns, perTxn = 40, 5
	keys := []string{"k1", "k2", "k3"}
	n := 0
	for i := 0; i < txns; i++ {
		tx, err := e.DB.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for j := 0; j < perTxn; j++ {
			k := keys[n%len(keys)]
			if _, err := tx.Exec(ctx, "INSERT INTO "+e.Schema+".outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', $1, 'E', $2)",
				k, fmt.Sprintf(`{"n": %d}`, n)); err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, "INSERT INTO "+e.Schema+"_b.events VALUES ($1, $2, $3)",
				fmt.Sprintf("b-%05d", n), k, fmt.Sprintf("body %d", n)); err != nil {
				t.Fatal(err)
			}
			n++
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	topicA, topicB := e.Prefix+".outbox.order", e.Prefix+"."+e.Schema+"_b.events"
	got := rawRecords(t, []string{topicA, topicB}, 2*n, 60*time.Second)
	// Per table, per key: event ids in commit order, no duplicates.
	seq := map[string][]string{}
	for _, m := range got {
		var id string
		for _, h := range m.Headers {
			if string(h.Key) == "event_id" {
				id = string(h.Value)
			}
		}
		seq[m.Topic+"/"+string(m.Key)] = append(seq[m.Topic+"/"+string(m.Key)], id)
	}
	if len(got) != 2*n {
		t.Errorf("got %d records, want %d", len(got), 2*n)
	}
	for _, k := range keys {
		a, b := seq[topicA+"/"+k], seq[topicB+"/"+k]
		if len(a) != n/len(keys) && len(a) != n/len(keys)+1 || len(b) != len(a) {
			t.Errorf("key %s: %d records of table a, %d of table b, want %d each", k, len(a), len(b), n/len(keys))
		}
		for i := 1; i < len(a); i++ {
			var x, y int64
			fmt.Sscan(a[i-1], &x)
			fmt.Sscan(a[i], &y)
			if y <= x {
				t.Errorf("table a key %s: id %d after %d: not in commit order", k, y, x)
			}
		}
		for i := 1; i < len(b); i++ {
			if b[i] <= b[i-1] {
				t.Errorf("table b key %s: id %s after %s: not in commit order", k, b[i], b[i-1])
			}
		}
	}
	for _, tbl := range []string{e.Schema + ".outbox", e.Schema + "_b.events"} {
		waitFor(t, 10*time.Second, "per-table decoded metric of "+tbl, func() bool {
			ss, err := r.Scrape()
			v, ok := testkit.SumMetric(ss, "outbox_relay_table_events_decoded_total", map[string]string{"table": tbl})
			return err == nil && ok && v >= float64(n)
		})
	}
	cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	code, out, err := testkit.Run(cctx, os.Environ(), relayBin, append([]string{"check", "--json"}, e.args...)...)
	if err != nil {
		t.Fatal(err)
	}
	if want := e.Schema + ".outbox, " + e.Schema + "_b.events: columns fit the mapping"; code == 3 || !strings.Contains(out, want) {
		t.Errorf("check: exit %d, want no failure and %q:\n%s", code, want, testkit.Tail(out, 3000))
	}
}
