package inbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/outbox-relay/outbox-relay/backoff"
)

// Stats are a Consumer's counters since New; every field only grows.
type Stats struct {
	Consumed      int64 // records whose transaction ended (Applied + Duplicates + GaveUp)
	Applied       int64 // new events: the handler ran and committed
	Duplicates    int64 // records skipped because their event_id was already recorded
	GaveUp        int64 // records OnGiveUp took after MaxAttempts (or without event_id)
	HandlerErrors int64 // failed attempts: handler errors, and database errors around them
	Deleted       int64 // expired event ids the cleanup deleted
}

// Consumer handles the records of a consumer group once each. Make it with
// New, start it with Run.
type Consumer struct {
	cfg     Config
	db      DB
	handler Handler
	store   store
	log     zerolog.Logger

	consumed, applied, duplicates, gaveUp, handlerErrors, deleted atomic.Int64

	failed   atomic.Pointer[FailedError]
	mu       sync.Mutex
	running  bool
	closed   bool
	stopRun  context.CancelFunc
	runEnded chan struct{}
}

// New validates cfg and returns a Consumer; it does no I/O. db is normally
// a *pgxpool.Pool. With cfg.Registerer set, it registers the metrics
// outbox_relay_inbox_records_total{outcome="applied|duplicate|gave_up"},
// outbox_relay_inbox_handler_errors_total and
// outbox_relay_inbox_processed_events_deleted_total, labelled group.
func New(cfg Config, db DB, h Handler) (*Consumer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if db == nil || h == nil {
		return nil, errors.New("inbox: New needs a database (e.g. a *pgxpool.Pool) and a Handler")
	}
	t, _ := parseTable(cfg.Table)
	if cfg.Consumer == "" {
		cfg.Consumer = cfg.GroupID
	}
	if cfg.Sarama == nil {
		cfg.Sarama = SaramaConfig()
	}
	c := &Consumer{cfg: cfg, db: db, handler: h, store: newStore(t, cfg.Consumer),
		log: cfg.Logger.With().Str("component", "inbox").Str("group", cfg.GroupID).Logger()}
	if cfg.Registerer != nil {
		if err := c.register(cfg.Registerer); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func (c *Consumer) register(r prometheus.Registerer) error {
	labels := prometheus.Labels{"group": c.cfg.GroupID}
	counter := func(name, help string, extra prometheus.Labels, v *atomic.Int64) prometheus.Collector {
		l := prometheus.Labels{}
		for k, x := range labels {
			l[k] = x
		}
		for k, x := range extra {
			l[k] = x
		}
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: l}, func() float64 { return float64(v.Load()) })
	}
	const records = "outbox_relay_inbox_records_total"
	const recordsHelp = "Records the inbox consumer finished, by outcome: applied (handled), duplicate (event_id seen before, skipped), gave_up (OnGiveUp took it)."
	for _, m := range []prometheus.Collector{
		counter(records, recordsHelp, prometheus.Labels{"outcome": string(Applied)}, &c.applied),
		counter(records, recordsHelp, prometheus.Labels{"outcome": string(Duplicate)}, &c.duplicates),
		counter(records, recordsHelp, prometheus.Labels{"outcome": string(GaveUp)}, &c.gaveUp),
		counter("outbox_relay_inbox_handler_errors_total", "Failed attempts to handle a record (rolled back, retried).", nil, &c.handlerErrors),
		counter("outbox_relay_inbox_processed_events_deleted_total", "Expired event ids deleted from the processed events table.", nil, &c.deleted),
	} {
		if err := r.Register(m); err != nil {
			return fmt.Errorf("inbox: register metrics: %w", err)
		}
	}
	return nil
}

// Stats returns the counters; any goroutine, it does not block.
func (c *Consumer) Stats() Stats {
	return Stats{Consumed: c.consumed.Load(), Applied: c.applied.Load(), Duplicates: c.duplicates.Load(), GaveUp: c.gaveUp.Load(),
		HandlerErrors: c.handlerErrors.Load(), Deleted: c.deleted.Load()}
}

// Run consumes until ctx ends or Close is called (then it returns nil, after
// sarama committed the marked offsets) or a record fails for good (a
// *FailedError). Once the consumer group exists it retries Kafka errors by
// itself; an error creating the group (no broker reachable at start) is
// returned at once. Call it once, and not after Close (that is an error);
// it blocks.
func (c *Consumer) Run(ctx context.Context) error {
	c.mu.Lock()
	if c.running || c.closed {
		c.mu.Unlock()
		return errors.New("inbox: Run called twice, or after Close")
	}
	c.running = true
	ctx, cancel := context.WithCancel(ctx)
	c.stopRun, c.runEnded = cancel, make(chan struct{})
	c.mu.Unlock()
	defer close(c.runEnded)
	defer cancel()

	group, err := sarama.NewConsumerGroup(c.cfg.Brokers, c.cfg.GroupID, c.cfg.Sarama)
	if err != nil {
		return fmt.Errorf("inbox: consumer group %s: %w", c.cfg.GroupID, err)
	}
	var wg sync.WaitGroup
	defer func() {
		cancel()
		if err := group.Close(); err != nil { // commits the marked offsets; ends group.Errors()
			c.log.Warn().Err(err).Msg("close consumer group")
		}
		wg.Wait()
	}()
	if c.cfg.Sarama.Consumer.Return.Errors {
		wg.Go(func() {
			for err := range group.Errors() {
				c.log.Warn().Err(err).Msg("kafka consumer error")
			}
		})
	}
	if c.cfg.CleanupInterval >= 0 {
		wg.Go(func() { c.cleanupLoop(ctx) })
	}
	b := backoff.Backoff{Policy: backoff.Policy{Initial: 200 * time.Millisecond, Max: 10 * time.Second}}
	for {
		err := group.Consume(ctx, c.cfg.Topics, groupHandler{c: c, cancel: cancel})
		if f := c.failed.Load(); f != nil {
			return f
		}
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, sarama.ErrClosedConsumerGroup) {
			return nil
		}
		if err != nil {
			c.log.Warn().Err(err).Msg("consume failed; retrying")
			if backoff.Sleep(ctx, b.Next()) != nil {
				return nil
			}
			continue
		}
		b.Reset()
	}
}

// Close stops Run and waits for it to return; idempotent, any goroutine.
func (c *Consumer) Close() error {
	c.mu.Lock()
	c.closed = true
	stop, ended := c.stopRun, c.runEnded
	c.mu.Unlock()
	if stop != nil {
		stop()
		<-ended
	}
	return nil
}

type groupHandler struct {
	c      *Consumer
	cancel context.CancelFunc
}

func (groupHandler) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (groupHandler) Cleanup(sarama.ConsumerGroupSession) error { return nil }

// ConsumeClaim handles one partition's records one at a time: each is
// marked only after its transaction committed.
func (g groupHandler) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	ctx := sess.Context()
	for {
		select {
		case <-ctx.Done():
			return nil
		case r, ok := <-claim.Messages():
			if !ok {
				return nil
			}
			if err := g.c.handle(ctx, r); err != nil {
				var f *FailedError
				if errors.As(err, &f) {
					g.c.failed.CompareAndSwap(nil, f)
					g.cancel()
				}
				return nil // not marked: delivered again to this group
			}
			sess.MarkMessage(r, "")
		}
	}
}

// handle runs one record to an outcome, retrying failed attempts; an error
// means it must not be marked (ctx ended, or a *FailedError).
func (c *Consumer) handle(ctx context.Context, r *sarama.ConsumerMessage) error {
	m, perr := ParseMessage(r)
	log := c.log.With().Str("topic", r.Topic).Int32("partition", r.Partition).Int64("offset", r.Offset).Str("event_id", m.EventID).Logger()
	if perr != nil {
		c.handlerErrors.Add(1)
		log.Error().Err(perr).Msg("record is no valid CloudEvent")
		return c.giveUp(ctx, m, perr, 1, log)
	}
	if m.EventID == "" {
		c.handlerErrors.Add(1)
		log.Error().Err(ErrNoEventID).Msg("record without event_id")
		return c.giveUp(ctx, m, ErrNoEventID, 1, log)
	}
	decoded := false
	for attempt := 1; ; attempt++ {
		m.Attempt = attempt
		var o Outcome
		err := c.decode(ctx, m, &decoded)
		if err == nil {
			o, err = c.apply(ctx, m)
		}
		if err == nil {
			c.done(m, o)
			log.Debug().Str("outcome", string(o)).Msg("record handled")
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		c.handlerErrors.Add(1)
		if c.cfg.MaxAttempts > 0 && attempt >= c.cfg.MaxAttempts {
			log.Error().Err(err).Int("attempt", attempt).Msg("handler failed; attempts spent")
			return c.giveUp(ctx, m, err, attempt, log)
		}
		d := c.cfg.Retry.Delay(attempt)
		log.Warn().Err(err).Int("attempt", attempt).Dur("retry_in", d).Msg("handler failed; rolled back, retrying")
		if err := backoff.Sleep(ctx, d); err != nil {
			return err
		}
	}
}

// decode replaces a wire-format payload with what Config.Decoder makes of
// it, once; without a Decoder, or for another value, it does nothing.
func (c *Consumer) decode(ctx context.Context, m *Message, decoded *bool) error {
	if c.cfg.Decoder == nil || *decoded {
		return nil
	}
	id, ok := WireSchemaID(m.Payload)
	if !ok {
		return nil
	}
	p, got, err := c.cfg.Decoder.Decode(ctx, m.Topic, m.Payload)
	if err != nil {
		return fmt.Errorf("inbox: decode record %s/%d@%d (schema id %d): %w", m.Topic, m.Partition, m.Offset, id, err)
	}
	m.Payload, m.SchemaID, *decoded = p, got, true
	return nil
}

func (c *Consumer) done(m *Message, o Outcome) {
	c.consumed.Add(1)
	switch o {
	case Applied:
		c.applied.Add(1)
	case Duplicate:
		c.duplicates.Add(1)
	case GaveUp:
		c.gaveUp.Add(1)
	}
	if c.cfg.Observe != nil {
		c.cfg.Observe(m, o)
	}
}

// apply is one attempt: record the id, handle if new, commit.
func (c *Consumer) apply(ctx context.Context, m *Message) (Outcome, error) {
	return c.inTx(ctx, m, func(tx pgx.Tx) error { return c.handler(ctx, tx, m) })
}

// inTx records m's event id (if any) in a new transaction, runs f if the
// id is new and commits; Duplicate when the id was there.
func (c *Consumer) inTx(ctx context.Context, m *Message, f func(pgx.Tx) error) (Outcome, error) {
	tx, err := c.db.Begin(ctx)
	if err != nil {
		return "", fmt.Errorf("inbox: begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) // a no-op after Commit
	if m.EventID != "" {
		isNew, err := c.store.record(ctx, tx, m.EventID)
		if err != nil {
			return "", err
		}
		if !isNew {
			return Duplicate, nil
		}
	}
	if err := f(tx); err != nil {
		return "", err
	}
	if err := tx.Commit(ctx); err != nil {
		// The commit may have happened: the retry then finds the id and
		// skips, which is right either way.
		return "", fmt.Errorf("inbox: commit: %w", err)
	}
	return Applied, nil
}

// giveUp hands a failed record to OnGiveUp in a transaction that records
// its id, or fails the consumer.
func (c *Consumer) giveUp(ctx context.Context, m *Message, cause error, attempts int, log zerolog.Logger) error {
	fail := &FailedError{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset, EventID: m.EventID, Attempts: attempts, Err: cause}
	if c.cfg.OnGiveUp == nil {
		log.Error().Err(fail).Msg("stopping the consumer")
		return fail
	}
	o, err := c.inTx(ctx, m, func(tx pgx.Tx) error { return c.cfg.OnGiveUp(ctx, tx, m, cause) })
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		fail.Err = fmt.Errorf("%w; then OnGiveUp failed: %v", cause, err)
		log.Error().Err(fail).Msg("stopping the consumer")
		return fail
	}
	if o == Applied {
		o = GaveUp
	}
	c.done(m, o)
	log.Warn().Err(cause).Str("outcome", string(o)).Msg("record given up and handed to OnGiveUp")
	return nil
}

// Cleanup deletes this consumer's event ids older than TTL, CleanupBatch
// rows per statement, until none is left or ctx ends; it returns how many
// it deleted. Run calls it every CleanupInterval; any goroutine may call
// it too. It blocks on the database.
func (c *Consumer) Cleanup(ctx context.Context) (int64, error) {
	var total int64
	for {
		tag, err := c.db.Exec(ctx, c.store.cleanup, c.cfg.Consumer, c.cfg.TTL.Seconds(), c.cfg.CleanupBatch)
		if err != nil {
			return total, fmt.Errorf("inbox: delete expired event ids from %s: %w", c.store.table, err)
		}
		n := tag.RowsAffected()
		total += n
		c.deleted.Add(n)
		if n < int64(c.cfg.CleanupBatch) {
			return total, nil
		}
	}
}

func (c *Consumer) cleanupLoop(ctx context.Context) {
	every := c.cfg.CleanupInterval
	if every == 0 {
		every = time.Hour
	}
	for {
		if n, err := c.Cleanup(ctx); err != nil && ctx.Err() == nil {
			c.log.Warn().Err(err).Msg("processed events cleanup failed; retried at the next interval")
		} else if n > 0 {
			c.log.Info().Int64("deleted", n).Dur("ttl", c.cfg.TTL).Msg("expired event ids deleted")
		}
		if backoff.Sleep(ctx, every) != nil {
			return
		}
	}
}
