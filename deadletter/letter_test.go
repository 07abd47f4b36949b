package deadletter

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/IBM/sarama"

	"github.com/outbox-relay/outbox-relay/outboxschema"
	"github.com/outbox-relay/outbox-relay/sink"
)

func hdr(kv ...string) []sink.Header {
	var h []sink.Header
	for i := 0; i < len(kv); i += 2 {
		h = append(h, sink.Header{Key: []byte(kv[i]), Value: []byte(kv[i+1])})
	}
	return h
}

// own is the relay's headers of an event with this key.
func own(key string) []sink.Header {
	return hdr("event_id", "42", "event_type", "order.paid", "aggregate_type", "order", "aggregate_id", key, "pg_lsn", "0/16B3F00")
}

func TestRecord(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	base := Letter{Table: "public.outbox", ID: 42, LSN: 0x16B3F28, Topic: "outbox.event.order", Key: []byte("o-1"),
		Value: []byte(`{"a":1}`), Headers: own("o-1"), RowHeaders: hdr("trace_id", "t-1"),
		Reason: "broker_rejected", Err: "kafka server: invalid record", Attempts: 5, MaxBytes: 1000000}
	bigKey := strings.Repeat("k", 1_500_000)
	tests := []struct {
		name      string
		mutate    func(*Letter)
		wantKey   string // "" = the letter's own key
		wantValue string
		want      map[string]string
		absent    []string
	}{
		{"with payload", func(*Letter) {}, "", `{"a":1}`, map[string]string{
			"trace_id": "t-1", "event_id": "42", "aggregate_id": "o-1", HeaderOriginalTopic: "outbox.event.order",
			HeaderReason: "broker_rejected", HeaderError: "kafka server: invalid record", HeaderAttempts: "5",
			HeaderSourceLSN: "0/16B3F28", HeaderTable: "public.outbox", HeaderEventID: "42", HeaderFailedAt: "2026-01-02T03:04:05Z"},
			[]string{HeaderPayloadOmitted, HeaderHeadersOmitted, HeaderKeyTruncated}},
		{"too large: payload and row headers omitted, the relay's kept", func(l *Letter) { l.TooLarge, l.Reason = true, "message_too_large" }, "", "",
			map[string]string{HeaderPayloadOmitted: "true", HeaderHeadersOmitted: "true", HeaderReason: "message_too_large", "event_id": "42", "aggregate_id": "o-1"},
			[]string{"trace_id", HeaderKeyTruncated}},
		{"too large without row headers: none said omitted", func(l *Letter) { l.TooLarge, l.RowHeaders = true, nil }, "", "",
			map[string]string{HeaderPayloadOmitted: "true"}, []string{HeaderHeadersOmitted}},
		{"unrouted: empty original topic", func(l *Letter) { l.Topic, l.Reason = "", ReasonInvalidTopic }, "", `{"a":1}`,
			map[string]string{HeaderOriginalTopic: "", HeaderReason: ReasonInvalidTopic}, nil},
		{"1.5 MB key: bounded key and aggregate_id, the original length said", func(l *Letter) {
			l.Key, l.Headers, l.TooLarge, l.Reason = []byte(bigKey), own(bigKey), true, "message_too_large"
		}, string(BoundField([]byte(bigKey))), "",
			map[string]string{HeaderKeyTruncated: "1500000", "dlq.aggregate_id_truncated": "1500000",
				"aggregate_id": string(BoundField([]byte(bigKey))), HeaderPayloadOmitted: "true"}, nil},
		{"2 MB of row headers, not too large itself: headers dropped, payload kept", func(l *Letter) {
			l.RowHeaders, l.Reason = hdr("blob", strings.Repeat("h", 2<<20), "trace_id", "t-1"), ReasonBadRow
		}, "", `{"a":1}`, map[string]string{HeaderHeadersOmitted: "true"}, []string{"blob", "trace_id", HeaderPayloadOmitted}},
		{"payload at the limit plus dlq headers: headers, then payload dropped", func(l *Letter) {
			l.Value, l.Reason = []byte(strings.Repeat("p", 999_800)), ReasonInvalidTopic
		}, "", "", map[string]string{HeaderHeadersOmitted: "true", HeaderPayloadOmitted: "true"}, []string{"trace_id"}},
		{"small payload, large headers, tight limit: only the headers go", func(l *Letter) {
			l.RowHeaders, l.MaxBytes = hdr("blob", strings.Repeat("h", 5000)), 4096
		}, "", `{"a":1}`, map[string]string{HeaderHeadersOmitted: "true"}, []string{HeaderPayloadOmitted}},
		{"long event_type and aggregate_type are bounded too", func(l *Letter) {
			l.Headers = hdr("event_id", "42", "event_type", strings.Repeat("e", 300), "aggregate_type", strings.Repeat("a", 200), "aggregate_id", "o-1")
		}, "", `{"a":1}`, map[string]string{"dlq.event_type_truncated": "300", "dlq.aggregate_type_truncated": "200",
			"event_type": string(BoundField([]byte(strings.Repeat("e", 300))))}, []string{HeaderKeyTruncated}},
		{"no limit: nothing dropped", func(l *Letter) {
			l.MaxBytes, l.RowHeaders = 0, hdr("blob", strings.Repeat("h", 2<<20))
		}, "", `{"a":1}`, map[string]string{"blob": strings.Repeat("h", 2<<20)}, []string{HeaderHeadersOmitted}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := base
			tt.mutate(&l)
			key, value, headers := l.Record(now)
			if want := tt.wantKey; (want == "" && string(key) != string(l.Key)) || (want != "" && string(key) != want) {
				t.Errorf("key %.80q (%d bytes), want %.80q", key, len(key), want)
			}
			if string(value) != tt.wantValue {
				t.Errorf("value %.80q (%d bytes), want %.80q", value, len(value), tt.wantValue)
			}
			got := map[string]string{}
			for _, h := range headers {
				if _, dup := got[string(h.Key)]; dup {
					t.Errorf("header %s twice", h.Key)
				}
				got[string(h.Key)] = string(h.Value)
			}
			for k, v := range tt.want {
				if g, ok := got[k]; !ok || g != v {
					t.Errorf("header %s = %.80q (present %v), want %.80q", k, g, ok, v)
				}
			}
			for _, k := range tt.absent {
				if _, ok := got[k]; ok {
					t.Errorf("header %s present, want absent", k)
				}
			}
			if len(l.Headers) > 0 && string(headers[0].Key) != "event_id" {
				t.Errorf("the event's own headers must come first, got %s", headers[0].Key)
			}
			if l.MaxBytes > 0 {
				fitsSarama(t, l.MaxBytes, key, value, headers)
			}
		})
	}
}

// fitsSarama checks a record against sarama's own size check, with room for
// a record batch around it.
func fitsSarama(t *testing.T, maxBytes int, key, value []byte, headers []sink.Header) {
	t.Helper()
	m := &sarama.ProducerMessage{Key: sarama.ByteEncoder(key), Value: sarama.ByteEncoder(value)}
	for _, h := range headers {
		m.Headers = append(m.Headers, sarama.RecordHeader(h))
	}
	if n := m.ByteSize(2); n+recordBatchOverhead > maxBytes {
		t.Errorf("record of %d bytes as sarama counts it (+%d batch) does not fit %d", n, recordBatchOverhead, maxBytes)
	}
	if n, own := m.ByteSize(2), RecordSize(key, value, headers); n != own {
		t.Errorf("RecordSize %d, sarama's ByteSize %d", own, n)
	}
}

// Whatever the event, its dead letter fits any max_message_bytes from 2048
// up: the worst case has the longest topic, table and relay header values.
func TestRecordAlwaysFits(t *testing.T) {
	long := func(c string, n int) string { return strings.Repeat(c, n) }
	worst := Letter{Table: long("s", 63) + "." + long("t", 63), ID: 1<<63 - 1, LSN: 1<<64 - 1, Topic: long("x", 249),
		Key: []byte(long("k", 1_500_000)), Value: []byte(long("p", 3_000_000)),
		Headers:    hdr("event_id", "9223372036854775807", "event_type", long("e", 5000), "aggregate_type", long("a", 5000), "aggregate_id", long("k", 1_500_000), "pg_lsn", "FFFFFFFF/FFFFFFFF"),
		RowHeaders: hdr("blob", long("h", 2<<20)), Reason: ReasonInvalidTopic, Err: long("é", 5000), Attempts: 100}
	for _, maxBytes := range []int{2048, 4096, 65536, 1000000, 1048588} {
		for _, tooLarge := range []bool{false, true} {
			l := worst
			l.MaxBytes, l.TooLarge = maxBytes, tooLarge
			key, value, headers := l.Record(time.Now())
			fitsSarama(t, maxBytes, key, value, headers)
			for _, h := range headers {
				if !utf8.Valid(h.Value) {
					t.Errorf("max %d: header %s is not valid UTF-8 after cutting", maxBytes, h.Key)
				}
			}
		}
	}
}

func TestBoundField(t *testing.T) {
	short := []byte(strings.Repeat("a", MaxField))
	if got := BoundField(short); string(got) != string(short) {
		t.Errorf("a %d-byte value was changed", MaxField)
	}
	long := []byte(strings.Repeat("a", 55) + "é" + strings.Repeat("b", 1000)) // é straddles byte 56
	got := BoundField(long)
	sum := sha256.Sum256(long)
	want := strings.Repeat("a", 55) + "~sha256:" + hex.EncodeToString(sum[:])
	if string(got) != want || len(got) > MaxField || !utf8.Valid(got) {
		t.Errorf("BoundField = %q (%d bytes), want %q", got, len(got), want)
	}
	if string(BoundField(long)) != string(got) {
		t.Error("BoundField is not stable for the same value")
	}
	other := append([]byte(nil), long...)
	other[len(other)-1] = 'c'
	if string(BoundField(other)) == string(got) {
		t.Error("two values with the same prefix bound to the same key")
	}
	full := []byte(strings.Repeat("z", 129))
	if g := BoundField(full); len(g) != MaxField || string(g[:56]) != strings.Repeat("z", 56) {
		t.Errorf("BoundField of 129 bytes = %q (%d bytes), want 56 bytes of prefix and the hash, %d in all", g, len(g), MaxField)
	}
}

func TestTruncate(t *testing.T) {
	long := strings.Repeat("é", maxErrorText) // 2 bytes each: a cut can land inside one
	got := Truncate(long)
	if len(got) > maxErrorText+3 || !strings.HasSuffix(got, "...") || !utf8.ValidString(got) {
		t.Errorf("Truncate: %d bytes, valid UTF-8 %v", len(got), utf8.ValidString(got))
	}
	if Truncate("short") != "short" {
		t.Error("short text changed")
	}
}

// Every header a dead letter adds is reserved, so no row can forge one.
func TestHeadersAreReserved(t *testing.T) {
	for _, k := range []string{HeaderOriginalTopic, HeaderReason, HeaderError, HeaderAttempts, HeaderSourceLSN,
		HeaderTable, HeaderEventID, HeaderPayloadOmitted, HeaderFailedAt} {
		if !outboxschema.ReservedHeader(k) {
			t.Errorf("dead-letter header %s is not reserved (outboxschema.ReservedHeader)", k)
		}
	}
}

// A message event's dead letter names the envelope's id (bounded like the
// relay's headers) and the prefix, and no table; a row's has no prefix.
func TestMessageLetter(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	longID := strings.Repeat("i", 300)
	tests := []struct {
		name string
		l    Letter
		want map[string]string // header -> value; "<absent>" for none
	}{
		{"message", Letter{EventID: "0193b5b8-7d3c-7c1e-9a51-2f9e0c4b1d27", Prefix: "orders-outbox", LSN: 0x16B3F28, Reason: ReasonBadMessage},
			map[string]string{HeaderEventID: "0193b5b8-7d3c-7c1e-9a51-2f9e0c4b1d27", HeaderMessagePrefix: "orders-outbox", HeaderTable: "",
				HeaderReason: "bad_message", HeaderSourceLSN: "0/16B3F28"}},
		{"message without a readable id", Letter{Prefix: "p"}, map[string]string{HeaderEventID: "", HeaderMessagePrefix: "p"}},
		{"message with a long id", Letter{EventID: longID, Prefix: "p"}, map[string]string{HeaderEventID: string(BoundField([]byte(longID)))}},
		{"row", Letter{Table: "public.outbox", ID: 42}, map[string]string{HeaderEventID: "42", HeaderTable: "public.outbox", HeaderMessagePrefix: "<absent>"}},
	}
	for _, tt := range tests {
		_, _, hs := tt.l.Record(now)
		got := map[string]string{}
		for _, h := range hs {
			got[string(h.Key)] = string(h.Value)
		}
		for k, v := range tt.want {
			g, ok := got[k]
			if v == "<absent>" {
				if ok {
					t.Errorf("%s: header %s = %q, want none", tt.name, k, g)
				}
				continue
			}
			if !ok || g != v {
				t.Errorf("%s: header %s = %q (present %v), want %q", tt.name, k, g, ok, v)
			}
		}
	}
}

// A dead letter the dead-letter topic refused for its size is cut down by
// the same steps as ever, one more at a time, only where a step makes the
// record smaller: the row's headers, the payload, dlq.error cut short,
// dlq.error dropped; then nothing is left and Shrink says so.
func TestShrink(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	longErr := strings.Repeat("e", 1500)
	tests := []struct {
		name  string
		l     Letter
		steps []string // what each Shrink leaves: r (row headers), v (payload), e (error: full, short or none)
	}{
		{"everything to drop", Letter{RowHeaders: hdr("trace_id", strings.Repeat("t", 500)), Value: []byte(strings.Repeat("v", 5000)), Err: longErr},
			[]string{"v e=full", "e=full", "e=short", "e=none"}},
		{"row headers smaller than their note: skipped", Letter{RowHeaders: hdr("t", "1"), Value: []byte(strings.Repeat("v", 5000)), Err: longErr},
			[]string{"e=full", "e=short", "e=none"}},
		{"too large already: no payload, no row headers", Letter{RowHeaders: hdr("t", "1"), Value: []byte(strings.Repeat("v", 5000)), Err: longErr, TooLarge: true},
			[]string{"e=short", "e=none"}},
		{"short error: dropped at once", Letter{Value: []byte(strings.Repeat("v", 5000)), Err: "kafka server: invalid record"},
			[]string{"e=full", "e=none"}},
		{"a message's payload is its only copy: kept", Letter{Prefix: "outbox", EventID: "42", RowHeaders: hdr("trace_id", strings.Repeat("t", 500)),
			Value: []byte(strings.Repeat("v", 5000)), Err: longErr},
			[]string{"v e=full", "v e=short", "v e=none"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := tt.l
			l.Table, l.ID, l.Topic, l.Key, l.Headers, l.Reason, l.Attempts, l.MaxBytes, l.At =
				"public.outbox", 42, "outbox.event.order", []byte("o-1"), own("o-1"), "invalid_record", 1, 1000000, now
			k, v, h := l.Record(now)
			size := RecordSize(k, v, h)
			for i, want := range tt.steps {
				if !l.Shrink(size) {
					t.Fatalf("step %d: Shrink said nothing is left, want %q", i+1, want)
				}
				k, v, h = l.Record(l.At)
				next := RecordSize(k, v, h)
				if next >= size {
					t.Fatalf("step %d: %d bytes after %d", i+1, next, size)
				}
				size = next
				hd := map[string]string{}
				for _, x := range h {
					hd[string(x.Key)] = string(x.Value)
				}
				var got []string
				if _, ok := hd["trace_id"]; ok {
					got = append(got, "r")
				} else if _, ok := hd["t"]; ok {
					got = append(got, "r")
				}
				if v != nil {
					got = append(got, "v")
				}
				switch e := hd[HeaderError]; {
				case e == "":
					got = append(got, "e=none")
				case len(e) < len(Truncate(l.Err)):
					got = append(got, "e=short")
				default:
					got = append(got, "e=full")
				}
				if g := strings.Join(got, " "); g != want {
					t.Errorf("step %d leaves %q, want %q", i+1, g, want)
				}
				if hd[HeaderFailedAt] != now.Format(time.RFC3339Nano) || hd[HeaderEventID] != "42" || string(k) != "o-1" {
					t.Errorf("step %d changed what identifies the event: %v key %q", i+1, hd, k)
				}
			}
			if l.Shrink(size) {
				t.Errorf("Shrink after the least letter said there is more to drop")
			}
		})
	}
}
