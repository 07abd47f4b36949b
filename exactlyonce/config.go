package exactlyonce

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/outbox-relay/outbox-relay/sink"
)

// Config is the Kafka transaction batching and checkpoint of delivery:
// exactly_once (the exactly_once.* keys).
type Config struct {
	// MaxBatchEvents closes a Kafka transaction before the next PostgreSQL
	// transaction would take it past this many events.
	MaxBatchEvents int `yaml:"max_batch_events"`
	// MaxBatchInterval closes a Kafka transaction this long after it opened
	// (at the next PostgreSQL transaction boundary).
	MaxBatchInterval time.Duration `yaml:"max_batch_interval"`
	// MaxBatchIdle commits a Kafka transaction once no WAL message arrived
	// for this long and no commit is in flight: a quiet stream is visible
	// in milliseconds, a draining one still fills batches (0: off, batches
	// close by size and age only).
	MaxBatchIdle time.Duration `yaml:"max_batch_idle"`
	// CheckpointTopic is the compacted topic of the checkpoint records.
	CheckpointTopic string `yaml:"checkpoint_topic"`
	// TransactionTimeout is transaction.timeout.ms of the producer.
	TransactionTimeout time.Duration `yaml:"transaction_timeout"`
	// TransactionalID defaults to outbox-relay-<slot> (ID).
	TransactionalID string `yaml:"transactional_id"`
}

// DefaultConfig returns the documented defaults.
func DefaultConfig() Config {
	return Config{MaxBatchEvents: 5000, MaxBatchInterval: 100 * time.Millisecond, MaxBatchIdle: time.Millisecond,
		CheckpointTopic: "outbox-relay.checkpoints", TransactionTimeout: time.Minute}
}

// ID is the transactional id: TransactionalID, or outbox-relay-<slot>.
func (c Config) ID(slot string) string {
	if c.TransactionalID != "" {
		return c.TransactionalID
	}
	return "outbox-relay-" + slot
}

// Validate names every invalid exactly_once.* key. maxBatch bounds
// max_batch_events: inflight.max_events when delivery is exactly_once (a
// Kafka transaction's events are all in flight until its commit).
func (c Config) Validate(maxBatch int) error {
	var errs []error
	if c.MaxBatchEvents < 1 || c.MaxBatchEvents > maxBatch {
		errs = append(errs, fmt.Errorf("exactly_once.max_batch_events: %d must be between 1 and inflight.max_events (%d) (default 5000)", c.MaxBatchEvents, maxBatch))
	}
	if c.MaxBatchInterval < time.Millisecond || c.MaxBatchInterval > time.Minute {
		errs = append(errs, fmt.Errorf("exactly_once.max_batch_interval: %s is out of range: use 1ms..1m (default 100ms)", c.MaxBatchInterval))
	} else if c.MaxBatchIdle < 0 || c.MaxBatchIdle > c.MaxBatchInterval {
		errs = append(errs, fmt.Errorf("exactly_once.max_batch_idle: %s is out of range: use 0 (off)..exactly_once.max_batch_interval (%s) (default 1ms)", c.MaxBatchIdle, c.MaxBatchInterval))
	}
	if err := sink.ValidTopic(c.CheckpointTopic); err != nil {
		errs = append(errs, fmt.Errorf("exactly_once.checkpoint_topic: %w (default outbox-relay.checkpoints)", err))
	}
	if c.TransactionTimeout < time.Second || c.TransactionTimeout > 15*time.Minute {
		errs = append(errs, fmt.Errorf("exactly_once.transaction_timeout: %s is out of range: use 1s..15m, at most the brokers' transaction.max.timeout.ms (default 60s)", c.TransactionTimeout))
	}
	if len(c.TransactionalID) > 200 || strings.ContainsFunc(c.TransactionalID, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		errs = append(errs, fmt.Errorf("exactly_once.transactional_id: %q must be at most 200 printable characters without spaces (default outbox-relay-<slot>)", c.TransactionalID))
	}
	return errors.Join(errs...)
}
