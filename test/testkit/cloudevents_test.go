package testkit

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/outbox-relay/outbox-relay/cloudevents"
)

// fatalTB records Fatalf and ends the goroutine, as testing.T does.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Helper() {}
func (f *fatalTB) Fatalf(format string, a ...any) {
	f.msg = fmt.Sprintf(format, a...)
	runtime.Goexit()
}

func readCE(m *sarama.ConsumerMessage) string {
	f := &fatalTB{TB: &testing.T{}}
	done := make(chan struct{})
	go func() { defer close(done); ReadCloudEvent(f, m) }()
	<-done
	return f.msg
}

func TestReadCloudEvent(t *testing.T) {
	a := cloudevents.Attributes{ID: "1", Source: "/s", Type: "order.created", Subject: "ord_1", DataContentType: "application/json", Time: time.Unix(5, 0)}
	m := &sarama.ConsumerMessage{Topic: "t", Value: []byte(`{"a":1}`)}
	for _, h := range cloudevents.AppendHeaders(nil, a) {
		m.Headers = append(m.Headers, &sarama.RecordHeader{Key: h.Key, Value: h.Value})
	}
	e := ReadCloudEvent(t, m)
	if e.ID() != "1" || e.Type() != "order.created" || e.Subject() != "ord_1" || string(e.Data()) != `{"a":1}` || !e.Time().Equal(a.Time) {
		t.Errorf("%s", e)
	}
	for name, want := range map[string]string{
		"plain record":  "is not a CloudEvent",
		"no id":         "invalid CloudEvent",
		"bad structure": "read record t/0@0 as a CloudEvent",
	} {
		var r *sarama.ConsumerMessage
		switch name {
		case "plain record":
			r = &sarama.ConsumerMessage{Topic: "t", Value: []byte(`{}`), Headers: []*sarama.RecordHeader{{Key: []byte("event_id"), Value: []byte("1")}}}
		case "no id":
			r = &sarama.ConsumerMessage{Topic: "t", Headers: []*sarama.RecordHeader{{Key: []byte("ce_specversion"), Value: []byte("1.0")},
				{Key: []byte("ce_source"), Value: []byte("/s")}, {Key: []byte("ce_type"), Value: []byte("t")}}}
		case "bad structure":
			r = &sarama.ConsumerMessage{Topic: "t", Value: []byte(`{"specversion":`), Headers: []*sarama.RecordHeader{
				{Key: []byte("content-type"), Value: []byte(cloudevents.ContentTypeStructured)}}}
		}
		if got := readCE(r); !strings.Contains(got, want) {
			t.Errorf("%s: fatal %q, want %q", name, got, want)
		}
	}
}
