package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/replication"
)

// Config is the command's configuration: the relay's, plus logging. It is
// loaded from a YAML file (--config), then OUTBOX_RELAY_* environment
// variables, then flags, each overriding the last.
type Config struct {
	relay.Config `yaml:",inline"`
	Log          LogConfig `yaml:"log"`
}

// LogConfig selects the log level and format (json or console).
type LogConfig struct {
	Level  string `yaml:"level"`
	Format string `yaml:"format"`
}

// DefaultConfig returns the documented defaults.
func DefaultConfig() Config {
	return Config{Config: relay.DefaultConfig(), Log: LogConfig{Level: "info", Format: "json"}}
}

// Validate reports every invalid key by name.
func (c Config) Validate() error {
	errs := []error{c.Config.Validate()}
	switch c.Log.Level {
	case "trace", "debug", "info", "warn", "error":
	default:
		errs = append(errs, fmt.Errorf("log.level: %q is not one of trace, debug, info, warn, error", c.Log.Level))
	}
	if c.Log.Format != "json" && c.Log.Format != "console" {
		errs = append(errs, fmt.Errorf("log.format: %q is not json or console", c.Log.Format))
	}
	return errors.Join(errs...)
}

// key is one configuration key with its env and flag names; the table below
// is the single list the loader, the flags and the docs use.
type key struct {
	name  string // YAML path, used in errors
	env   string
	flag  string
	usage string
	set   func(c *Config, v string) error
}

func str(f func(c *Config) *string) func(*Config, string) error {
	return func(c *Config, v string) error { *f(c) = v; return nil }
}

func dur(f func(c *Config) *time.Duration) func(*Config, string) error {
	return func(c *Config, v string) error {
		d, err := time.ParseDuration(v)
		if err != nil {
			return fmt.Errorf("%q is not a duration like 500ms or 1s", v)
		}
		*f(c) = d
		return nil
	}
}

func integer(f func(c *Config) *int) func(*Config, string) error {
	return func(c *Config, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil {
			return fmt.Errorf("%q is not an integer", v)
		}
		*f(c) = n
		return nil
	}
}

func boolean(f func(c *Config) *bool) func(*Config, string) error {
	return func(c *Config, v string) error {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("%q is not true or false", v)
		}
		*f(c) = b
		return nil
	}
}

// commaList sets a list from a comma-separated value: each element
// trimmed, empty ones dropped.
func commaList(f func(c *Config) *[]string) func(*Config, string) error {
	return func(c *Config, v string) error {
		l := f(c)
		*l = nil
		for _, e := range strings.Split(v, ",") {
			if e = strings.TrimSpace(e); e != "" {
				*l = append(*l, e)
			}
		}
		return nil
	}
}

// keyValues sets a map from key=value pairs separated by commas.
func keyValues(f func(c *Config) *map[string]string) func(*Config, string) error {
	return func(c *Config, v string) error {
		m := map[string]string{}
		for _, e := range strings.Split(v, ",") {
			if e = strings.TrimSpace(e); e == "" {
				continue
			}
			k, val, ok := strings.Cut(e, "=")
			if !ok || strings.TrimSpace(k) == "" {
				return fmt.Errorf("%q is not key=value", e)
			}
			m[strings.TrimSpace(k)] = strings.TrimSpace(val)
		}
		*f(c) = m
		return nil
	}
}

var keys = []key{
	{"postgres.url", "OUTBOX_RELAY_POSTGRES_URL", "postgres-url", "PostgreSQL connection URL (direct, not through a transaction pooler)",
		str(func(c *Config) *string { return &c.Postgres.URL })},
	{"postgres.slot", "OUTBOX_RELAY_SLOT", "slot", "logical replication slot (created if missing, never dropped)",
		str(func(c *Config) *string { return &c.Postgres.Slot })},
	{"postgres.publication", "OUTBOX_RELAY_PUBLICATION", "publication", "publication of the outbox table",
		str(func(c *Config) *string { return &c.Postgres.Publication })},
	{"postgres.table", "OUTBOX_RELAY_TABLE", "table", "outbox table as schema.name",
		str(func(c *Config) *string { return &c.Postgres.Table })},
	{"postgres.create_publication", "OUTBOX_RELAY_CREATE_PUBLICATION", "create-publication", "create the publication when missing",
		boolean(func(c *Config) *bool { return &c.Postgres.CreatePublication })},
	{"postgres.slot_failover", "OUTBOX_RELAY_SLOT_FAILOVER", "slot-failover", "make the slot a failover slot, synced to standbys (PostgreSQL 17+; docs/failover.md)",
		boolean(func(c *Config) *bool { return &c.Postgres.SlotFailover })},
	{"postgres.standby_slots", "OUTBOX_RELAY_STANDBY_SLOTS", "standby-slots", "comma-separated physical slots of standbys: publish a transaction only once each has flushed it (no phantom events after a failover; docs/failover.md)",
		commaList(func(c *Config) *[]string { return &c.Postgres.StandbySlots })},
	{"postgres.status_interval", "OUTBOX_RELAY_STATUS_INTERVAL", "status-interval", "standby status update interval (< wal_sender_timeout/2)",
		dur(func(c *Config) *time.Duration { return &c.Postgres.StatusInterval })},
	{"postgres.receive_timeout", "OUTBOX_RELAY_RECEIVE_TIMEOUT", "receive-timeout", "reconnect when the server sends nothing this long (dead connection)",
		dur(func(c *Config) *time.Duration { return &c.Postgres.ReceiveTimeout })},
	{"postgres.reconnect_min", "OUTBOX_RELAY_RECONNECT_MIN", "reconnect-min", "first replication reconnect backoff",
		dur(func(c *Config) *time.Duration { return &c.Postgres.ReconnectMin })},
	{"postgres.reconnect_max", "OUTBOX_RELAY_RECONNECT_MAX", "reconnect-max", "largest replication reconnect backoff",
		dur(func(c *Config) *time.Duration { return &c.Postgres.ReconnectMax })},
	{"postgres.lag_poll_interval", "OUTBOX_RELAY_LAG_POLL_INTERVAL", "lag-poll-interval", "how often slot lag is read",
		dur(func(c *Config) *time.Duration { return &c.Postgres.LagPollInterval })},
	{"postgres.partition", "OUTBOX_RELAY_PARTITION", "partition", "migrate creates a missing outbox table partitioned by created_at: none, daily or monthly",
		str(func(c *Config) *string { return &c.Postgres.Partition })},
	{"postgres.streaming", "OUTBOX_RELAY_STREAMING", "streaming", "stream transactions larger than logical_decoding_work_mem before they commit (PostgreSQL 14+): auto, on or off",
		str(func(c *Config) *string { return &c.Postgres.Streaming })},
	{"kafka.brokers", "OUTBOX_RELAY_KAFKA_BROKERS", "kafka-brokers", "comma-separated host:port list",
		commaList(func(c *Config) *[]string { return &c.Kafka.Brokers })},
	{"kafka.client_id", "OUTBOX_RELAY_KAFKA_CLIENT_ID", "kafka-client-id", "Kafka client id",
		str(func(c *Config) *string { return &c.Kafka.ClientID })},
	{"kafka.topic_template", "OUTBOX_RELAY_TOPIC_TEMPLATE", "topic-template", "topic per event: {aggregate_type}, {event_type}, {schema} and {table} are replaced; no placeholder = fixed topic",
		str(func(c *Config) *string { return &c.Kafka.TopicTemplate })},
	{"kafka.auto_create_topics", "OUTBOX_RELAY_KAFKA_AUTO_CREATE_TOPICS", "kafka-auto-create-topics", "let the relay create a missing topic (needs the broker's auto.create.topics.enable); off: create topics beforehand",
		boolean(func(c *Config) *bool { return &c.Kafka.AutoCreateTopics })},
	{"kafka.missing_topic_timeout", "OUTBOX_RELAY_KAFKA_MISSING_TOPIC_TIMEOUT", "kafka-missing-topic-timeout", "how long events wait for a topic that does not exist (other topics go on) before they are poison (unknown_topic)",
		dur(func(c *Config) *time.Duration { return &c.Kafka.MissingTopicTimeout })},
	{"kafka.topic_refresh", "OUTBOX_RELAY_KAFKA_TOPIC_REFRESH", "kafka-topic-refresh", "how often each topic is looked up again: a partition count change is noticed (reported, and followed without reordering a key) and max.message.bytes re-read",
		dur(func(c *Config) *time.Duration { return &c.Kafka.TopicRefresh })},
	{"kafka.max_topics", "OUTBOX_RELAY_KAFKA_MAX_TOPICS", "kafka-max-topics", "most distinct topics events go to (dead-letter topic not counted); an event for one more is poison (topic_limit)",
		integer(func(c *Config) *int { return &c.Kafka.MaxTopics })},
	{"kafka.topic_allowlist", "OUTBOX_RELAY_KAFKA_TOPIC_ALLOWLIST", "kafka-topic-allowlist", "comma-separated topics or prefixes ending in * events may go to (empty = any); others are poison (topic_not_allowed)",
		func(c *Config, v string) error {
			c.Kafka.TopicAllowlist = nil
			for _, e := range strings.Split(v, ",") {
				c.Kafka.TopicAllowlist = append(c.Kafka.TopicAllowlist, strings.TrimSpace(e))
			}
			return nil
		}},
	{"kafka.producer", "OUTBOX_RELAY_KAFKA_PRODUCER", "kafka-producer", "produce engine: direct (the relay's own on sarama's Broker API; ignores the flush settings) or sarama (sarama's AsyncProducer); both idempotent, acks=all",
		str(func(c *Config) *string { return &c.Kafka.Producer })},
	{"kafka.compression", "OUTBOX_RELAY_KAFKA_COMPRESSION", "kafka-compression", "none, gzip, snappy, lz4 or zstd",
		str(func(c *Config) *string { return &c.Kafka.Compression })},
	{"kafka.flush_frequency", "OUTBOX_RELAY_KAFKA_FLUSH_FREQUENCY", "kafka-flush-frequency", "producer batching: max wait before a batch is sent",
		dur(func(c *Config) *time.Duration { return &c.Kafka.FlushFrequency })},
	{"kafka.flush_messages", "OUTBOX_RELAY_KAFKA_FLUSH_MESSAGES", "kafka-flush-messages", "producer batching: messages that trigger a send (0 = off)",
		integer(func(c *Config) *int { return &c.Kafka.FlushMessages })},
	{"kafka.flush_bytes", "OUTBOX_RELAY_KAFKA_FLUSH_BYTES", "kafka-flush-bytes", "producer batching: bytes that trigger a send (0 = off)",
		integer(func(c *Config) *int { return &c.Kafka.FlushBytes })},
	{"kafka.max_message_bytes", "OUTBOX_RELAY_KAFKA_MAX_MESSAGE_BYTES", "kafka-max-message-bytes", "largest record; keep <= the broker's message.max.bytes",
		integer(func(c *Config) *int { return &c.Kafka.MaxMessageBytes })},
	{"kafka.version", "OUTBOX_RELAY_KAFKA_VERSION", "kafka-version", "Kafka protocol version to speak",
		str(func(c *Config) *string { return &c.Kafka.Version })},
	{"kafka.retry_backoff_max", "OUTBOX_RELAY_KAFKA_RETRY_BACKOFF_MAX", "kafka-retry-backoff-max", "cap of the produce retry backoff",
		dur(func(c *Config) *time.Duration { return &c.Kafka.RetryBackoffMax })},
	{"kafka.retry_max", "OUTBOX_RELAY_KAFKA_RETRY_MAX", "kafka-retry-max", "sarama's retries of one batch before it hands the error back; the relay then requeues the events itself and retries for ever, dropping nothing",
		integer(func(c *Config) *int { return &c.Kafka.RetryMax })},
	{"kafka.sasl.mechanism", "OUTBOX_RELAY_KAFKA_SASL_MECHANISM", "kafka-sasl-mechanism", "PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER (empty = no SASL)",
		str(func(c *Config) *string { return &c.Kafka.SASL.Mechanism })},
	{"kafka.sasl.username", "OUTBOX_RELAY_KAFKA_SASL_USERNAME", "kafka-sasl-username", "SASL user",
		str(func(c *Config) *string { return &c.Kafka.SASL.Username })},
	{"kafka.sasl.password", "OUTBOX_RELAY_KAFKA_SASL_PASSWORD", "kafka-sasl-password", "SASL password (prefer the env variable; never logged)",
		str(func(c *Config) *string { return &c.Kafka.SASL.Password })},
	{"kafka.sasl.oauth.token_source", "OUTBOX_RELAY_KAFKA_SASL_OAUTH_TOKEN_SOURCE", "kafka-sasl-oauth-token-source", "OAUTHBEARER token source: static, file, client_credentials or aws_msk_iam",
		str(func(c *Config) *string { return &c.Kafka.SASL.OAuth.Source })},
	{"kafka.sasl.oauth.token", "OUTBOX_RELAY_KAFKA_SASL_OAUTH_TOKEN", "kafka-sasl-oauth-token", "static OAUTHBEARER token (prefer the env variable; never logged)",
		str(func(c *Config) *string { return &c.Kafka.SASL.OAuth.Token })},
	{"kafka.sasl.oauth.token_file", "OUTBOX_RELAY_KAFKA_SASL_OAUTH_TOKEN_FILE", "kafka-sasl-oauth-token-file", "file holding the OAUTHBEARER token, read again when it changes",
		str(func(c *Config) *string { return &c.Kafka.SASL.OAuth.TokenFile })},
	{"kafka.sasl.oauth.token_url", "OUTBOX_RELAY_KAFKA_SASL_OAUTH_TOKEN_URL", "kafka-sasl-oauth-token-url", "OAuth 2 token endpoint (client_credentials)",
		str(func(c *Config) *string { return &c.Kafka.SASL.OAuth.TokenURL })},
	{"kafka.sasl.oauth.client_id", "OUTBOX_RELAY_KAFKA_SASL_OAUTH_CLIENT_ID", "kafka-sasl-oauth-client-id", "OAuth 2 client id (client_credentials)",
		str(func(c *Config) *string { return &c.Kafka.SASL.OAuth.ClientID })},
	{"kafka.sasl.oauth.client_secret", "OUTBOX_RELAY_KAFKA_SASL_OAUTH_CLIENT_SECRET", "kafka-sasl-oauth-client-secret", "OAuth 2 client secret (prefer the env variable; never logged)",
		str(func(c *Config) *string { return &c.Kafka.SASL.OAuth.ClientSecret })},
	{"kafka.sasl.oauth.scope", "OUTBOX_RELAY_KAFKA_SASL_OAUTH_SCOPE", "kafka-sasl-oauth-scope", "OAuth 2 scope to ask for (client_credentials; empty = none)",
		str(func(c *Config) *string { return &c.Kafka.SASL.OAuth.Scope })},
	{"kafka.sasl.oauth.extensions", "OUTBOX_RELAY_KAFKA_SASL_OAUTH_EXTENSIONS", "kafka-sasl-oauth-extensions", "SASL extensions sent with the token, key=value,... (e.g. logicalCluster=lkc-1,identityPoolId=pool-2)",
		keyValues(func(c *Config) *map[string]string { return &c.Kafka.SASL.OAuth.Extensions })},
	{"kafka.sasl.oauth.aws_region", "OUTBOX_RELAY_KAFKA_SASL_OAUTH_AWS_REGION", "kafka-sasl-oauth-aws-region", "AWS region of the MSK cluster (aws_msk_iam)",
		str(func(c *Config) *string { return &c.Kafka.SASL.OAuth.AWSRegion })},
	{"kafka.sasl.oauth.aws_profile", "OUTBOX_RELAY_KAFKA_SASL_OAUTH_AWS_PROFILE", "kafka-sasl-oauth-aws-profile", "AWS named profile for the MSK IAM credentials (empty = the default chain)",
		str(func(c *Config) *string { return &c.Kafka.SASL.OAuth.AWSProfile })},
	{"kafka.sasl.oauth.aws_role_arn", "OUTBOX_RELAY_KAFKA_SASL_OAUTH_AWS_ROLE_ARN", "kafka-sasl-oauth-aws-role-arn", "IAM role to assume for MSK IAM (empty = the default chain's identity)",
		str(func(c *Config) *string { return &c.Kafka.SASL.OAuth.AWSRoleARN })},
	{"kafka.tls.enabled", "OUTBOX_RELAY_KAFKA_TLS_ENABLED", "kafka-tls", "connect to the brokers with TLS",
		boolean(func(c *Config) *bool { return &c.Kafka.TLS.Enabled })},
	{"kafka.tls.ca_file", "OUTBOX_RELAY_KAFKA_TLS_CA_FILE", "kafka-tls-ca-file", "PEM CA bundle (empty = system roots)",
		str(func(c *Config) *string { return &c.Kafka.TLS.CAFile })},
	{"kafka.tls.cert_file", "OUTBOX_RELAY_KAFKA_TLS_CERT_FILE", "kafka-tls-cert-file", "PEM client certificate (mTLS)",
		str(func(c *Config) *string { return &c.Kafka.TLS.CertFile })},
	{"kafka.tls.key_file", "OUTBOX_RELAY_KAFKA_TLS_KEY_FILE", "kafka-tls-key-file", "PEM client key (mTLS)",
		str(func(c *Config) *string { return &c.Kafka.TLS.KeyFile })},
	{"kafka.tls.server_name", "OUTBOX_RELAY_KAFKA_TLS_SERVER_NAME", "kafka-tls-server-name", "override the name checked in the broker certificate",
		str(func(c *Config) *string { return &c.Kafka.TLS.ServerName })},
	{"kafka.tls.insecure_skip_verify", "OUTBOX_RELAY_KAFKA_TLS_INSECURE_SKIP_VERIFY", "kafka-tls-insecure-skip-verify", "do not verify the broker certificate (testing only)",
		boolean(func(c *Config) *bool { return &c.Kafka.TLS.InsecureSkipVerify })},
	{"inflight.max_events", "OUTBOX_RELAY_MAX_INFLIGHT_EVENTS", "max-inflight-events", "events published but not acked before reading pauses",
		integer(func(c *Config) *int { return &c.InFlight.MaxEvents })},
	{"inflight.max_bytes", "OUTBOX_RELAY_MAX_INFLIGHT_BYTES", "max-inflight-bytes", "payload bytes published but not acked before reading pauses",
		func(c *Config, v string) error {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return fmt.Errorf("%q is not an integer", v)
			}
			c.InFlight.MaxBytes = n
			return nil
		}},
	{"on_poison", "OUTBOX_RELAY_ON_POISON", "on-poison", "poison event (can never be published): dlq = dead-letter it and go on, halt = stop publishing and keep the slot",
		str(func(c *Config) *string { return &c.OnPoison })},
	{"dead_letter.topic", "OUTBOX_RELAY_DLQ_TOPIC", "dlq-topic", "dead-letter topic",
		str(func(c *Config) *string { return &c.DeadLetter.Topic })},
	{"dead_letter.max_attempts", "OUTBOX_RELAY_DLQ_MAX_ATTEMPTS", "dlq-max-attempts", "publish attempts of a poison event before on_poison applies",
		integer(func(c *Config) *int { return &c.DeadLetter.MaxAttempts })},
	{"dead_letter.retry_backoff", "OUTBOX_RELAY_DLQ_RETRY_BACKOFF", "dlq-retry-backoff", "first backoff between attempts of a poison event (doubles)",
		dur(func(c *Config) *time.Duration { return &c.DeadLetter.RetryBackoff })},
	{"delivery", "OUTBOX_RELAY_DELIVERY", "delivery", "at_least_once, or exactly_once: Kafka transactions aligned to PostgreSQL transactions (consumers read with isolation.level=read_committed)",
		str(func(c *Config) *string { return &c.Delivery })},
	{"exactly_once.max_batch_events", "OUTBOX_RELAY_EXACTLY_ONCE_MAX_BATCH_EVENTS", "exactly-once-max-batch-events", "events per Kafka transaction, whole PostgreSQL transactions only (at most inflight.max_events)",
		integer(func(c *Config) *int { return &c.ExactlyOnce.MaxBatchEvents })},
	{"exactly_once.max_batch_interval", "OUTBOX_RELAY_EXACTLY_ONCE_MAX_BATCH_INTERVAL", "exactly-once-max-batch-interval", "commit a Kafka transaction this long after it opened",
		dur(func(c *Config) *time.Duration { return &c.ExactlyOnce.MaxBatchInterval })},
	{"exactly_once.max_batch_idle", "OUTBOX_RELAY_EXACTLY_ONCE_MAX_BATCH_IDLE", "exactly-once-max-batch-idle", "commit a Kafka transaction once no WAL message arrived for this long (0: off)",
		dur(func(c *Config) *time.Duration { return &c.ExactlyOnce.MaxBatchIdle })},
	{"exactly_once.checkpoint_topic", "OUTBOX_RELAY_EXACTLY_ONCE_CHECKPOINT_TOPIC", "exactly-once-checkpoint-topic", "compacted topic of the checkpoint records (created when missing)",
		str(func(c *Config) *string { return &c.ExactlyOnce.CheckpointTopic })},
	{"exactly_once.transaction_timeout", "OUTBOX_RELAY_EXACTLY_ONCE_TRANSACTION_TIMEOUT", "exactly-once-transaction-timeout", "transaction.timeout.ms of the transactional producer",
		dur(func(c *Config) *time.Duration { return &c.ExactlyOnce.TransactionTimeout })},
	{"exactly_once.transactional_id", "OUTBOX_RELAY_EXACTLY_ONCE_TRANSACTIONAL_ID", "exactly-once-transactional-id", "transactional.id of the producer (default outbox-relay-<slot>)",
		str(func(c *Config) *string { return &c.ExactlyOnce.TransactionalID })},
	{"leader.enabled", "OUTBOX_RELAY_LEADER_ENABLED", "leader-election", "elect one active instance per slot with a lease in PostgreSQL (false: run alone)",
		boolean(func(c *Config) *bool { return &c.Leader.Enabled })},
	{"leader.lease_ttl", "OUTBOX_RELAY_LEADER_LEASE_TTL", "leader-lease-ttl", "a leader not renewing this long is fenced and replaced",
		dur(func(c *Config) *time.Duration { return &c.Leader.LeaseTTL })},
	{"leader.renew_interval", "OUTBOX_RELAY_LEADER_RENEW_INTERVAL", "leader-renew-interval", "how often the leader renews its lease",
		dur(func(c *Config) *time.Duration { return &c.Leader.RenewInterval })},
	{"leader.poll_interval", "OUTBOX_RELAY_LEADER_POLL_INTERVAL", "leader-poll-interval", "how often a standby tries to take over",
		dur(func(c *Config) *time.Duration { return &c.Leader.PollInterval })},
	{"leader.instance_id", "OUTBOX_RELAY_INSTANCE_ID", "instance-id", "this instance's name in the lease (default host-pid)",
		str(func(c *Config) *string { return &c.Leader.InstanceID })},
	{"heartbeat.interval", "OUTBOX_RELAY_HEARTBEAT_INTERVAL", "heartbeat-interval", "how often the leader writes a heartbeat through the slot to time outbox_relay_lag_seconds (0 = off)",
		dur(func(c *Config) *time.Duration { return &c.Heartbeat.Interval })},
	{"messages.prefix", "OUTBOX_RELAY_MESSAGES_PREFIX", "messages-prefix", "publish transactional pg_logical_emit_message messages with exactly this prefix as events (table-less outbox, PostgreSQL 14+; empty = off)",
		str(func(c *Config) *string { return &c.Messages.Prefix })},
	{"serialization", "OUTBOX_RELAY_SERIALIZATION", "serialization", "value format of every topic: json (the payload as it is), json_schema, avro or protobuf (Schema Registry wire format)",
		str(func(c *Config) *string { return &c.Serialization })},
	{"serialization_topics", "OUTBOX_RELAY_SERIALIZATION_TOPICS", "serialization-topics", "per-topic formats overriding serialization, topic=format,... (a topic or a prefix ending in *)",
		keyValues(func(c *Config) *map[string]string { return &c.SerializationTopics })},
	{"schema_registry.url", "OUTBOX_RELAY_SCHEMA_REGISTRY_URL", "schema-registry-url", "the Schema Registry's Confluent-compatible API (Apicurio: .../apis/ccompat/v7)",
		str(func(c *Config) *string { return &c.SchemaRegistry.URL })},
	{"schema_registry.username", "OUTBOX_RELAY_SCHEMA_REGISTRY_USERNAME", "schema-registry-username", "basic auth user of the Schema Registry",
		str(func(c *Config) *string { return &c.SchemaRegistry.Username })},
	{"schema_registry.password", "OUTBOX_RELAY_SCHEMA_REGISTRY_PASSWORD", "schema-registry-password", "basic auth password of the Schema Registry (prefer the env variable; never logged)",
		str(func(c *Config) *string { return &c.SchemaRegistry.Password })},
	{"schema_registry.tls.ca_file", "OUTBOX_RELAY_SCHEMA_REGISTRY_TLS_CA_FILE", "schema-registry-tls-ca-file", "PEM CA bundle the registry's certificate is checked against (empty = the system's)",
		str(func(c *Config) *string { return &c.SchemaRegistry.TLS.CAFile })},
	{"schema_registry.tls.cert_file", "OUTBOX_RELAY_SCHEMA_REGISTRY_TLS_CERT_FILE", "schema-registry-tls-cert-file", "PEM client certificate for the registry (mutual TLS)",
		str(func(c *Config) *string { return &c.SchemaRegistry.TLS.CertFile })},
	{"schema_registry.tls.key_file", "OUTBOX_RELAY_SCHEMA_REGISTRY_TLS_KEY_FILE", "schema-registry-tls-key-file", "PEM key of schema_registry.tls.cert_file",
		str(func(c *Config) *string { return &c.SchemaRegistry.TLS.KeyFile })},
	{"schema_registry.tls.insecure_skip_verify", "OUTBOX_RELAY_SCHEMA_REGISTRY_TLS_INSECURE_SKIP_VERIFY", "schema-registry-tls-insecure-skip-verify", "do not check the registry's certificate (tests only)",
		boolean(func(c *Config) *bool { return &c.SchemaRegistry.TLS.InsecureSkipVerify })},
	{"schema_registry.timeout", "OUTBOX_RELAY_SCHEMA_REGISTRY_TIMEOUT", "schema-registry-timeout", "deadline of one registry request; a registry that does not answer makes events wait, never skips them",
		dur(func(c *Config) *time.Duration { return &c.SchemaRegistry.Timeout })},
	{"schema_registry.subject_strategy", "OUTBOX_RELAY_SCHEMA_REGISTRY_SUBJECT_STRATEGY", "schema-registry-subject-strategy", "topic_name (<topic>-value), record_name (schema_registry.record_name) or topic_record_name (<topic>-<record name>)",
		str(func(c *Config) *string { return &c.SchemaRegistry.SubjectStrategy })},
	{"schema_registry.record_name", "OUTBOX_RELAY_SCHEMA_REGISTRY_RECORD_NAME", "schema-registry-record-name", "record name template of the record_name strategies: {aggregate_type} {event_type} {schema} {table} {topic}",
		str(func(c *Config) *string { return &c.SchemaRegistry.RecordName })},
	{"schema_registry.auto_register", "OUTBOX_RELAY_SCHEMA_REGISTRY_AUTO_REGISTER", "schema-registry-auto-register", "register the schema files of schema_registry.schemas when their subject lacks them (else only look them up)",
		boolean(func(c *Config) *bool { return &c.SchemaRegistry.AutoRegister })},
	{"schema_registry.schemas", "OUTBOX_RELAY_SCHEMA_REGISTRY_SCHEMAS", "schema-registry-schemas", "schema files by subject, subject=file,... (used instead of the subject's latest version)",
		keyValues(func(c *Config) *map[string]string { return &c.SchemaRegistry.Schemas })},
	{"schema_registry.version_header", "OUTBOX_RELAY_SCHEMA_REGISTRY_VERSION_HEADER", "schema-registry-version-header", "event header whose integer value picks the subject's version, e.g. schema_version (empty = the latest version)",
		str(func(c *Config) *string { return &c.SchemaRegistry.VersionHeader })},
	{"schema_registry.key", "OUTBOX_RELAY_SCHEMA_REGISTRY_KEY", "schema-registry-key", "record key format: raw (the aggregate id's bytes) or string (the registry's string schema under <topic>-key)",
		str(func(c *Config) *string { return &c.SchemaRegistry.Key })},
	{"schema_registry.cache_ttl", "OUTBOX_RELAY_SCHEMA_REGISTRY_CACHE_TTL", "schema-registry-cache-ttl", "how long a subject's latest version is used before it is looked up again (a failed lookup keeps the cached one)",
		dur(func(c *Config) *time.Duration { return &c.SchemaRegistry.CacheTTL })},
	{"envelope", "OUTBOX_RELAY_ENVELOPE", "envelope", "none, or cloudevents (CloudEvents 1.0 in the Kafka protocol binding)",
		str(func(c *Config) *string { return &c.Envelope })},
	{"cloudevents.mode", "OUTBOX_RELAY_CLOUDEVENTS_MODE", "cloudevents-mode", "binary (ce_* headers, the value as it is) or structured (one JSON event, application/cloudevents+json)",
		str(func(c *Config) *string { return &c.CloudEvents.Mode })},
	{"cloudevents.source", "OUTBOX_RELAY_CLOUDEVENTS_SOURCE", "cloudevents-source", "template of the source attribute: {schema} {table} {aggregate_type} {event_type} {topic}",
		str(func(c *Config) *string { return &c.CloudEvents.Source })},
	{"cloudevents.type", "OUTBOX_RELAY_CLOUDEVENTS_TYPE", "cloudevents-type", "template of the type attribute (default {event_type})",
		str(func(c *Config) *string { return &c.CloudEvents.Type })},
	{"retention.keep", "OUTBOX_RELAY_RETENTION_KEEP", "retention-keep", "delete delivered rows older than this (0 = keep rows for ever)",
		dur(func(c *Config) *time.Duration { return &c.Retention.Keep })},
	{"retention.interval", "OUTBOX_RELAY_RETENTION_INTERVAL", "retention-interval", "how often the leader deletes delivered rows older than retention.keep",
		dur(func(c *Config) *time.Duration { return &c.Retention.Interval })},
	{"retention.batch_size", "OUTBOX_RELAY_RETENTION_BATCH_SIZE", "retention-batch-size", "rows per DELETE transaction",
		integer(func(c *Config) *int { return &c.Retention.BatchSize })},
	{"retention.archive", "OUTBOX_RELAY_RETENTION_ARCHIVE", "retention-archive", "move removed rows to <table>_archive (partitioned by month) instead of only deleting them",
		boolean(func(c *Config) *bool { return &c.Retention.Archive })},
	{"metrics_addr", "OUTBOX_RELAY_METRICS_ADDR", "metrics-addr", "HTTP address for /metrics, /healthz, /readyz (empty = off)",
		str(func(c *Config) *string { return &c.MetricsAddr })},
	{"pprof", "OUTBOX_RELAY_PPROF", "pprof", "serve /debug/pprof/ on metrics_addr (profiling; off in production unless needed)",
		boolean(func(c *Config) *bool { return &c.Pprof })},
	{"log.level", "OUTBOX_RELAY_LOG_LEVEL", "log-level", "trace, debug, info, warn or error",
		str(func(c *Config) *string { return &c.Log.Level })},
	{"log.format", "OUTBOX_RELAY_LOG_FORMAT", "log-format", "json or console",
		str(func(c *Config) *string { return &c.Log.Format })},
	{"shutdown_timeout", "OUTBOX_RELAY_SHUTDOWN_TIMEOUT", "shutdown-timeout", "bound on waiting for Kafka acks at shutdown",
		dur(func(c *Config) *time.Duration { return &c.ShutdownTimeout })},
	{"max_unacked_age", "OUTBOX_RELAY_MAX_UNACKED_AGE", "max-unacked-age", "not ready (/readyz 503) while the oldest event sent to Kafka waits longer than this for its ack",
		dur(func(c *Config) *time.Duration { return &c.MaxUnackedAge })},
	{"compat", "OUTBOX_RELAY_COMPAT", "compat", `debezium: read Debezium's outbox table (id, aggregatetype, aggregateid, type, payload) and write what its EventRouter writes; "" = this relay's own table and records`,
		str(func(c *Config) *string { return &c.Compat })},
	{"columns.id", "OUTBOX_RELAY_COLUMNS_ID", "columns-id", "event id column: bigint, uuid or text (Debezium table.field.event.id; default id)",
		str(func(c *Config) *string { return &c.Columns.ID })},
	{"columns.key", "OUTBOX_RELAY_COLUMNS_KEY", "columns-key", "record key column, any type (table.field.event.key; default aggregate_id, with compat aggregateid)",
		str(func(c *Config) *string { return &c.Columns.Key })},
	{"columns.type", "OUTBOX_RELAY_COLUMNS_TYPE", "columns-type", "event type column or none (table.field.event.type; default event_type, with compat type)",
		str(func(c *Config) *string { return &c.Columns.Type })},
	{"columns.payload", "OUTBOX_RELAY_COLUMNS_PAYLOAD", "columns-payload", "record value column: jsonb, json, text or bytea, published byte for byte (table.field.event.payload; default payload)",
		str(func(c *Config) *string { return &c.Columns.Payload })},
	{"columns.route_by", "OUTBOX_RELAY_COLUMNS_ROUTE_BY", "columns-route-by", "column whose value is {aggregate_type} in the topic template, or none (route.by.field; default aggregate_type, with compat aggregatetype)",
		str(func(c *Config) *string { return &c.Columns.RouteBy })},
	{"columns.headers", "OUTBOX_RELAY_COLUMNS_HEADERS", "columns-headers", "JSON object column whose keys become headers, or none (default headers, with compat none)",
		str(func(c *Config) *string { return &c.Columns.Headers })},
	{"columns.additional", "OUTBOX_RELAY_COLUMNS_ADDITIONAL", "columns-additional", "comma-separated column:header[:name] placed as headers (table.fields.additional.placement)",
		commaList(func(c *Config) *[]string { return &c.Columns.Additional })},
}

// boolKeys are the keys whose flag may stand alone (--kafka-tls).
var boolKeys = map[string]bool{
	"postgres.create_publication": true, "postgres.slot_failover": true, "kafka.auto_create_topics": true, "kafka.tls.enabled": true, "kafka.tls.insecure_skip_verify": true,
	"leader.enabled": true, "pprof": true, "retention.archive": true,
	"schema_registry.auto_register": true, "schema_registry.tls.insecure_skip_verify": true,
}

// flagVal is one configuration flag as given on the command line.
type flagVal struct {
	k key
	v string
}

// configFlags is the flag set of a subcommand: --config, the subcommand's
// own flags (extra) and one flag per configuration key, recorded in order
// into the returned slice when parsed.
func configFlags(name string, extra ...func(*flag.FlagSet)) (*flag.FlagSet, *string, *[]flagVal) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // callers print errors and usage once, to their writer
	path := fs.String("config", "", "YAML config file")
	for _, f := range extra {
		f(fs)
	}
	fromFlags := &[]flagVal{}
	for _, k := range keys {
		record := func(v string) error {
			*fromFlags = append(*fromFlags, flagVal{k, v})
			return nil
		}
		if boolKeys[k.name] {
			fs.BoolFunc(k.flag, k.usage+" (env "+k.env+")", record) // --kafka-tls alone means true
		} else {
			fs.Func(k.flag, k.usage+" (env "+k.env+")", record)
		}
	}
	return fs, path, fromFlags
}

// printFlags writes the help of a subcommand's flags to w: --config, its own
// flags (extra), then every configuration key, each with its default.
func printFlags(w io.Writer, extra ...func(*flag.FlagSet)) {
	own := flag.NewFlagSet("", flag.ContinueOnError)
	for _, f := range extra {
		f(own)
	}
	line := func(name, usage, def string) {
		fmt.Fprintf(w, "  --%-30s %s (default %s)\n", name, usage, def)
	}
	fmt.Fprintln(w, "\nflags (each overrides its env variable, which overrides the --config file):")
	fmt.Fprintf(w, "  --%-30s %s\n", "config FILE", "YAML config file, read first (env OUTBOX_RELAY_CONFIG)")
	own.VisitAll(func(f *flag.Flag) {
		arg, usage := flag.UnquoteUsage(f)
		name := f.Name
		if arg != "" && arg != "value" {
			name += " " + arg
		}
		line(name, usage, showDefault(f.DefValue))
	})
	defs := defaults()
	for _, k := range keys {
		line(k.flag, k.usage, showDefault(defs[k.name])+"; env "+k.env)
	}
}

func showDefault(v string) string {
	if v == "" {
		return `""`
	}
	return v
}

// defaults maps each key's YAML path to its default, as YAML writes it
// (durations as 1s, lists joined by commas).
func defaults() map[string]string {
	b, _ := yaml.Marshal(DefaultConfig())
	var root map[string]any
	_ = yaml.Unmarshal(b, &root)
	out := map[string]string{}
	var walk func(prefix string, m map[string]any)
	walk = func(prefix string, m map[string]any) {
		for k, v := range m {
			switch v := v.(type) {
			case map[string]any:
				walk(prefix+k+".", v)
			case []any:
				var parts []string
				for _, e := range v {
					parts = append(parts, fmt.Sprint(e))
				}
				out[prefix+k] = strings.Join(parts, ",")
			case nil:
				out[prefix+k] = ""
			default:
				out[prefix+k] = fmt.Sprint(v)
			}
		}
	}
	walk("", root)
	return out
}

// loadConfig parses args (flags of one subcommand) and builds the config
// from file, env and flags. Parse errors name the key and its source.
// extra registers a subcommand's own flags (dlq replay --id).
func loadConfig(name string, args []string, getenv func(string) string, extra ...func(*flag.FlagSet)) (Config, error) {
	fs, path, fromFlags := configFlags(name, extra...)
	if err := fs.Parse(args); err != nil {
		return Config{}, err
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	c := DefaultConfig()
	var errs []error
	if p := *path; p != "" || getenv("OUTBOX_RELAY_CONFIG") != "" {
		if p == "" {
			p = getenv("OUTBOX_RELAY_CONFIG")
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return Config{}, fmt.Errorf("read config file: %w", err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(b))
		dec.KnownFields(true) // a misspelt key is an error, not a silent default
		if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
			var te *yaml.TypeError
			if !errors.As(err, &te) {
				return Config{}, fmt.Errorf("config file %s: %w", p, err)
			}
			// Wrong types and unknown keys: name each key (yaml.v3 only
			// gives a line) and go on, so one run shows every problem.
			keyAt := yamlKeyAtLine(b)
			for _, msg := range te.Errors {
				errs = append(errs, fmt.Errorf("%s (config file %s): %s", keyAt(msg), p, msg))
			}
		}
	}
	for _, k := range keys {
		if v, ok := lookupEnv(getenv, k.env); ok {
			if err := k.set(&c, v); err != nil {
				errs = append(errs, fmt.Errorf("%s (env %s): %w", k.name, k.env, err))
			}
		}
	}
	for _, f := range *fromFlags {
		if err := f.k.set(&c, f.v); err != nil {
			errs = append(errs, fmt.Errorf("%s (flag --%s): %w", f.k.name, f.k.flag, err))
		}
	}
	// Commands that touch PostgreSQL only run without kafka.brokers: the
	// first migrate comes before Kafka is set up, and status must work with
	// Kafka down. Only the validated copy gets a stand-in.
	v := c
	if postgresOnly(name) && len(v.Kafka.Brokers) == 0 {
		v.Kafka.Brokers = []string{"unused:9092"}
	}
	// Report parse errors and validation errors together: one run shows all.
	if err := errors.Join(append(errs, v.Validate())...); err != nil {
		return Config{}, err
	}
	obs, _ := c.Outboxes() // valid: Validate resolved them
	c.Postgres.Mappings = relay.Mappings(obs)
	return c, nil
}

// postgresOnly reports whether command name (as loadConfig gets it) uses
// PostgreSQL only, never Kafka.
func postgresOnly(name string) bool {
	switch name {
	case "migrate", "status", "cleanup", "dlq list", "dlq resolve":
		return true
	}
	return false
}

// ownTableOnly refuses a command that reads or writes the relay's own
// bookkeeping columns (dlq, replay, cleanup) when the config reads another
// table, or reads it another way (compat, columns, tables): "" when the
// command may run, else why not, naming the keys.
func (c Config) ownTableOnly(cmd string) string {
	if c.Postgres.Mappings == nil {
		return ""
	}
	return fmt.Sprintf("outbox-relay %s works only on the relay's own outbox table (postgres.table with the default columns): "+
		"it needs its bookkeeping columns (dead_lettered_at, published_at, created_at) and its BIGINT id, which a table read through compat, columns or tables does not have. "+
		"Dead letters of such a table are in the dead-letter topic only; see docs/configuration.md#column-mapping", cmd)
}

// yamlKeyAtLine returns a func that maps a yaml.v3 error message
// ("line N: ...") to the dotted key (e.g. postgres.status_interval) whose
// key or value is on line N of the file b.
func yamlKeyAtLine(b []byte) func(msg string) string {
	lines := map[int]string{}
	var walk func(n *yaml.Node, path string)
	walk = func(n *yaml.Node, path string) {
		if path != "" {
			lines[n.Line] = path
		}
		switch n.Kind {
		case yaml.DocumentNode, yaml.SequenceNode:
			for _, child := range n.Content {
				walk(child, path)
			}
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				k := n.Content[i].Value
				if path != "" {
					k = path + "." + k
				}
				lines[n.Content[i].Line] = k
				walk(n.Content[i+1], k)
			}
		}
	}
	var root yaml.Node
	if yaml.Unmarshal(b, &root) == nil {
		walk(&root, "")
	}
	return func(msg string) string {
		var n int
		if _, err := fmt.Sscanf(msg, "line %d:", &n); err == nil && lines[n] != "" {
			return lines[n]
		}
		return "config file"
	}
}

func lookupEnv(getenv func(string) string, name string) (string, bool) {
	v := getenv(name)
	return v, v != ""
}

// redacted returns the config as YAML with secrets removed, for the start log.
func (c Config) redacted() string {
	c.Postgres.URL = replication.RedactURL(c.Postgres.URL)
	if c.Kafka.SASL.Password != "" {
		c.Kafka.SASL.Password = "xxxxx"
	}
	if c.Kafka.SASL.OAuth.Token != "" {
		c.Kafka.SASL.OAuth.Token = "xxxxx"
	}
	if c.Kafka.SASL.OAuth.ClientSecret != "" {
		c.Kafka.SASL.OAuth.ClientSecret = "xxxxx"
	}
	if c.SchemaRegistry.Password != "" {
		c.SchemaRegistry.Password = "xxxxx"
	}
	c.SchemaRegistry.URL = replication.RedactURL(c.SchemaRegistry.URL)
	b, _ := yaml.Marshal(c)
	return string(b)
}
