package replay

import (
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/rs/zerolog"

	"github.com/outbox-relay/outbox-relay/outboxschema"
	"github.com/outbox-relay/outbox-relay/record"
	"github.com/outbox-relay/outbox-relay/sink"
)

// Issue 36 in replay: a refusal that cannot change on retry dead-letters
// the row at the first answer, and a dead letter the dead-letter topic
// refuses for its size is cut down and sent again; only the least one
// refused halts, naming the topic's limit.
func TestReplayVerdicts(t *testing.T) {
	big := strings.Repeat("x", 5000)
	tests := []struct {
		name    string
		answers []error // the broker's answers, in turn
		letter  bool    // the row is being dead-lettered after the last answer
		value   bool    // its record still has the payload
		halted  string  // the halt's error says this ("" = not halted)
	}{
		{"refused in a batch: retried", []error{sarama.ErrInvalidRecord}, false, true, ""},
		{"refused alone: dead letter at once", []error{&sink.SoleError{Err: sarama.ErrInvalidRecord}}, true, true, ""},
		{"dead letter too large: cut down", []error{&sink.SoleError{Err: sarama.ErrInvalidRecord}, &sink.SoleError{Err: sarama.ErrMessageSizeTooLarge}}, true, false, ""},
		{"least dead letter too large: halt", []error{&sink.SoleError{Err: sarama.ErrInvalidRecord},
			sarama.ErrMessageSizeTooLarge, sarama.ErrMessageSizeTooLarge, sarama.ErrMessageSizeTooLarge},
			true, false, "raise max.message.bytes of topic outbox.dlq"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &Replayer{policy: record.Policy{Topic: "outbox.dlq", MaxAttempts: 3, Backoff: time.Millisecond},
				log: zerolog.Nop(), retries: make(chan retry, 10), stop: func() {}, budget: newBudget(10, 1<<20)}
			tbl, err := outboxschema.ParseTable("public.outbox")
			if err != nil {
				t.Fatal(err)
			}
			r.table = tbl
			it := &item{r: r, id: 42, msg: sink.Message{Topic: "outbox.event.order", Key: []byte("o-1"), Value: []byte(big)}}
			for _, err := range tt.answers {
				it.done(err)
			}
			if (it.letter != nil) != tt.letter || (it.msg.Value != nil) != tt.value {
				t.Errorf("letter %v, value kept %v; want %v, %v", it.letter != nil, it.msg.Value != nil, tt.letter, tt.value)
			}
			r.errMu.Lock()
			defer r.errMu.Unlock()
			switch {
			case tt.halted == "" && len(r.errs) > 0:
				t.Errorf("halted: %v", r.errs)
			case tt.halted != "" && (len(r.errs) == 0 || !strings.Contains(r.errs[0].Error(), tt.halted)):
				t.Errorf("halt errors %v, want one saying %q", r.errs, tt.halted)
			}
		})
	}
}
