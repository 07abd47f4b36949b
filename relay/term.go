package relay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/deadletter"
	"github.com/outbox-relay/outbox-relay/encode"
	"github.com/outbox-relay/outbox-relay/exactlyonce"
	"github.com/outbox-relay/outbox-relay/internal/pg"
	"github.com/outbox-relay/outbox-relay/outboxschema"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/retention"
	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/standby"
)

// term is one leadership term: a producer, a pipeline (with its tracker)
// and a replication stream, all new, so nothing of an earlier term
// (sarama's idempotent sequence numbers, in-flight events) leaks into it.
// Its fields are set before the term is published to Health and never
// change.
type term struct {
	log      zerolog.Logger
	fence    replication.Fence // nil when election is disabled
	producer termProducer
	pipe     *Pipeline
	stream   *replication.Stream
	lag      *replication.LagPoller
	cleaner  *retention.Cleaner
	gate     *standby.Gate // nil unless postgres.standby_slots
	enc      *encode.Stage // nil for plain JSON
	// maxUnackedAge: older unacked events make the term not ready.
	maxUnackedAge time.Duration
}

// termProducer is the term's Kafka side: the at-least-once producer
// (*sink.Producer) or, under delivery: exactly_once, the transactional
// delivery (*exactlyonce.Delivery). Run connects (Ready closes when
// publishing may start) and runs until Close or ctx ends; OnAcked takes
// the pipeline's ack path before Run.
type termProducer interface {
	Run(ctx context.Context) error
	Ready() <-chan struct{}
	Connected() bool
	Close()
	OnAcked(f func(msgs []*sink.Message, at time.Time))
}

func (t *term) ready() (bool, string) {
	if err := t.pipe.Halted(); err != nil {
		return false, "halted: " + err.Error()
	}
	if t.gate != nil {
		if ok, why := t.gate.Ready(); !ok {
			return false, why
		}
	}
	if since, err := t.enc.Unavailable(); !since.IsZero() {
		return false, fmt.Sprintf("leader: waiting %s for the schema registry (schema_registry.url): %v",
			time.Since(since).Round(100*time.Millisecond), err)
	}
	// Before the connection checks: whatever holds the acks back (a silent
	// broker, a topic sarama waits for, a row mark), the age says so.
	if age := t.pipe.OldestUnacked(); age > t.maxUnackedAge {
		return false, fmt.Sprintf("leader: the oldest unacked event has waited %s for Kafka's ack, over max_unacked_age %s",
			age.Round(100*time.Millisecond), t.maxUnackedAge)
	}
	switch {
	case !t.stream.Streaming():
		return false, "leader: replication not streaming"
	case !t.producer.Connected():
		return false, "leader: kafka not connected"
	}
	return true, "leader: streaming"
}

// heartbeatPrefix is the prefix of this relay's heartbeat Messages, or ""
// when heartbeats are off.
func heartbeatPrefix(cfg Config) string {
	if cfg.Heartbeat.Interval <= 0 {
		return ""
	}
	return replication.HeartbeatPrefix(cfg.Postgres.Slot)
}

// fenced reports whether the term ended because the lease was lost.
func (t *term) fenced() bool { return t.fence != nil && !t.fence.Valid() }

// runTerm runs one leadership term. ctx ending stops it: gracefully (the
// stream drains until hard ends, then confirms), or at once when the lease
// was lost, since a fenced leader may confirm nothing.
func (r *Relay) runTerm(ctx, hard context.Context, epoch int64, store *deadletter.Store) error {
	cfg := r.cfg
	t := &term{log: r.log.With().Int64("epoch", epoch).Logger(), maxUnackedAge: cfg.MaxUnackedAge, enc: r.enc}
	if r.elector != nil {
		t.fence = r.elector
	}
	reg := prometheus.NewRegistry() // this term's metrics, served while it runs
	var err error
	var out Delivery
	var enc Encoder // nil, not a nil *encode.Stage, for plain JSON
	if r.enc != nil {
		enc = r.enc
	}
	var catchingUp func(bool) // the producer's, at least once: it batches harder while the stream catches up
	if cfg.Delivery == ExactlyOnce {
		o := exactlyonce.Options{Slot: cfg.Postgres.Slot, MaxEvents: cfg.InFlight.MaxEvents, MaxBytes: cfg.InFlight.MaxBytes,
			SystemID: func(ctx context.Context) (string, error) {
				id, err := pg.IdentifySystem(ctx, cfg.Postgres.URL)
				return id.SystemID, err
			},
			Activity: func() uint64 { return t.pipe.Handled() }, Log: t.log, Registerer: reg}
		if t.fence != nil {
			o.Valid = t.fence.Check
		}
		e, err := exactlyonce.New(cfg.ExactlyOnce, cfg.Kafka, o)
		if err != nil {
			return err
		}
		t.producer, out = e, e
	} else {
		p, err := sink.New(cfg.Kafka, t.log, reg)
		if err != nil {
			return err
		}
		catchingUp = p.CatchingUp
		t.producer, out = p, atLeastOnce{p}
	}
	t.pipe, err = NewPipeline(PipelineConfig{Table: cfg.Postgres.Table, Template: r.tmpl, Outboxes: r.outboxes, Format: cfg.Compat, Start: r.acked, Kept: r.kept,
		MaxTopics: cfg.Kafka.MaxTopics, Allowlist: r.allow, HeartbeatPrefix: heartbeatPrefix(cfg),
		MessagePrefix: cfg.Messages.Prefix, Publication: cfg.Postgres.Publication,
		Limits: checkpoint.Limits{MaxEvents: cfg.InFlight.MaxEvents, MaxBytes: cfg.InFlight.MaxBytes},
		Policy: cfg.Policy(), Encoder: enc,
	}, out, store, t.log, reg)
	if err != nil {
		return err
	}
	t.producer.OnAcked(t.pipe.Acked)
	if len(cfg.Postgres.StandbySlots) > 0 {
		t.gate = standby.New(cfg.Postgres.URL, cfg.Postgres.StandbySlots, t.log, standby.NewMetrics(reg))
		t.pipe.SetStandby(t.gate)
	}
	repMetrics := replication.NewMetrics(reg)
	if t.stream, err = replication.NewStream(cfg.Postgres, t.pipe, t.log, repMetrics); err != nil {
		return err
	}
	t.stream.Fence = t.fence
	t.stream.OnCatchUp = catchingUp
	t.stream.OnPrepared = t.pipe.Prepared
	t.stream.Messages = cfg.Heartbeat.Interval > 0 || cfg.Messages.Prefix != ""
	t.stream.MessagePrefix = cfg.Messages.Prefix
	// The stream compares the server it streams from with this history and
	// discards the carried watermark if they differ (failover between terms).
	t.stream.SetIdentity(r.history)
	t.lag = replication.NewLagPoller(cfg.Postgres, repMetrics, t.log)
	tbl, _ := outboxschema.ParseTable(cfg.Postgres.Table) // valid: checked in New
	// Leader only: the horizon and retention run in the term, on their own
	// connection; a database error there is retried and never ends the term.
	// Retention needs the relay's own table (created_at, published_at, a
	// BIGINT id): off otherwise, said once at start (logOutboxes).
	if len(r.outboxes) == 1 && r.outboxes[0].Own {
		t.cleaner, err = retention.New(cfg.Retention, retention.Horizon{Table: tbl, Slot: cfg.Postgres.Slot, Publication: cfg.Postgres.Publication},
			func(ctx context.Context) (*pgx.Conn, error) { return pg.Connect(ctx, cfg.Postgres.URL) }, r.retention, t.log)
		if err != nil {
			return err
		}
	}

	r.termReg.Store(reg)
	r.current.Store(t)
	defer func() {
		r.current.Store(nil)
		r.termReg.Store(nil)
		// Not max(): the pipeline started at r.acked and only a reset (a
		// changed history, a slot behind the watermark) took it lower.
		r.acked, r.history, r.kept = t.pipe.Flushed(), t.stream.Identity(), t.pipe.Kept()
		t.log.Info().Str("lsn", t.pipe.Flushed().String()).Bool("fenced", t.fenced()).Err(err).Msg("leader term ended")
	}()

	// The term's hard stop: the relay's deadline, or now if the lease is lost.
	hard, stopHard := context.WithCancel(hard)
	defer stopHard()
	defer context.AfterFunc(ctx, func() {
		if t.fenced() {
			stopHard()
		}
	})()
	g, gctx := errgroup.WithContext(hard)
	after, stopAfter := context.WithCancel(gctx) // ends when the stream is done
	g.Go(func() error { return t.producer.Run(gctx) })
	g.Go(func() error { return t.pipe.Run(after) })
	g.Go(func() error { return t.lag.Run(after) })
	if t.gate != nil {
		g.Go(func() error { return t.gate.Run(after) })
	}
	if cfg.Heartbeat.Interval > 0 {
		// Leader only: a standby's heartbeats would time nothing.
		emitted := func(end pglogrepl.LSN, sent time.Time) {
			t.pipe.Emitted(end, sent)
			t.stream.ServerAt(end) // how far the server's WAL is: the stream batches reads when far behind
		}
		hb := replication.NewHeartbeater(cfg.Postgres, cfg.Heartbeat.Interval, emitted, t.log, r.heartbeats)
		g.Go(func() error { return hb.Run(after) })
	}
	// Leader only: makes the server write the slot's confirmed position
	// (replication.SlotSaver), so a PostgreSQL restart takes it back by
	// about a second of events, not to its last write; idle, nothing.
	saver := replication.NewSlotSaver(cfg.Postgres, replication.SlotSaveInterval, t.stream.Confirmed, t.pipe.EventLSN, t.log, r.slotSaves)
	g.Go(func() error { return saver.Run(after) })
	if t.cleaner != nil {
		g.Go(func() error { return t.cleaner.Run(after) })
	}
	g.Go(func() error {
		defer stopAfter()
		defer t.producer.Close() // after the stream's drain: flush what is left, then stop
		select {
		case <-t.producer.Ready():
		case <-ctx.Done():
			return nil
		case <-gctx.Done():
			return nil
		}
		defer context.AfterFunc(ctx, t.stream.Close)()
		return t.stream.Run(gctx, t.pipe.Handle)
	})
	err = g.Wait()
	if err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	err = nil
	return nil
}
