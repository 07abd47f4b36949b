package record

import (
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/deadletter"
	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/sink"
)

// Route: the topic of a good event; for a poison one the dead-letter
// reason, an error naming the event and the key to fix, and the refused
// topic when the router refused one.
func TestRoute(t *testing.T) {
	tmpl, err := sink.ParseTemplate("outbox.event.{aggregate_type}")
	if err != nil {
		t.Fatal(err)
	}
	allow, err := sink.ParseAllowlist([]string{"outbox.event.order", "outbox.event.pay*"})
	if err != nil {
		t.Fatal(err)
	}
	router, err := sink.NewRouter(tmpl, 1, allow, "outbox.dlq")
	if err != nil {
		t.Fatal(err)
	}
	row := func(id int64, aggType string) *decoder.Event {
		return &decoder.Event{ID: id, AggregateType: aggType, AggregateID: "a", EventType: "e"}
	}
	bad := &decoder.RowError{Table: "public.outbox", ID: 9}
	for _, tt := range []struct {
		name          string
		ev            *decoder.Event
		topic, reason string
		errHas        []string // "" err when empty
	}{
		{"routed", row(1, "order"), "outbox.event.order", "", nil},
		{"over the topic limit", row(2, "payment"), "outbox.event.payment", deadletter.ReasonTopicLimit, []string{"outbox row public.outbox id=2", "kafka.max_topics"}},
		{"not allowed", row(3, "refund"), "outbox.event.refund", deadletter.ReasonTopicNotAllowed, []string{"id=3", "kafka.topic_allowlist"}},
		{"invalid topic", row(4, "a b"), "", deadletter.ReasonInvalidTopic, []string{"id=4", "fix kafka.topic_template or the row"}},
		{"invalid topic of a text id", &decoder.Event{IDText: "u-1", AggregateType: "a b"}, "", deadletter.ReasonInvalidTopic, []string{`id="u-1"`}},
		{"invalid topic of a message", &decoder.Event{Source: decoder.SourceMessage, MessageID: "m-1", AggregateType: "a b"}, "", deadletter.ReasonInvalidTopic,
			[]string{`outbox message id="m-1"`, "or the message"}},
		{"bad row", &decoder.Event{Err: bad}, "", deadletter.ReasonBadRow, []string{}},
		{"bad message", &decoder.Event{Source: decoder.SourceMessage, Err: bad}, "", deadletter.ReasonBadMessage, []string{}},
		{"reserved header", &decoder.Event{Err: &decoder.RowError{Table: "public.outbox", ID: 9, ReservedHeader: "event_id"}}, "", deadletter.ReasonReservedHeader, []string{}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			topic, reason, err := Route(router, "public.outbox", tt.ev)
			if topic != tt.topic || reason != tt.reason || (err == nil) != (tt.errHas == nil) {
				t.Fatalf("Route = %q, %q, %v; want %q, %q, error %v", topic, reason, err, tt.topic, tt.reason, tt.errHas != nil)
			}
			if tt.ev.Err != nil && err != error(tt.ev.Err) {
				t.Errorf("error %v, want the row's own %v", err, tt.ev.Err)
			}
			for _, s := range tt.errHas {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not say %q", err, s)
				}
			}
		})
	}
}
