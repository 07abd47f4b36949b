// Package sink publishes outbox events to Kafka. Producer has two engines
// (kafka.producer): direct, the default, which takes metadata and producer
// ids from a sarama client and sends produce requests on connections of its
// own (direct.go, wire.go), and sarama, sarama's AsyncProducer. Both are
// idempotent with acks=all, one request in flight per broker and murmur2
// partitioning like the Java client. TxnProducer is the transactional
// producer of delivery: exactly_once. Router and Template name an event's
// topic; Classify says what a produce error means.
//
// The broker's verdict on a record comes back once, to its Message's Done
// or, with the direct engine and OnAcked, as part of an acked batch (see
// Message). sarama's types stay inside this package: a Message carries
// sink's own Header.
package sink

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/IBM/sarama"
)

// Config is the Kafka part of the relay's configuration.
type Config struct {
	Brokers []string `yaml:"brokers"`
	// ClientID is sent to the broker with every request.
	ClientID string `yaml:"client_id"`
	// TopicTemplate routes each event; {aggregate_type} and {event_type} are
	// replaced by the row's values. A template without placeholders is a
	// fixed topic.
	TopicTemplate string `yaml:"topic_template"`
	// AutoCreateTopics lets the relay's metadata requests create a topic
	// that does not exist (sarama's Metadata.AllowAutoTopicCreation; the
	// broker's auto.create.topics.enable must be on too). Off by default:
	// topics are created by the operator, not by whoever writes the outbox.
	AutoCreateTopics bool `yaml:"auto_create_topics"`
	// MissingTopicTimeout is how long the events of a topic that does not
	// exist wait for it (events of other topics go on meanwhile); then
	// they are poison, reason unknown_topic, and so is every later event
	// of that topic until it is created (looked up again every 10s).
	// Default 60s, the Java producer's max.block.ms.
	MissingTopicTimeout time.Duration `yaml:"missing_topic_timeout"`
	// TopicRefresh is how often each topic published to is looked up
	// again: its partition count (a change is reported and followed) and
	// its max.message.bytes. 1s..24h, default 5m.
	TopicRefresh time.Duration `yaml:"topic_refresh"`
	// MaxTopics is the most distinct topics events are published to (the
	// dead-letter topic not counted); an event routed to one more is
	// poison (dead-letter reason topic_limit). 1..100000, no unlimited.
	MaxTopics int `yaml:"max_topics"`
	// TopicAllowlist, when not empty, is the only topics events may be
	// published to: exact names, or prefixes ending in '*'. Any other is
	// poison (dead-letter reason topic_not_allowed).
	TopicAllowlist []string `yaml:"topic_allowlist"`
	// Producer is the produce engine: "direct" (default; "" too), the
	// relay's own (direct.go: sarama's client for metadata, its own
	// connections for produce requests, wire.go), or "sarama", sarama's
	// AsyncProducer. Both speak the same idempotent, acks=all protocol;
	// direct spares each record about six goroutine hand-offs (bench: 0.77x
	// the relay CPU per event in a 100-row drain, 0.74x at 1k events/s).
	// direct sends at once and batches while a request is in flight; it
	// ignores the flush settings.
	Producer string `yaml:"producer"`
	// Compression: none, gzip, snappy, lz4 or zstd.
	Compression string `yaml:"compression"`
	// FlushFrequency, FlushMessages and FlushBytes batch producer requests:
	// a batch goes out when any one is reached. All unset (the default):
	// sarama sends at once and batches while a request is in flight, which
	// in a drain makes batches as large as a linger would (bench: 0.98x and
	// 1.01x the drain throughput of a 1 ms linger, 100 and 1 rows/txn) and
	// at a low rate spares each event the linger (1k events/s: median
	// commit->consumer 0.04-0.17 ms above the minimal forwarder, against
	// 0.92-1.31 ms with 1 ms).
	FlushFrequency time.Duration `yaml:"flush_frequency"`
	FlushMessages  int           `yaml:"flush_messages"`
	FlushBytes     int           `yaml:"flush_bytes"`
	// MaxMessageBytes must not exceed the broker's message.max.bytes.
	MaxMessageBytes int `yaml:"max_message_bytes"`
	// Version is the Kafka protocol version to speak, e.g. 3.6.0.
	Version string `yaml:"version"`
	// RetryBackoffMax caps the exponential backoff between retries of a
	// failed produce; retries go on until the broker takes the batch.
	RetryBackoffMax time.Duration `yaml:"retry_backoff_max"`
	// RetryMax is how many times sarama retries one batch before it returns
	// the error (default 1000: about an hour with a 5s backoff cap); the
	// pipeline then requeues the events, so a transient error never stops
	// the relay.
	RetryMax int `yaml:"retry_max"`
	// SASL and TLS secure the broker connections.
	SASL SASLConfig `yaml:"sasl"`
	TLS  TLSConfig  `yaml:"tls"`
}

// DefaultConfig returns the defaults documented in the README.
func DefaultConfig() Config {
	return Config{
		ClientID:            "outbox-relay",
		TopicTemplate:       "outbox.event.{aggregate_type}",
		MaxTopics:           DefaultMaxTopics,
		Producer:            ProducerDirect,
		Compression:         "none",
		FlushFrequency:      0, // unset: see the field's comment
		FlushMessages:       0,
		FlushBytes:          0,
		MaxMessageBytes:     1000000,
		MissingTopicTimeout: 60 * time.Second,
		TopicRefresh:        describeRefresh,
		Version:             "3.6.0",
		RetryBackoffMax:     5 * time.Second,
		RetryMax:            1000,
	}
}

// The values of kafka.producer.
const (
	ProducerSarama = "sarama"
	ProducerDirect = "direct"
)

var compressions = map[string]sarama.CompressionCodec{
	"none": sarama.CompressionNone, "gzip": sarama.CompressionGZIP, "snappy": sarama.CompressionSnappy,
	"lz4": sarama.CompressionLZ4, "zstd": sarama.CompressionZSTD,
}

// Validate reports every invalid field, each named by its key under prefix.
func (c Config) Validate(prefix string) error {
	var errs []error
	bad := func(key, format string, a ...any) {
		errs = append(errs, fmt.Errorf("%s%s: %s", prefix, key, fmt.Sprintf(format, a...)))
	}
	if len(c.Brokers) == 0 {
		bad("brokers", "is empty; list at least one host:port (env OUTBOX_RELAY_KAFKA_BROKERS, comma-separated)")
	}
	for _, b := range c.Brokers {
		if i := strings.LastIndexByte(b, ':'); i <= 0 || i == len(b)-1 {
			bad("brokers", "%q is not host:port", b)
		}
	}
	if c.ClientID == "" {
		bad("client_id", "is empty")
	}
	tmpl, tmplErr := ParseTemplate(c.TopicTemplate)
	if tmplErr != nil {
		bad("topic_template", "%v", tmplErr)
	}
	if c.MaxTopics < 1 || c.MaxTopics > MaxMaxTopics {
		bad("max_topics", "%d is out of range: use 1..%d (default %d; there is no unlimited, use a large number)", c.MaxTopics, MaxMaxTopics, DefaultMaxTopics)
	}
	if allow, err := ParseAllowlist(c.TopicAllowlist); err != nil {
		bad("topic_allowlist", "%s (exact topic names or prefixes ending in *, comma-separated in env and flags)", strings.ReplaceAll(err.Error(), "\n", "; "))
	} else if tmplErr == nil && tmpl.fixed && !allow.Allows(c.TopicTemplate) {
		bad("topic_allowlist", "does not allow %q, the fixed topic of kafka.topic_template: every event would be dead-lettered", c.TopicTemplate)
	}
	if c.Producer != "" && c.Producer != ProducerSarama && c.Producer != ProducerDirect {
		bad("producer", "%q is not one of %s (default), %s", c.Producer, ProducerDirect, ProducerSarama)
	}
	if _, ok := compressions[c.Compression]; !ok {
		bad("compression", "%q is not one of none, gzip, snappy, lz4, zstd", c.Compression)
	}
	if c.FlushFrequency < 0 {
		bad("flush_frequency", "%s must not be negative (default 0s: unset)", c.FlushFrequency)
	}
	if c.FlushMessages < 0 {
		bad("flush_messages", "%d must not be negative (0 = off)", c.FlushMessages)
	}
	if c.FlushBytes < 0 {
		bad("flush_bytes", "%d must not be negative (0 = off)", c.FlushBytes)
	}
	if c.MissingTopicTimeout < time.Second || c.MissingTopicTimeout > 24*time.Hour {
		bad("missing_topic_timeout", "%s is out of range: use 1s..24h (default 60s)", c.MissingTopicTimeout)
	}
	if c.TopicRefresh < time.Second || c.TopicRefresh > 24*time.Hour {
		bad("topic_refresh", "%s is out of range: use 1s..24h (default 5m)", c.TopicRefresh)
	}
	if c.MaxMessageBytes < 1024 {
		bad("max_message_bytes", "%d is too small: use the broker's message.max.bytes (default 1000000)", c.MaxMessageBytes)
	}
	if _, err := sarama.ParseKafkaVersion(c.Version); err != nil {
		bad("version", "%q is not a Kafka version like 3.6.0", c.Version)
	} else if v, _ := sarama.ParseKafkaVersion(c.Version); !v.IsAtLeast(sarama.V0_11_0_0) {
		bad("version", "%q is too old: idempotent produce needs 0.11 or later", c.Version)
	}
	if c.RetryBackoffMax < 10*time.Millisecond {
		bad("retry_backoff_max", "%s is too short: use at least 10ms (default 5s)", c.RetryBackoffMax)
	}
	c.SASL.validate(bad)
	c.TLS.validate(bad)
	if c.RetryMax < 1 || c.RetryMax > 100000 {
		bad("retry_max", "%d is out of range: use 1..100000 (default 1000)", c.RetryMax)
	}
	if len(errs) == 0 {
		// What sarama itself would refuse, so a config that loads is one a
		// producer can be built from.
		if _, err := saramaConfig(c); err != nil {
			errs = append(errs, err) // its errors name their keys
		}
	}
	return errors.Join(errs...)
}
