package sink

import (
	"context"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/rs/zerolog"
)

// inputOnly is an AsyncProducer whose Input is a buffered channel the test
// reads; nothing else is called.
type inputOnly struct {
	sarama.AsyncProducer
	in chan *sarama.ProducerMessage
}

func (a *inputOnly) Input() chan<- *sarama.ProducerMessage { return a.in }

// TestPublishAllocatesNothing: Publish hands sarama the record kept in the
// Message, allocated at its first Publish, so publishing it again allocates
// nothing (it allocated the ProducerMessage and the Key and Value interface
// values each time), and a Message published again starts from a fresh
// record with its current fields.
func TestPublishAllocatesNothing(t *testing.T) {
	p, err := New(validConfig(), zerolog.Nop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ap := &inputOnly{in: make(chan *sarama.ProducerMessage, 1)}
	p.ap = ap
	ts := time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)
	m := &Message{Topic: "t", Key: []byte("order-1"), Value: []byte(`{"n":1}`), Timestamp: ts,
		Headers: []Header{{Key: []byte("id"), Value: []byte("1")}}, Done: func(error) {}}
	ctx := context.Background()
	allocs := testing.AllocsPerRun(100, func() {
		if err := p.Publish(ctx, m); err != nil {
			t.Fatal(err)
		}
		<-ap.in
	})
	if allocs != 0 {
		t.Errorf("Publish allocates %.0f times per call, want 0", allocs)
	}

	for _, tc := range []struct {
		name       string
		key, value []byte
	}{
		{"key and value", []byte("order-2"), []byte(`{"n":2}`)},
		{"null value (tombstone)", []byte("order-3"), nil},
		{"null key", nil, []byte(`{}`)},
	} {
		m.Key, m.Value, m.Topic = tc.key, tc.value, "t2"
		if err := p.Publish(ctx, m); err != nil {
			t.Fatal(err)
		}
		pm := <-ap.in
		if pm.Topic != "t2" || pm.Partition != -1 || pm.Metadata != m || !pm.Timestamp.Equal(ts) || len(pm.Headers) != 1 {
			t.Errorf("%s: record %+v", tc.name, pm)
		}
		for what, e := range map[string]struct {
			enc  sarama.Encoder
			want []byte
		}{"key": {pm.Key, tc.key}, "value": {pm.Value, tc.value}} {
			if e.want == nil {
				if e.enc != nil {
					t.Errorf("%s: %s is %v, want nil (a null in the record)", tc.name, what, e.enc)
				}
				continue
			}
			b, _ := e.enc.Encode()
			if string(b) != string(e.want) || e.enc.Length() != len(e.want) {
				t.Errorf("%s: %s encodes %q (length %d), want %q", tc.name, what, b, e.enc.Length(), e.want)
			}
		}
	}
}
