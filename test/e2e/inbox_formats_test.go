//go:build e2e

package e2e

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/cloudevents/sdk-go/protocol/kafka_sarama/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/inbox"
	"github.com/outbox-relay/outbox-relay/test/testkit"
)

// ceEvent is the i-th test CloudEvent: JSON, binary and text data in turn,
// an extension on every other one.
func ceEvent(t *testing.T, mode string, i int) event.Event {
	t.Helper()
	e := event.New()
	e.SetID(fmt.Sprintf("%s-%03d", mode, i))
	e.SetSource("/orders/" + mode)
	e.SetType("order.created")
	e.SetSubject(fmt.Sprintf("ord_%d", i%7))
	e.SetTime(time.Date(2026, 12, 5, 10, 0, i, 1000*i, time.UTC))
	var err error
	switch i % 3 {
	case 0:
		e.SetDataSchema("https://registry.example/schemas/ids/" + fmt.Sprint(i))
		err = e.SetData("application/json", []byte(fmt.Sprintf(`{"order":"ord_%d","n":%d,"note":"q\"b\\"}`, i%7, i)))
	case 1:
		err = e.SetData("application/octet-stream", []byte{0, byte(i), 0xff, '"', '\\'})
	case 2:
		err = e.SetData("text/plain", []byte(fmt.Sprintf("order %d\nline \"two\"", i)))
	}
	if err != nil {
		t.Fatal(err)
	}
	if i%2 == 0 {
		e.SetExtension("tenant", fmt.Sprintf("t%d", i))
	}
	return e
}

// sendCloudEvents sends events with the SDK's own Kafka sender, keyed by
// subject, in binary or structured mode.
func sendCloudEvents(t *testing.T, topic string, structured bool, events []event.Event) {
	t.Helper()
	cfg := testkit.SaramaConfig()
	cfg.Producer.Return.Successes = true
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	s, err := kafka_sarama.NewSender(brokers, cfg, topic)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	for _, e := range events {
		ctx := kafka_sarama.WithMessageKey(context.Background(), sarama.StringEncoder(e.Subject()))
		if structured {
			ctx = binding.WithForceStructured(ctx)
		} else {
			ctx = binding.WithForceBinary(ctx)
		}
		if err := s.Send(ctx, binding.ToMessage(&e)); err != nil {
			t.Fatalf("SDK send %s: %v", e.ID(), err)
		}
	}
}

// CloudEvents written by the SDK's own Kafka sender, binary and structured,
// with copies sent again in the other mode and two unreadable structured
// records: each event handled once with every attribute and its data; the
// bad records never reach the handler and are parked naming their offset.
func TestInboxReadsCloudEventsFromSDKSender(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "inboxce")
	topic := e.Prefix + ".order"
	if err := testkit.CreateTopics(brokers, 3, nil, topic); err != nil {
		t.Fatal(err)
	}
	const n = 30
	var bin, st []event.Event
	want := map[string]event.Event{}
	for i := range n {
		b, s := ceEvent(t, "bin", i), ceEvent(t, "st", i)
		bin, st = append(bin, b), append(st, s)
		want[b.ID()], want[s.ID()] = b, s
	}
	sendCloudEvents(t, topic, false, bin)
	sendCloudEvents(t, topic, true, st)
	// Duplicates: the first 10 of each, sent again in the other mode.
	sendCloudEvents(t, topic, true, bin[:10])
	sendCloudEvents(t, topic, false, st[:10])
	// Two structured records no reader can take, on partition 0.
	ct := []sarama.RecordHeader{{Key: []byte("content-type"), Value: []byte("application/cloudevents+json; charset=UTF-8")}}
	bad := []*sarama.ProducerMessage{
		{Key: sarama.StringEncoder("bad"), Value: sarama.StringEncoder(`{"specversion":"1.0","source":`), Headers: ct},
		{Key: sarama.StringEncoder("bad"), Value: sarama.StringEncoder(`{"specversion":"1.0","source":"/s","type":"t","data":{}}`), Headers: ct},
	}
	produce(t, topic, bad)
	total := int64(2*n + 20 + len(bad))

	ie := newInboxEnv(t, e.DB, e.Schema)
	if _, err := e.DB.Exec(context.Background(), "CREATE TABLE "+e.Schema+".parked (event_id text, error text)"); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	got := map[string][]*inbox.Message{}
	handler := func(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
		mu.Lock()
		got[m.EventID] = append(got[m.EventID], m)
		mu.Unlock()
		return ie.charge(ctx, tx, m)
	}
	cfg := ie.config(topic)
	cfg.OnGiveUp = func(ctx context.Context, tx pgx.Tx, m *inbox.Message, cause error) error {
		_, err := tx.Exec(ctx, "INSERT INTO "+e.Schema+".parked VALUES ($1, $2)", m.EventID, cause.Error())
		return err
	}
	c := startConsumer(t, cfg, e.DB, handler)
	c.waitConsumed(t, total, 60*time.Second)
	st2 := c.Stats()
	t.Logf("records %d: applied %d, duplicates %d, gave up %d", st2.Consumed, st2.Applied, st2.Duplicates, st2.GaveUp)
	if st2.Applied != 2*n || st2.Duplicates != 20 || st2.GaveUp != 2 {
		t.Errorf("stats %+v: want %d applied, 20 duplicates, 2 given up", st2, 2*n)
	}
	apps := ie.applications()
	mu.Lock()
	defer mu.Unlock()
	for id, w := range want {
		ms := got[id]
		if len(ms) != 1 || apps[id] != 1 {
			t.Errorf("event %s handled %d times, applied %d, want once", id, len(ms), apps[id])
			continue
		}
		m := ms[0]
		ce := m.CloudEvent
		mode := inbox.ModeBinary
		if strings.HasPrefix(id, "st-") {
			mode = inbox.ModeStructured
		}
		if ce == nil {
			t.Errorf("%s: no CloudEvent", id)
			continue
		}
		if m.EventType != w.Type() || m.AggregateID != w.Subject() || string(m.Key) != w.Subject() || string(m.Payload) != string(w.Data()) {
			t.Errorf("%s: type %q aggregate %q key %q payload %q\nwant %s", id, m.EventType, m.AggregateID, m.Key, m.Payload, w)
		}
		if ce.Mode != mode || ce.SpecVersion != "1.0" || ce.ID != id || ce.Source != w.Source() || ce.Type != w.Type() || ce.Subject != w.Subject() ||
			!ce.Time.Equal(w.Time()) || ce.DataContentType != w.DataContentType() || ce.DataSchema != w.DataSchema() {
			t.Errorf("%s: CloudEvent %+v\nwant %s", id, ce, w)
		}
		wantExt := map[string]string{}
		for k, v := range w.Extensions() {
			wantExt[k] = fmt.Sprint(v)
		}
		if len(wantExt) == 0 {
			wantExt = nil
		}
		if !equalStrings(ce.Extensions, wantExt) {
			t.Errorf("%s: extensions %v, want %v", id, ce.Extensions, wantExt)
		}
	}
	if len(got) != 2*n {
		t.Errorf("%d events handled, want %d", len(got), 2*n)
	}
	rows, err := e.DB.Query(context.Background(), "SELECT error FROM "+e.Schema+".parked ORDER BY error")
	if err != nil {
		t.Fatal(err)
	}
	var parked []string
	for rows.Next() {
		var s string
		_ = rows.Scan(&s)
		parked = append(parked, s)
	}
	t.Logf("parked: %q", parked)
	if len(parked) != 2 || !strings.Contains(parked[0], "record "+topic+"/0@") || !strings.Contains(parked[0], "not a valid CloudEvent") ||
		!strings.Contains(strings.Join(parked, "\n"), "the value is not a JSON object") || !strings.Contains(strings.Join(parked, "\n"), "required attribute id is missing") {
		t.Errorf("parked %q: want both bad records, each naming its topic/partition@offset and what is wrong", parked)
	}
}

// testWireDecoder decodes the test's wire format (magic byte, schema id,
// then JSON) and fails while down > 0, as a registry that is unreachable.
type testWireDecoder struct {
	mu    sync.Mutex
	down  int // failures left
	calls int
	known map[int]bool
}

func (d *testWireDecoder) Decode(_ context.Context, topic string, v []byte) ([]byte, int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.calls++
	if d.down > 0 {
		d.down--
		return nil, 0, errors.New("schema registry unreachable")
	}
	id := int(binary.BigEndian.Uint32(v[1:5]))
	if !d.known[id] {
		return nil, 0, fmt.Errorf("schema id %d not found for topic %s", id, topic)
	}
	return v[5:], id, nil
}

func wire(id int, payload string) []byte {
	b := []byte{0, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(b[1:], uint32(id))
	return append(b, payload...)
}

// Records in the Schema Registry wire format, plain JSON and a binary-mode
// CloudEvent whose data is in the wire format: with Config.Decoder the
// handler gets the decoded JSON and the schema id, each record once, after
// the decoder's first failures (retried, the record waits); an unknown
// schema id is given up after MaxAttempts. Without a Decoder a second
// group gets the wire-format bytes as they are.
func TestInboxDecoderReadsWireFormat(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "inboxsr")
	topic := e.Prefix + ".order"
	if err := testkit.CreateTopics(brokers, 1, nil, topic); err != nil {
		t.Fatal(err)
	}
	hdr := func(id string) []sarama.RecordHeader {
		return []sarama.RecordHeader{{Key: []byte("event_id"), Value: []byte(id)}, {Key: []byte("event_type"), Value: []byte("order.created")}}
	}
	values := map[string][]byte{
		"w-1": wire(7, `{"order":"ord_1"}`), "w-2": wire(8, `{"order":"ord_2","v":2}`), "p-3": []byte(`{"order":"ord_3"}`),
		"w-4": wire(1<<20, `{"order":"ord_4"}`), "u-5": wire(99, `{"order":"ord_5"}`),
	}
	var recs []*sarama.ProducerMessage
	for _, id := range []string{"w-1", "w-2", "p-3", "w-4", "u-5"} {
		recs = append(recs, &sarama.ProducerMessage{Key: sarama.StringEncoder(id), Value: sarama.ByteEncoder(values[id]), Headers: hdr(id)})
	}
	ce := []sarama.RecordHeader{{Key: []byte("ce_specversion"), Value: []byte("1.0")}, {Key: []byte("ce_id"), Value: []byte("ce-6")},
		{Key: []byte("ce_source"), Value: []byte("/s")}, {Key: []byte("ce_type"), Value: []byte("order.paid")},
		{Key: []byte("content-type"), Value: []byte("application/octet-stream")}}
	values["ce-6"] = wire(7, `{"order":"ord_6"}`)
	recs = append(recs, &sarama.ProducerMessage{Key: sarama.StringEncoder("ce-6"), Value: sarama.ByteEncoder(values["ce-6"]), Headers: ce})
	// A duplicate of w-1: skipped.
	recs = append(recs, &sarama.ProducerMessage{Key: sarama.StringEncoder("w-1"), Value: sarama.ByteEncoder(values["w-1"]), Headers: hdr("w-1")})
	produce(t, topic, recs)

	ie := newInboxEnv(t, e.DB, e.Schema)
	type seen struct {
		payload  string
		schemaID int
		ce       bool
	}
	var mu sync.Mutex
	got := map[string][]seen{}
	handler := func(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
		mu.Lock()
		got[m.EventID] = append(got[m.EventID], seen{string(m.Payload), m.SchemaID, m.CloudEvent != nil})
		mu.Unlock()
		return ie.charge(ctx, tx, m)
	}
	dec := &testWireDecoder{down: 3, known: map[int]bool{7: true, 8: true, 1 << 20: true}}
	cfg := ie.config(topic)
	cfg.Decoder = dec
	cfg.MaxAttempts = 6
	var gaveUp []string
	cfg.OnGiveUp = func(ctx context.Context, tx pgx.Tx, m *inbox.Message, cause error) error {
		mu.Lock()
		gaveUp = append(gaveUp, m.EventID+": "+cause.Error())
		mu.Unlock()
		return nil
	}
	c := startConsumer(t, cfg, e.DB, handler)
	c.waitConsumed(t, int64(len(recs)), 60*time.Second)
	st := c.Stats()
	t.Logf("stats %+v, decoder calls %d, gave up %q", st, dec.calls, gaveUp)
	want := map[string]seen{
		"w-1": {`{"order":"ord_1"}`, 7, false}, "w-2": {`{"order":"ord_2","v":2}`, 8, false}, "p-3": {`{"order":"ord_3"}`, 0, false},
		"w-4": {`{"order":"ord_4"}`, 1 << 20, false}, "ce-6": {`{"order":"ord_6"}`, 7, true},
	}
	apps := ie.applications()
	mu.Lock()
	defer mu.Unlock()
	for id, w := range want {
		if len(got[id]) != 1 || got[id][0] != w || apps[id] != 1 {
			t.Errorf("%s: handled %+v, applied %d, want once %+v", id, got[id], apps[id], w)
		}
	}
	if len(got["u-5"]) != 0 || len(gaveUp) != 1 || !strings.HasPrefix(gaveUp[0], "u-5: inbox: decode record "+topic+"/0@4 (schema id 99): schema id 99 not found") {
		t.Errorf("u-5: handled %v, gave up %q: want it given up after MaxAttempts naming its offset and schema id", got["u-5"], gaveUp)
	}
	if st.Applied != 5 || st.Duplicates != 1 || st.GaveUp != 1 || st.HandlerErrors != 3+6 {
		t.Errorf("stats %+v: want 5 applied, 1 duplicate, 1 given up, 9 errors (3 registry down, 6 unknown id)", st)
	}

	// Without a Decoder the same records pass as they are.
	cfg2 := ie.config(topic)
	cfg2.GroupID, cfg2.Consumer = ie.group+"-raw", ie.group+"-raw"
	raw := map[string][]byte{}
	var rmu sync.Mutex
	c2 := startConsumer(t, cfg2, e.DB, func(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
		rmu.Lock()
		defer rmu.Unlock()
		if m.SchemaID != 0 {
			return fmt.Errorf("%s: SchemaID %d without a Decoder", m.EventID, m.SchemaID)
		}
		raw[m.EventID] = m.Payload
		return nil
	})
	c2.waitConsumed(t, int64(len(recs)), 60*time.Second)
	rmu.Lock()
	defer rmu.Unlock()
	for id, v := range values {
		if string(raw[id]) != string(v) {
			t.Errorf("without a Decoder %s: payload %q, want the value %q", id, raw[id], v)
		}
	}
}

func equalStrings(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}
