package relay

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	pg "github.com/outbox-relay/outbox-relay/decoder/pgoutputtest"
	"github.com/outbox-relay/outbox-relay/record"
	"github.com/outbox-relay/outbox-relay/sink"
)

// newRoutedHarness is newHarness with a topic limit and an allowlist; the
// publisher acks everything.
func newRoutedHarness(t *testing.T, policy record.Policy, maxTopics int, allow ...string) *harness {
	t.Helper()
	al, err := sink.ParseAllowlist(allow)
	if err != nil {
		t.Fatal(err)
	}
	marker := &fakeMarker{marked: make(chan string, 10)}
	h := newHarnessWith(t, policy, func(string, int) error { return nil }, marker, func(c *PipelineConfig) {
		c.MaxTopics, c.Allowlist = maxTopics, al
	})
	h.marker = marker
	return h
}

func TestNewPipelineNeedsTopicLimit(t *testing.T) {
	tmpl, _ := sink.ParseTemplate("t")
	_, err := NewPipeline(PipelineConfig{Table: "public.outbox", Template: tmpl, Policy: fastPolicy,
		Limits: checkpoint.Limits{MaxEvents: 10, MaxBytes: 1 << 20}}, atLeastOnce{&scriptedPublisher{}}, &fakeMarker{}, zerolog.Nop(), nil)
	if err == nil || !strings.Contains(err.Error(), "kafka.max_topics") {
		t.Fatalf("NewPipeline without MaxTopics = %v, want an error naming kafka.max_topics", err)
	}
}

// An event over the topic limit or outside the allowlist is poison: under
// dlq it becomes a dead letter naming the topic it was refused, the rest
// of the transaction goes on and the watermark passes it; under halt
// nothing of the transaction is published.
func TestTopicLimitAndAllowlist(t *testing.T) {
	row := func(id, aggType string) []pg.Col {
		return pg.Row(id, aggType, "a-"+id, "e", `{"a":1}`, pg.Null)
	}
	t.Run("dlq", func(t *testing.T) {
		h := newRoutedHarness(t, fastPolicy, 1, "outbox.event.order", "outbox.event.pay*")
		if err := h.txn(100, 110, order("42", "o-1"), row("43", "payment"), row("44", "refund"), order("45", "o-2")); err != nil {
			t.Fatal(err)
		}
		marks := []string{h.waitMark(), h.waitMark()}
		slices.Sort(marks)
		if want := []string{"dead 2B attempts=1", "dead 2C attempts=1"}; !slices.Equal(marks, want) {
			t.Fatalf("row marks %q, want %q", marks, want)
		}
		h.waitFlushed(110)
		sent, _ := h.pub.snapshot()
		letters := map[string]map[string]string{}
		var events []string
		for _, m := range sent {
			if m.Topic != testDLQ {
				events = append(events, m.Topic+"/"+string(m.Key))
				continue
			}
			hd := map[string]string{}
			for _, x := range m.Headers {
				hd[string(x.Key)] = string(x.Value)
			}
			letters[hd["dlq.event_id"]] = hd
		}
		if want := []string{testTopic + "/o-1", testTopic + "/o-2"}; !slices.Equal(events, want) {
			t.Errorf("published %q, want %q", events, want)
		}
		for id, want := range map[string][]string{
			"43": {"topic_limit", "outbox.event.payment", "kafka.max_topics"},
			"44": {"topic_not_allowed", "outbox.event.refund", "kafka.topic_allowlist"},
		} {
			hd := letters[id]
			if hd["dlq.reason"] != want[0] || hd["dlq.original_topic"] != want[1] || !strings.Contains(hd["dlq.error"], want[2]) ||
				!strings.Contains(hd["dlq.error"], "id="+id) {
				t.Errorf("dead letter of id %s: reason %q, original topic %q, error %q; want %q, %q, naming %s",
					id, hd["dlq.reason"], hd["dlq.original_topic"], hd["dlq.error"], want[0], want[1], want[2])
			}
		}
	})
	t.Run("halt", func(t *testing.T) {
		policy := fastPolicy
		policy.Halt = true
		h := newRoutedHarness(t, policy, 1)
		ctx, cancel := context.WithCancel(h.ctx)
		errc := make(chan error, 1)
		go func() { errc <- h.txnCtx(ctx, 100, 110, order("42", "o-1"), row("43", "payment"), order("44", "o-2")) }()
		if got := h.waitMark(); got != "failed 2B attempts=1" {
			t.Fatalf("row mark %q", got)
		}
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Fatalf("Handle = %v, want context.Canceled", err)
		}
		if sent, _ := h.pub.snapshot(); len(sent) != 0 {
			t.Errorf("published %d records of a halted transaction", len(sent))
		}
		if err := h.p.Halted(); err == nil || !strings.Contains(err.Error(), "kafka.max_topics") || !strings.Contains(err.Error(), "outbox.event.payment") {
			t.Errorf("Halted() = %v, want the topic and kafka.max_topics", err)
		}
	})
}
