package sink

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
)

// saramaBytes returns the bytes sarama's Broker writes for req, read by a
// listener that never answers.
func saramaBytes(t *testing.T, sc *sarama.Config, req *sarama.ProduceRequest) []byte {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan []byte, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- nil
			return
		}
		defer c.Close()
		var size [4]byte
		if _, err := io.ReadFull(c, size[:]); err != nil {
			got <- nil
			return
		}
		body := make([]byte, binary.BigEndian.Uint32(size[:]))
		if _, err := io.ReadFull(c, body); err != nil {
			got <- nil
			return
		}
		got <- append(size[:], body...)
	}()
	conf := *sc
	conf.ApiVersionsRequest = false
	b := sarama.NewBroker(ln.Addr().String())
	if err := b.Open(&conf); err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := b.AsyncProduce(req, func(*sarama.ProduceResponse, error) {}); err != nil {
		t.Fatal(err)
	}
	select {
	case p := <-got:
		if p == nil {
			t.Fatal("the listener read no request")
		}
		return p
	case <-time.After(10 * time.Second):
		t.Fatal("sarama sent no request")
	}
	return nil
}

// saramaBatch is the record batch sarama's producer builds for bt.
func saramaBatch(d *direct, bt *dbatch) *sarama.RecordBatch {
	first := time.UnixMilli(bt.first)
	last := first
	for _, m := range bt.msgs {
		if ts := m.Timestamp.Truncate(time.Millisecond); ts.After(last) {
			last = ts
		}
	}
	rb := &sarama.RecordBatch{Version: 2, Codec: d.codec, CompressionLevel: d.level, PartitionLeaderEpoch: -1,
		FirstTimestamp: first, MaxTimestamp: last,
		LastOffsetDelta: int32(len(bt.msgs) - 1), ProducerID: bt.pid, ProducerEpoch: bt.epoch, FirstSequence: bt.seq}
	for i, m := range bt.msgs {
		r := &sarama.Record{Key: m.Key, Value: m.Value, OffsetDelta: int64(i)}
		if !m.Timestamp.IsZero() {
			r.TimestampDelta = m.Timestamp.Truncate(time.Millisecond).Sub(first)
		}
		for _, h := range m.Headers {
			rh := sarama.RecordHeader(h)
			r.Headers = append(r.Headers, &rh)
		}
		rb.Records = append(rb.Records, r)
	}
	return rb
}

// The request wire writes is, byte for byte, the one sarama's Broker
// writes for the same batch: every codec, Produce v3 to v8, records with
// and without key, value, headers and timestamp, and lengths that take
// multi-byte varints.
func TestWireEncodesAsSarama(t *testing.T) {
	for _, codec := range []string{"none", "gzip", "snappy", "lz4", "zstd"} {
		for _, version := range []sarama.KafkaVersion{sarama.V0_11_0_0, sarama.V1_0_0_0, sarama.V2_1_0_0, sarama.V2_4_0_0, sarama.V4_0_0_0} {
			if codec == "zstd" && !version.IsAtLeast(sarama.V2_1_0_0) {
				continue // Kafka takes zstd from 2.1 on
			}
			t.Run(codec+"/"+version.String(), func(t *testing.T) {
				cfg := validConfig()
				cfg.Compression = codec
				cfg.Version = version.String()
				sc, err := saramaConfig(cfg)
				if err != nil {
					t.Fatal(err)
				}
				d, p, db, _ := directRig(t, 5, 1000000)
				d.sc, d.codec, d.level, d.wireVersion = sc, sc.Producer.Compression, sc.Producer.CompressionLevel, wireVersion(sc.Version)
				p.seq = 77
				base := time.UnixMilli(1_700_000_000_123)
				for i := range 300 {
					m := &Message{Topic: "orders", Key: []byte("order-1"), Value: []byte(strings.Repeat("v", i*7)),
						Timestamp: base.Add(time.Duration(i) * 1500 * time.Microsecond)}
					switch i % 7 {
					case 0:
						m.Key = nil
					case 1:
						m.Value = nil
					case 2:
						m.Headers = []Header{{Key: []byte("trace"), Value: []byte("t-1")}, {Key: []byte("empty"), Value: []byte{}}, {Key: []byte("null")}}
					case 3:
						m.Timestamp = time.Time{} // takes the batch's first timestamp
					case 4:
						m.Value = bytes.Repeat([]byte{0xff}, 20000)
					}
					if err := d.publish(m); err != nil {
						t.Fatal(err)
					}
				}
				batches := d.build(db)
				if len(batches) != 1 {
					t.Fatalf("%d batches, want 1", len(batches))
				}
				w := &wire{sc: sc, clientID: sc.ClientID, corr: -1} // sarama's first correlation id is 0
				if err := w.encodeProduce(d, batches); err != nil {
					t.Fatal(err)
				}
				binary.BigEndian.PutUint32(w.req, uint32(len(w.req)-4)) // roundTrip's part
				req := &sarama.ProduceRequest{RequiredAcks: sarama.WaitForAll, Timeout: d.timeout, Version: d.wireVersion}
				req.AddBatch("orders", 0, saramaBatch(d, batches[0]))
				want := saramaBytes(t, sc, req)
				if !bytes.Equal(w.req, want) {
					at := 0
					for at < min(len(w.req), len(want)) && w.req[at] == want[at] {
						at++
					}
					t.Fatalf("Produce v%d, %s: %d bytes against sarama's %d, first difference at byte %d", d.wireVersion, codec, len(w.req), len(want), at)
				}
			})
		}
	}
}

// response builds a Produce response body (after the correlation id).
type response struct{ b []byte }

func (r *response) i16(v int16)  { r.b = binary.BigEndian.AppendUint16(r.b, uint16(v)) }
func (r *response) i32(v int32)  { r.b = binary.BigEndian.AppendUint32(r.b, uint32(v)) }
func (r *response) i64(v int64)  { r.b = binary.BigEndian.AppendUint64(r.b, uint64(v)) }
func (r *response) str(s string) { r.i16(int16(len(s))); r.b = append(r.b, s...) }

// The response is matched to the batches by topic and partition in any
// order, with the fields of each version; a partition the response leaves
// out is not answered, and a short response is an error.
func TestWireReadsProduceResponse(t *testing.T) {
	type part struct {
		topic string
		id    int32
		code  int16
	}
	answer := []part{{"payments", 2, 0}, {"orders", 1, int16(sarama.ErrNotLeaderForPartition)}, {"orders", 0, 0}}
	for _, version := range []int16{3, 5, 7, 8} {
		var batches []*dbatch
		for _, k := range []struct {
			topic string
			id    int32
		}{{"orders", 0}, {"orders", 1}, {"payments", 2}, {"payments", 3}} {
			batches = append(batches, &dbatch{part: &dpart{topic: &dtopic{name: k.topic}, id: k.id}})
		}
		r := &response{}
		r.i32(int32(len(answer))) // a topic per partition: allowed, and out of order
		for _, a := range answer {
			r.str(a.topic)
			r.i32(1)
			r.i32(a.id)
			r.i16(a.code)
			r.i64(100) // base offset
			r.i64(-1)  // log append time
			if version >= 5 {
				r.i64(0) // log start offset
			}
			if version >= 8 {
				r.i32(0)  // record errors
				r.i16(-1) // error message
				if a.code != 0 {
					r.b = r.b[:len(r.b)-2]
					r.str("moved to broker 2")
				}
			}
		}
		r.i32(1500) // throttle time, ms
		throttle, err := answerProduce(r.b, version, batches)
		if err != nil {
			t.Fatalf("v%d: %v", version, err)
		}
		if throttle != 1500 {
			t.Errorf("v%d: throttle time %d ms, want 1500", version, throttle)
		}
		if !batches[0].got || batches[0].err != nil || !batches[2].got || batches[2].err != nil {
			t.Errorf("v%d: acked partitions: %+v %+v", version, batches[0], batches[2])
		}
		if !batches[1].got || !errors.Is(batches[1].err, sarama.ErrNotLeaderForPartition) {
			t.Errorf("v%d: orders/1 answered %v %v, want not leader", version, batches[1].got, batches[1].err)
		}
		if version >= 8 && !strings.Contains(batches[1].err.Error(), "moved to broker 2") {
			t.Errorf("v%d: the broker's message is lost: %v", version, batches[1].err)
		}
		if batches[3].got {
			t.Errorf("v%d: payments/3 is not in the response but counts as answered", version)
		}
		if _, err := answerProduce(r.b[:len(r.b)-3], version, batches); err == nil {
			t.Errorf("v%d: a truncated response reads without error", version)
		}
	}
}

// A connection is replaced before a request when its SASL session is about
// to end or when it sat idle long enough for the broker to close it.
func TestWireExpires(t *testing.T) {
	now := time.Now()
	cases := []struct {
		name   string
		reauth time.Time
		last   time.Time
		want   bool
	}{
		{"new", time.Time{}, time.Time{}, false},
		{"busy", time.Time{}, now.Add(-time.Second), false},
		{"idle past the limit", time.Time{}, now.Add(-wireIdle - time.Second), true},
		{"session ahead", now.Add(time.Minute), now, false},
		{"session over", now.Add(-time.Second), now, true},
	}
	for _, tc := range cases {
		if got := (&wire{reauth: tc.reauth, last: tc.last}).expired(now); got != tc.want {
			t.Errorf("%s: expired %v, want %v", tc.name, got, tc.want)
		}
	}
}
