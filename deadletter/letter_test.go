package deadletter

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/IBM/sarama"

	"github.com/outbox-relay/outbox-relay/outboxschema"
)

func TestRecord(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	base := Letter{Table: "public.outbox", ID: 42, LSN: 0x16B3F28, Topic: "outbox.event.order", Key: []byte("o-1"),
		Value: []byte(`{"a":1}`), Headers: []sarama.RecordHeader{{Key: []byte("trace_id"), Value: []byte("t-1")}},
		Reason: "broker_rejected", Err: "kafka server: invalid record", Attempts: 5}
	tests := []struct {
		name      string
		mutate    func(*Letter)
		wantValue string
		want      map[string]string
		absent    []string
	}{
		{"with payload", func(*Letter) {}, `{"a":1}`, map[string]string{
			"trace_id": "t-1", HeaderOriginalTopic: "outbox.event.order", HeaderReason: "broker_rejected",
			HeaderError: "kafka server: invalid record", HeaderAttempts: "5", HeaderSourceLSN: "0/16B3F28",
			HeaderTable: "public.outbox", HeaderEventID: "42", HeaderFailedAt: "2026-01-02T03:04:05Z"},
			[]string{HeaderPayloadOmitted}},
		{"too large: payload omitted", func(l *Letter) { l.OmitPayload, l.Reason = true, "message_too_large" }, "",
			map[string]string{HeaderPayloadOmitted: "true", HeaderReason: "message_too_large"}, nil},
		{"unrouted: empty original topic", func(l *Letter) { l.Topic, l.Reason = "", ReasonInvalidTopic }, `{"a":1}`,
			map[string]string{HeaderOriginalTopic: "", HeaderReason: ReasonInvalidTopic}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := base
			tt.mutate(&l)
			value, headers := l.Record(now)
			if string(value) != tt.wantValue {
				t.Errorf("value %q, want %q", value, tt.wantValue)
			}
			got := map[string]string{}
			for _, h := range headers {
				got[string(h.Key)] = string(h.Value)
			}
			for k, v := range tt.want {
				if g, ok := got[k]; !ok || g != v {
					t.Errorf("header %s = %q (present %v), want %q", k, g, ok, v)
				}
			}
			for _, k := range tt.absent {
				if _, ok := got[k]; ok {
					t.Errorf("header %s present, want absent", k)
				}
			}
			if string(headers[0].Key) != "trace_id" {
				t.Errorf("the event's own headers must come first, got %s", headers[0].Key)
			}
		})
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
