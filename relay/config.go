package relay

import (
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/outbox-relay/outbox-relay/cloudevents"
	"github.com/outbox-relay/outbox-relay/encode"
	"github.com/outbox-relay/outbox-relay/exactlyonce"
	"github.com/outbox-relay/outbox-relay/record"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/retention"
	"github.com/outbox-relay/outbox-relay/serialize"
	"github.com/outbox-relay/outbox-relay/sink"
)

// Config is the relay's configuration, every package's part composed. The
// command loads it from a YAML file, OUTBOX_RELAY_* environment variables
// and flags (cmd/outbox-relay); the yaml tags are the documented keys.
type Config struct {
	Postgres    replication.Config          `yaml:"postgres"`
	Kafka       sink.Config                 `yaml:"kafka"`
	InFlight    InFlightConfig              `yaml:"inflight"`
	OnPoison    string                      `yaml:"on_poison"`
	DeadLetter  DeadLetterConfig            `yaml:"dead_letter"`
	Leader      LeaderConfig                `yaml:"leader"`
	Heartbeat   replication.HeartbeatConfig `yaml:"heartbeat"`
	Retention   retention.Config            `yaml:"retention"`
	Messages    MessagesConfig              `yaml:"messages"`
	MetricsAddr string                      `yaml:"metrics_addr"`
	Pprof       bool                        `yaml:"pprof"`
	// ShutdownTimeout is the one shutdown deadline: from SIGTERM (or
	// Close) to the end of Run, drain included; see Relay.Run.
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout"`
	// MaxUnackedAge makes the leader not ready (/readyz 503) while its
	// oldest event published and not yet acked by Kafka is older than this.
	MaxUnackedAge time.Duration `yaml:"max_unacked_age"`
	// Delivery is at_least_once (the default) or exactly_once: Kafka
	// transactions aligned to PostgreSQL transactions (docs/guarantees.md).
	Delivery    string             `yaml:"delivery"`
	ExactlyOnce exactlyonce.Config `yaml:"exactly_once"`
	// Compat is the record format and the default column mapping:
	// record.FormatOwn ("") or record.FormatDebezium ("debezium").
	Compat string `yaml:"compat"`
	// Columns maps the columns of postgres.table (ColumnsConfig).
	Columns ColumnsConfig `yaml:"columns"`
	// Tables lists several outbox tables instead of postgres.table and
	// columns (file only).
	Tables []TableConfig `yaml:"tables"`
	// Serialization is the value format of every topic (encode.Config):
	// json (the payload as it is), json_schema, avro or protobuf, the last
	// three in the Schema Registry wire format; SerializationTopics
	// overrides it per topic (file only).
	Serialization       string                   `yaml:"serialization"`
	SerializationTopics map[string]string        `yaml:"serialization_topics"`
	SchemaRegistry      serialize.RegistryConfig `yaml:"schema_registry"`
	// Envelope is none or cloudevents (CloudEvents 1.0, CloudEvents).
	Envelope    string             `yaml:"envelope"`
	CloudEvents cloudevents.Config `yaml:"cloudevents"`
}

// Encoding is the formats part of c, for encode.New.
func (c Config) Encoding() encode.Config {
	return encode.Config{Serialization: c.Serialization, Topics: c.SerializationTopics, Registry: c.SchemaRegistry,
		Envelope: c.Envelope, CloudEvents: c.CloudEvents}
}

// Delivery modes (config delivery).
const (
	AtLeastOnce = "at_least_once"
	ExactlyOnce = "exactly_once"
)

// TxnID is the transactional id: exactly_once.transactional_id, or
// outbox-relay-<slot>.
func (c Config) TxnID() string { return c.ExactlyOnce.ID(c.Postgres.Slot) }

// InFlightConfig bounds events published but not yet acked by Kafka.
type InFlightConfig struct {
	MaxEvents int   `yaml:"max_events"`
	MaxBytes  int64 `yaml:"max_bytes"`
}

// DeadLetterConfig is where and when poison events are dead-lettered
// (on_poison: dlq).
type DeadLetterConfig struct {
	Topic        string        `yaml:"topic"`
	MaxAttempts  int           `yaml:"max_attempts"`
	RetryBackoff time.Duration `yaml:"retry_backoff"`
}

// MessagesConfig is the table-less outbox (docs/message-outbox.md).
type MessagesConfig struct {
	// Prefix: transactional logical decoding messages with exactly this
	// prefix (pg_logical_emit_message(true, prefix, envelope)) are
	// published as events, in commit order with the outbox rows. "" (the
	// default) turns message events off. Needs PostgreSQL 14+.
	Prefix string `yaml:"prefix"`
}

// heartbeatNamespace starts every relay's heartbeat prefix
// (replication.HeartbeatPrefix): a messages.prefix there would take another
// relay's heartbeats for events, and refuse them as non-transactional.
const heartbeatNamespace = "outbox-relay"

// Validate names the key under prefix (e.g. "messages."). slot is
// postgres.slot, for the error.
func (c MessagesConfig) Validate(prefix, slot string) error {
	p := c.Prefix
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%sprefix: %q %s", prefix, p, fmt.Sprintf(format, a...))
	}
	switch {
	case p == "":
		return nil
	case p == heartbeatNamespace || strings.HasPrefix(p, heartbeatNamespace+"/"):
		return bad("clashes with the relays' heartbeat messages (%s, outbox-relay/<slot> for any other relay): choose another prefix, e.g. orders-outbox",
			replication.HeartbeatPrefix(slot))
	case !utf8.ValidString(p) || strings.ContainsFunc(p, func(r rune) bool { return r < ' ' || r == 0x7f }):
		return bad("must be printable UTF-8 text without control characters, e.g. orders-outbox")
	case len(p) > 255:
		return bad("is %d bytes: use at most 255", len(p))
	}
	return nil
}

// LeaderConfig is the leader election among instances with the same slot.
type LeaderConfig struct {
	Enabled       bool          `yaml:"enabled"`
	LeaseTTL      time.Duration `yaml:"lease_ttl"`
	RenewInterval time.Duration `yaml:"renew_interval"`
	PollInterval  time.Duration `yaml:"poll_interval"`
	// InstanceID names this instance in the lease; default host-pid.
	InstanceID string `yaml:"instance_id"`
}

// DefaultConfig returns the documented defaults.
func DefaultConfig() Config {
	return Config{
		Postgres:        replication.DefaultConfig(),
		Kafka:           sink.DefaultConfig(),
		InFlight:        InFlightConfig{MaxEvents: 10000, MaxBytes: 64 << 20},
		OnPoison:        "dlq",
		DeadLetter:      DeadLetterConfig{Topic: "outbox.dlq", MaxAttempts: 5, RetryBackoff: 500 * time.Millisecond},
		Leader:          LeaderConfig{Enabled: true, LeaseTTL: 10 * time.Second, RenewInterval: time.Second, PollInterval: time.Second},
		Heartbeat:       replication.DefaultHeartbeatConfig(),
		Retention:       retention.DefaultConfig(),
		MetricsAddr:     ":9187",
		ShutdownTimeout: 30 * time.Second,
		MaxUnackedAge:   30 * time.Second,
		Delivery:        AtLeastOnce,
		ExactlyOnce:     exactlyonce.DefaultConfig(),
		Serialization:   serialize.JSON,
		SchemaRegistry: serialize.RegistryConfig{Timeout: serialize.DefaultTimeout, SubjectStrategy: serialize.TopicName,
			Key: serialize.KeyRaw, CacheTTL: serialize.DefaultCacheTTL},
		Envelope:    encode.EnvelopeNone,
		CloudEvents: cloudevents.DefaultConfig(),
	}
}

// Policy is the poison policy of c (on_poison, dead_letter.*, and the
// kafka.* bounds it needs), the same for the pipeline and outbox-relay
// replay; the pipeline sets its Format (compat).
func (c Config) Policy() record.Policy {
	return record.Policy{Halt: c.OnPoison == "halt", Topic: c.DeadLetter.Topic, MaxAttempts: c.DeadLetter.MaxAttempts,
		Backoff: c.DeadLetter.RetryBackoff, TransientMax: c.Kafka.RetryBackoffMax, MaxMessageBytes: c.Kafka.MaxMessageBytes}
}

// Validate reports every invalid key by name.
func (c Config) Validate() error {
	errs := []error{c.Postgres.Validate("postgres."), c.Kafka.Validate("kafka."), c.Heartbeat.Validate("heartbeat."), c.Retention.Validate("retention."),
		c.Messages.Validate("messages.", c.Postgres.Slot)}
	if c.InFlight.MaxEvents < 1 {
		errs = append(errs, fmt.Errorf("inflight.max_events: %d must be at least 1 (default 10000)", c.InFlight.MaxEvents))
	}
	if c.InFlight.MaxBytes < 1024 {
		errs = append(errs, fmt.Errorf("inflight.max_bytes: %d must be at least 1024 (default 67108864)", c.InFlight.MaxBytes))
	}
	if c.OnPoison != "dlq" && c.OnPoison != "halt" {
		errs = append(errs, fmt.Errorf("on_poison: %q is not dlq (dead-letter the event and go on) or halt (stop publishing, keep the slot)", c.OnPoison))
	}
	if err := sink.ValidTopic(c.DeadLetter.Topic); err != nil {
		errs = append(errs, fmt.Errorf("dead_letter.topic: %w (default outbox.dlq)", err))
	}
	if c.DeadLetter.MaxAttempts < 1 || c.DeadLetter.MaxAttempts > 100 {
		errs = append(errs, fmt.Errorf("dead_letter.max_attempts: %d is out of range: use 1..100 (default 5)", c.DeadLetter.MaxAttempts))
	}
	if c.DeadLetter.RetryBackoff < 10*time.Millisecond || c.DeadLetter.RetryBackoff > time.Minute {
		errs = append(errs, fmt.Errorf("dead_letter.retry_backoff: %s is out of range: use 10ms..1m (default 500ms)", c.DeadLetter.RetryBackoff))
	}
	if c.Leader.RenewInterval < 100*time.Millisecond {
		errs = append(errs, fmt.Errorf("leader.renew_interval: %s is too short: use at least 100ms (default 1s)", c.Leader.RenewInterval))
	}
	if c.Leader.LeaseTTL < 2*c.Leader.RenewInterval || c.Leader.LeaseTTL > 5*time.Minute {
		errs = append(errs, fmt.Errorf("leader.lease_ttl: %s must be between twice leader.renew_interval (%s) and 5m (default 10s)", c.Leader.LeaseTTL, 2*c.Leader.RenewInterval))
	}
	if c.Leader.PollInterval < 100*time.Millisecond || c.Leader.PollInterval > time.Minute {
		errs = append(errs, fmt.Errorf("leader.poll_interval: %s must be between 100ms and 1m (default 1s)", c.Leader.PollInterval))
	}
	if len(c.Leader.InstanceID) > 128 || strings.ContainsFunc(c.Leader.InstanceID, func(r rune) bool { return r < ' ' || r == 0x7f }) {
		errs = append(errs, fmt.Errorf("leader.instance_id: %q must be at most 128 printable characters (default host-pid)", c.Leader.InstanceID))
	}
	if c.MetricsAddr != "" && !strings.Contains(c.MetricsAddr, ":") {
		errs = append(errs, fmt.Errorf("metrics_addr: %q is not host:port or :port", c.MetricsAddr))
	}
	if c.ShutdownTimeout < time.Second || c.ShutdownTimeout > time.Hour {
		errs = append(errs, fmt.Errorf("shutdown_timeout: %s is out of range: use 1s..1h (default 30s; keep it %s below the orchestrator's grace period)", c.ShutdownTimeout, ExitMargin))
	}
	if c.MaxUnackedAge < time.Second || c.MaxUnackedAge > time.Hour {
		errs = append(errs, fmt.Errorf("max_unacked_age: %s is out of range: use 1s..1h (default 30s)", c.MaxUnackedAge))
	}
	// exactly_once.* are checked in either mode (they have valid defaults);
	// only their bound by inflight.max_events waits for delivery: exactly_once.
	maxBatch := c.ExactlyOnce.MaxBatchEvents
	if c.Delivery == ExactlyOnce {
		maxBatch = c.InFlight.MaxEvents
	}
	errs = append(errs, c.ExactlyOnce.Validate(maxBatch))
	switch c.Delivery {
	case AtLeastOnce, ExactlyOnce:
	default:
		errs = append(errs, fmt.Errorf("delivery: %q is not at_least_once (the default) or exactly_once (Kafka transactions; consumers must read with isolation.level=read_committed)", c.Delivery))
	}
	errs = append(errs, c.Encoding().Validate())
	if c.Envelope == encode.EnvelopeCloudEvents && c.Compat == record.FormatDebezium {
		errs = append(errs, errors.New("envelope: cloudevents cannot wrap compat: debezium records (Debezium's consumers expect its own record): use one or the other"))
	}
	if errs[0] == nil { // postgres.table parsed: resolve the tables and their mappings
		if _, err := c.Outboxes(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
