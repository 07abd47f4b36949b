package record

import (
	"time"

	"github.com/outbox-relay/outbox-relay/backoff"
	"github.com/outbox-relay/outbox-relay/fault"
)

// Policy says what happens to an event that can never be published as it
// is (config on_poison and dead_letter.*).
type Policy struct {
	Halt         bool          // on_poison: halt; false is dlq
	Topic        string        // the dead-letter topic
	MaxAttempts  int           // publish attempts before the policy applies
	Backoff      time.Duration // first wait between attempts of a poison event
	TransientMax time.Duration // cap of the wait between attempts of a transient error
	// MaxMessageBytes is kafka.max_message_bytes: every dead letter is cut
	// to fit it (deadletter.Letter.Record), so writing one never fails for
	// its size. Zero means no limit (tests).
	MaxMessageBytes int
	// Format is the record format (FormatOwn or FormatDebezium): which of
	// a record's headers are the relay's own in its dead letter.
	Format string
}

// Failure is one failed attempt as the poison decision sees it.
type Failure struct {
	Kind       fault.Kind
	Attempts   int  // failed attempts so far, this one included
	DeadLetter bool // the failed record was the event's dead letter
	// Permanent: the row itself cannot become a record (a bad row, a topic
	// the template cannot name). Its WAL bytes never change, so no attempt
	// can succeed and none is made.
	Permanent bool
	// Certain: the broker's (or the client's) refusal of the record cannot
	// change on retry (sink.Certain: too large or invalid, alone in its
	// batch; no write access to its topic). The policy applies at this
	// first answer: no attempt loop, no rewind to publish it again.
	Certain bool
}

// Action is what the pipeline does about a Failure.
type Action int

const (
	// RetryTransient requeues the event with the transient backoff, for
	// ever: the broker is expected to recover.
	RetryTransient Action = iota
	// RetryPoison requeues it with the poison backoff: a rejection may be
	// a fluke, so it gets Policy.MaxAttempts attempts.
	RetryPoison
	// DeadLetter sends the event to the dead-letter topic.
	DeadLetter
	// Halt stops publishing and holds the slot before the event.
	Halt
)

// String names the action: retry_transient, retry_poison, dead_letter, halt.
func (a Action) String() string {
	return [...]string{"retry_transient", "retry_poison", "dead_letter", "halt"}[a]
}

// Decide is the poison decision: a pure function of the failure and the
// policy. A poison failure is retried up to Policy.MaxAttempts unless it is
// Certain. Transient errors never end in a dead letter; a dead letter that
// cannot be written and a refusal of the relay's own rights always halt
// (dead-lettering would empty the outbox into the DLQ).
func Decide(f Failure, p Policy) Action {
	switch {
	case f.Permanent && p.Halt:
		return Halt
	case f.Permanent:
		return DeadLetter
	case f.Kind == fault.Transient:
		return RetryTransient
	case f.DeadLetter, f.Kind == fault.Refused:
		return Halt
	case f.Attempts < p.MaxAttempts && !f.Certain:
		return RetryPoison
	case p.Halt:
		return Halt
	}
	return DeadLetter
}

// Delay is the wait before the next attempt after a failure Decide answered
// with a, the attempts-th failure (0 for anything but a retry).
func (p Policy) Delay(a Action, attempts int) time.Duration {
	switch a {
	case RetryTransient:
		return backoff.Policy{Initial: transientFirst, Max: p.TransientMax}.Delay(attempts)
	case RetryPoison:
		return backoff.Policy{Initial: p.Backoff, Max: time.Minute}.Delay(attempts)
	}
	return 0
}

// transientFirst is the first backoff of a transient error, as sarama's own.
const transientFirst = 100 * time.Millisecond
