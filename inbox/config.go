package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/outbox-relay/outbox-relay/backoff"
	"github.com/outbox-relay/outbox-relay/outboxschema"
)

// DefaultTable is the table of handled event ids unless Config.Table says
// otherwise.
const DefaultTable = "public.processed_events"

// DefaultTTL is how long a handled event id is kept (Config.TTL). The relay
// redelivers within minutes of a failure; 14 days also covers a consumer
// group reset to an offset days back, or a topic replayed after an incident.
const DefaultTTL = 14 * 24 * time.Hour

// Outcome is what happened to one record.
type Outcome string

const (
	Applied   Outcome = "applied"   // new event: the handler ran and its transaction committed
	Duplicate Outcome = "duplicate" // its event_id was already recorded: skipped
	GaveUp    Outcome = "gave_up"   // failed MaxAttempts times (or had no event_id) and OnGiveUp took it
)

// Config configures a Consumer. Start from DefaultConfig.
type Config struct {
	Brokers []string // Kafka bootstrap brokers (required)
	GroupID string   // Kafka consumer group (required)
	Topics  []string // topics to consume, e.g. outbox.event.order (required)

	// Table holds the handled event ids: "schema.name" or "name" (schema
	// public), plain identifiers. Create it with Migrate.
	Table string
	// Consumer names this consumer's rows in Table; default GroupID. Two
	// consumers sharing a database (billing and shipping) must differ, or
	// one would skip the events the other handled.
	Consumer string
	// TTL is how long an event id is kept after it was handled; a
	// redelivery older than that is handled again. Default DefaultTTL.
	TTL time.Duration
	// CleanupInterval is how often Run deletes expired ids (default 1h; the
	// first pass runs at start). Negative turns the cleanup off (run
	// Consumer.Cleanup yourself).
	CleanupInterval time.Duration
	// CleanupBatch is the number of rows one DELETE removes (default 5000):
	// short transactions, no long lock on the table.
	CleanupBatch int

	// Retry spaces the attempts of a record whose handler failed (default
	// 100ms doubling to 30s, jittered).
	Retry backoff.Policy
	// MaxAttempts bounds the attempts of one record; 0 (the default) retries
	// for ever, holding the partition (and so the order of its aggregates)
	// until the handler succeeds. When they are spent, OnGiveUp decides; a
	// record without an event_id goes there at once.
	MaxAttempts int
	// OnGiveUp, when set, takes a record that failed MaxAttempts times (or
	// has no event_id: err is ErrNoEventID), in a transaction that also
	// records its event_id (when it has one), e.g. to copy it into a
	// parking table. It returning nil commits, counts the record as GaveUp
	// and marks its offset: the partition moves on. When it is nil, or
	// returns an error, Run stops with a *FailedError and the offset is not
	// marked: nothing is ever skipped silently.
	OnGiveUp func(ctx context.Context, tx pgx.Tx, m *Message, err error) error

	// Decoder, when set, decodes values in the Schema Registry wire format
	// (magic byte 0, 4-byte schema id, data) before the handler sees them:
	// Message.Payload is then its JSON and Message.SchemaID the schema id.
	// Other values pass as they are. Without it a wire-format value
	// reaches the handler as it is (WireSchemaID reads its id).
	Decoder Decoder
	// Sarama is the Kafka client config; nil uses SaramaConfig(). Offsets
	// are committed by sarama's auto-commit of marked offsets.
	Sarama *sarama.Config
	// Registerer, when set, gets the consumer's metrics (see Stats), with
	// a const label group=GroupID.
	Registerer prometheus.Registerer
	// Logger gets failures at warn/error and per-record lines at debug.
	Logger zerolog.Logger
	// Observe, when set, is called after each record's transaction ended
	// (from the partition's goroutine, before the offset is marked).
	Observe func(m *Message, o Outcome)
}

// DefaultConfig returns the defaults; fill Brokers, GroupID and Topics.
func DefaultConfig() Config {
	return Config{
		Table:           DefaultTable,
		TTL:             DefaultTTL,
		CleanupInterval: time.Hour,
		CleanupBatch:    5000,
		Retry:           backoff.Policy{Initial: 100 * time.Millisecond, Max: 30 * time.Second},
		Logger:          zerolog.Nop(),
	}
}

// SaramaConfig is the Kafka config a Consumer uses by default: protocol
// 3.6, read_committed (records of aborted Kafka transactions, which the
// relay's delivery: exactly_once writes before a crash or a rewind, are
// skipped; on topics written without transactions it reads the same as
// read_uncommitted), a new group starts at the oldest offset (so events
// published before its first start are handled), marked offsets are
// committed every second, and errors are returned to the consumer, which
// logs them.
func SaramaConfig() *sarama.Config {
	c := sarama.NewConfig()
	c.Version = sarama.V3_6_0_0
	c.ClientID = "outbox-inbox"
	c.Consumer.IsolationLevel = sarama.ReadCommitted
	c.Consumer.Offsets.Initial = sarama.OffsetOldest
	c.Consumer.Offsets.AutoCommit.Enable = true
	c.Consumer.Offsets.AutoCommit.Interval = time.Second
	c.Consumer.Return.Errors = true
	return c
}

// Validate reports every problem, each naming its field.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf("inbox: "+format, a...)) }
	if len(c.Brokers) == 0 {
		bad("Brokers is empty; set the Kafka bootstrap brokers")
	}
	if c.GroupID == "" {
		bad("GroupID is empty; set the consumer group")
	}
	if len(c.Topics) == 0 {
		bad("Topics is empty; set the topics to consume, e.g. outbox.event.order")
	}
	if _, err := parseTable(c.Table); err != nil {
		errs = append(errs, err)
	}
	if c.TTL <= 0 {
		bad("TTL is %s; it must be positive (default %s)", c.TTL, DefaultTTL)
	}
	if c.CleanupBatch <= 0 {
		bad("CleanupBatch is %d; it must be positive (default 5000)", c.CleanupBatch)
	}
	if c.Retry.Initial <= 0 || c.Retry.Max < c.Retry.Initial {
		bad("Retry is %s..%s; Initial must be positive and Max at least Initial", c.Retry.Initial, c.Retry.Max)
	}
	if c.MaxAttempts < 0 {
		bad("MaxAttempts is %d; 0 retries for ever, or set a positive bound", c.MaxAttempts)
	}
	if c.Sarama != nil {
		if err := c.Sarama.Validate(); err != nil {
			bad("Sarama: %v", err)
		}
	}
	return errors.Join(errs...)
}

func parseTable(s string) (outboxschema.Table, error) {
	t, err := outboxschema.ParseTable(s)
	if err != nil {
		var te *outboxschema.TableError
		if errors.As(err, &te) {
			return t, fmt.Errorf("inbox: Table %q: %s", s, te.Reason)
		}
		return t, fmt.Errorf("inbox: Table: %w", err)
	}
	return t, nil
}
