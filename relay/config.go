package relay

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/retention"
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
	MetricsAddr string                      `yaml:"metrics_addr"`
	Pprof       bool                        `yaml:"pprof"`
	// ShutdownTimeout is the one shutdown deadline: from SIGTERM (or
	// Close) to the end of Run, drain included; see Relay.Run.
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout"`
	// MaxUnackedAge makes the leader not ready (/readyz 503) while its
	// oldest event published and not yet acked by Kafka is older than this.
	MaxUnackedAge time.Duration `yaml:"max_unacked_age"`
	// Compat is the record format and the default column mapping:
	// FormatOwn ("") or FormatDebezium ("debezium").
	Compat string `yaml:"compat"`
	// Columns maps the columns of postgres.table (ColumnsConfig).
	Columns ColumnsConfig `yaml:"columns"`
	// Tables lists several outbox tables instead of postgres.table and
	// columns (file only).
	Tables []TableConfig `yaml:"tables"`
}

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
	}
}

// Validate reports every invalid key by name.
func (c Config) Validate() error {
	errs := []error{c.Postgres.Validate("postgres."), c.Kafka.Validate("kafka."), c.Heartbeat.Validate("heartbeat."), c.Retention.Validate("retention.")}
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
	if errs[0] == nil { // postgres.table parsed: resolve the tables and their mappings
		if _, err := c.Outboxes(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
