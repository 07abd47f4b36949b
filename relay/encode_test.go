package relay

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/decoder"
	pg "github.com/outbox-relay/outbox-relay/decoder/pgoutputtest"
	"github.com/outbox-relay/outbox-relay/sink"
)

// fakeEncoder writes "enc:"+value; it refuses the events whose payload
// holds "bad" with reason schema_mismatch, and waits on gate (when not
// nil) before every event, as a Schema Registry that does not answer.
type fakeEncoder struct {
	gate  chan struct{}
	calls int
}

func (f *fakeEncoder) Encode(ctx context.Context, m *sink.Message, ev *decoder.Event) (string, error) {
	f.calls++
	if f.gate != nil {
		select {
		case <-f.gate:
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
	if bytes.Contains(ev.Payload, []byte("bad")) {
		return "schema_mismatch", errors.New("field amount: not a double")
	}
	m.Value = append([]byte("enc:"), m.Value...)
	return "", nil
}

// The encoder's verdict decides each event: an encoded record goes out in
// its new format, a refused one becomes its dead letter (reason
// schema_mismatch, the row's payload as written) and its neighbours go on;
// the watermark passes both.
func TestEncoderRefusalDeadLettersOnlyThatEvent(t *testing.T) {
	enc := &fakeEncoder{}
	h := newHarnessWith(t, fastPolicy, func(string, int) error { return nil }, &fakeMarker{marked: make(chan string, 10)},
		func(c *PipelineConfig) { c.Encoder = enc })
	bad := pg.Row("43", "order", "o-2", "order.paid", `{"bad":true}`, pg.Null)
	if err := h.txn(100, 110, order("42", "o-1"), bad, order("44", "o-3")); err != nil {
		t.Fatal(err)
	}
	h.waitFlushed(110)
	sent, tries := h.pub.snapshot()
	if tries[testDLQ] != 1 || tries[testTopic] != 2 || len(sent) != 3 {
		t.Fatalf("sent %v, want two events and one dead letter", tries)
	}
	for _, m := range sent {
		hd := map[string]string{}
		for _, x := range m.Headers {
			hd[string(x.Key)] = string(x.Value)
		}
		switch m.Topic {
		case testDLQ:
			if hd["dlq.reason"] != "schema_mismatch" || hd["dlq.event_id"] != "43" || string(m.Value) != `{"bad":true}` {
				t.Errorf("dead letter %v value %q, want reason schema_mismatch for row 43 with its payload as written", hd, m.Value)
			}
		default:
			if !bytes.HasPrefix(m.Value, []byte("enc:")) {
				t.Errorf("record of row %s went out as %q, not encoded", hd["outbox_id"], m.Value)
			}
		}
	}
}

// While the encoder waits (a registry down), nothing of the transaction is
// published or registered; once it answers, all of it goes out in order.
func TestEncoderWaitHoldsTransaction(t *testing.T) {
	enc := &fakeEncoder{gate: make(chan struct{})}
	h := newHarnessWith(t, fastPolicy, func(string, int) error { return nil }, &fakeMarker{marked: make(chan string, 10)},
		func(c *PipelineConfig) { c.Encoder = enc })
	errc := make(chan error, 1)
	go func() { errc <- h.txn(100, 110, order("42", "o-1"), order("43", "o-1")) }()
	time.Sleep(200 * time.Millisecond)
	if sent, _ := h.pub.snapshot(); len(sent) != 0 {
		t.Fatalf("%d records published while the encoder waits", len(sent))
	}
	if h.p.Flushed() >= 110 {
		t.Fatalf("watermark %s passed a transaction not published", h.p.Flushed())
	}
	close(enc.gate)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	h.waitFlushed(110)
	sent, _ := h.pub.snapshot()
	if len(sent) != 2 || !bytes.HasPrefix(sent[0].Value, []byte("enc:")) {
		t.Fatalf("sent %d records, want both encoded", len(sent))
	}
}
