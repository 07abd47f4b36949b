package replay

import (
	"errors"
	"time"

	"github.com/outbox-relay/outbox-relay/record"
	"github.com/outbox-relay/outbox-relay/sink"
)

// Config is what a replay takes from the relay's configuration: the same
// table, the same producer and routing, the same poison policy, so that a
// replayed row is the record the relay would have written. The command
// builds it from the relay's configuration after validating all of it
// (cmd/outbox-relay replay.go); replay does not import relay.
type Config struct {
	PostgresURL string // postgres.url
	Table       string // postgres.table: the relay's own table (schema.table)
	// Kafka is kafka.*: the producer, and the routing of the relay
	// (topic_template, max_topics, topic_allowlist).
	Kafka sink.Config
	// Policy is the relay's poison policy (on_poison, dead_letter.*,
	// kafka.retry_backoff_max, kafka.max_message_bytes).
	Policy record.Policy
	// MaxEvents and MaxBytes bound the rows in flight (inflight.*).
	MaxEvents int
	MaxBytes  int64
	// ShutdownTimeout bounds the wait for acks once Run's ctx ended
	// (shutdown_timeout).
	ShutdownTimeout time.Duration
}

// Validate reports what New cannot work with. The keys' own ranges are the
// relay configuration's to check; this guards the values replay divides,
// sizes or dials by.
func (c Config) Validate() error {
	errs := []error{c.Kafka.Validate("kafka.")}
	if c.PostgresURL == "" {
		errs = append(errs, errors.New("postgres.url: is required"))
	}
	if c.Policy.MaxAttempts < 1 || c.Policy.Topic == "" {
		errs = append(errs, errors.New("replay: poison policy needs a dead-letter topic (dead_letter.topic) and at least one attempt (dead_letter.max_attempts)"))
	}
	if c.MaxEvents < 1 || c.MaxBytes < 1 {
		errs = append(errs, errors.New("replay: inflight.max_events and inflight.max_bytes must be positive"))
	}
	return errors.Join(errs...)
}
