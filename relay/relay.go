// Package relay is outbox-relay itself: the pipeline from the replication
// slot to Kafka (decode, build records with package record, write them in
// their topic's format with package encode, hand each transaction to one
// Delivery, book acks, apply the poison policy, rewind),
// the leadership terms it runs in, its health, and the one shutdown
// deadline that bounds all of it. The pipeline knows no delivery mode: a
// term gives it at-least-once (the producer) or exactlyonce.Delivery.
// cmd/outbox-relay only loads the config and wires a Relay; other programs
// can embed one the same way.
package relay

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"github.com/outbox-relay/outbox-relay/deadletter"
	"github.com/outbox-relay/outbox-relay/encode"
	"github.com/outbox-relay/outbox-relay/history"
	"github.com/outbox-relay/outbox-relay/internal/pg"
	"github.com/outbox-relay/outbox-relay/leader"
	"github.com/outbox-relay/outbox-relay/outboxschema"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/retention"
	"github.com/outbox-relay/outbox-relay/sink"
)

// ExitMargin is how long after ShutdownTimeout Run may still take: the
// final status update, closing connections and handing the lease over,
// each bounded by a second. An orchestrator's grace period must exceed
// ShutdownTimeout + ExitMargin (Kubernetes: 30s + 5s < 45s).
const ExitMargin = 5 * time.Second

// Deps are what a Relay takes from its host program.
type Deps struct {
	Log zerolog.Logger
	// Registry gets the process-wide metrics (lease, dead-letter rows);
	// each leadership term registers its own in a registry of its own,
	// served by Gatherer while the term runs. nil: a new registry.
	Registry *prometheus.Registry
}

// Relay is one relay instance: a standby or the leader of its slot. New,
// then Run once; Close and Health from any goroutine.
type Relay struct {
	cfg     Config
	log     zerolog.Logger
	base    *prometheus.Registry
	termReg atomic.Pointer[prometheus.Registry] // the running term's metrics
	tmpl    sink.Template
	allow   sink.Allowlist
	// outboxes are the outbox tables read (Config.Outboxes).
	outboxes []Outbox
	elector  *leader.Elector // nil when leader election is disabled
	// enc writes records in their topic's format (serialization,
	// envelope); nil for plain JSON. Process-wide: its schema cache
	// outlives a term.
	enc     *encode.Stage
	server  *Server // nil when metrics_addr is empty
	dlqRows prometheus.Gauge
	// heartbeats counts every term's heartbeats; process-wide.
	heartbeats *replication.HeartbeatMetrics
	// slotSaves counts every term's replication.SlotSaver; process-wide.
	slotSaves *replication.SlotSaveMetrics
	// retention metrics live in the base registry: a standby exports 0.
	retention *retention.Metrics

	current atomic.Pointer[term] // the running leadership term, for Health
	acked   pglogrepl.LSN        // carried from term to term; the leadership goroutine's
	history pg.Identity          // the server history acked is on; carried like acked
	kept    history.Point        // the last transaction acked (Pipeline.Kept); carried like acked

	closing   chan struct{}
	closeOnce sync.Once
}

// New validates cfg and allocates; it does no I/O and starts nothing.
func New(cfg Config, deps Deps) (*Relay, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	tmpl, err := sink.ParseTemplate(cfg.Kafka.TopicTemplate)
	if err != nil {
		return nil, fmt.Errorf("kafka.topic_template: %w", err)
	}
	allow, err := sink.ParseAllowlist(cfg.Kafka.TopicAllowlist)
	if err != nil {
		return nil, fmt.Errorf("kafka.topic_allowlist: %w", err)
	}
	if deps.Registry == nil {
		deps.Registry = prometheus.NewRegistry()
	}
	outboxes, err := cfg.Outboxes()
	if err != nil {
		return nil, err
	}
	cfg.Postgres.Mappings = Mappings(outboxes)
	r := &Relay{cfg: cfg, log: deps.Log, base: deps.Registry, tmpl: tmpl, allow: allow, outboxes: outboxes, closing: make(chan struct{})}
	r.logOutboxes()
	r.dlqRows = prometheus.NewGauge(prometheus.GaugeOpts{Name: "outbox_relay_dlq_unresolved_rows",
		Help: "Outbox rows dead-lettered and not yet replayed or resolved (outbox-relay dlq list)."})
	r.base.MustRegister(r.dlqRows, newReadyGauge(r.Health))
	r.heartbeats = replication.NewHeartbeatMetrics(r.base)
	r.slotSaves = replication.NewSlotSaveMetrics(r.base)
	// Registered here, not in a term's registry, so that a standby exports 0.
	r.base.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "outbox_relay_lag_seconds",
		Help: "Age of the oldest committed outbox event not yet acked by Kafka (nor dead-lettered), including events not yet read from the slot, " +
			"timed by heartbeats written through the slot every heartbeat.interval: it may be under by at most one interval. " +
			"0 on a standby. With heartbeats off or failing, only events already read count."},
		func() float64 {
			if t := r.current.Load(); t != nil {
				return t.pipe.Lag().Seconds()
			}
			return 0
		}))
	r.retention = retention.NewMetrics(r.base)
	if r.enc, err = encode.New(cfg.Encoding(), r.log, r.base); err != nil {
		return nil, err
	}
	if cfg.Leader.Enabled {
		id := cfg.Leader.InstanceID
		if id == "" {
			host, _ := os.Hostname()
			id = fmt.Sprintf("%s-%d", host, os.Getpid())
		}
		tbl, _ := outboxschema.ParseTable(cfg.Postgres.Table) // valid: checked above
		r.elector, err = leader.New(leader.Config{URL: cfg.Postgres.URL, Slot: cfg.Postgres.Slot, Schema: tbl.Schema,
			InstanceID: id, TTL: cfg.Leader.LeaseTTL, Renew: cfg.Leader.RenewInterval, Poll: cfg.Leader.PollInterval},
			r.log, leader.NewMetrics(r.base))
		if err != nil {
			return nil, err
		}
	}
	if cfg.MetricsAddr != "" {
		r.server = NewServer(cfg.MetricsAddr, cfg.Pprof, r, r.log)
	}
	return r, nil
}

// logOutboxes says at start which tables are read how, and which features
// are off for a table that is not the relay's own (they need its columns).
func (r *Relay) logOutboxes() {
	for _, o := range r.outboxes {
		m := o.Mapping
		ev := r.log.Info().Str("table", m.Table.String()).Str("compat", r.cfg.Compat).
			Str("id", m.ID).Str("key", m.Key).Str("type", m.Type).Str("payload", m.Payload).
			Str("route_by", m.RouteBy).Str("headers", m.Headers).Int("additional", len(m.Additional))
		ev.Msg("outbox table")
		if !o.Own {
			r.log.Warn().Str("table", m.Table.String()).
				Msg("dead-letter row marks, retention (cleanup, the delivery horizon, outbox_relay_undelivered_events) and replay are off for this table: " +
					"they need the relay's own table (postgres.table with the default columns, no compat, no tables list). " +
					"Poison events still go to the dead-letter topic, and the slot still never passes an event not acked or dead-lettered (docs/configuration.md#column-mapping)")
		}
	}
}

// Close asks Run to stop gracefully, like the end of Run's ctx.
// Idempotent; does not block.
func (r *Relay) Close() { r.closeOnce.Do(func() { close(r.closing) }) }

// Run runs the relay until ctx ends, Close is called or a fatal error.
// Stopping is graceful and bounded by one deadline: reading stops, Kafka's
// acks are awaited until ShutdownTimeout has passed since the stop began,
// the final position is confirmed, the lease handed over; Run returns
// within ShutdownTimeout + ExitMargin. It returns nil on a stop, else the
// error that ended it (the slot keeps everything not acked).
func (r *Relay) Run(ctx context.Context) error {
	soft, stopSoft := context.WithCancel(ctx)
	defer stopSoft()
	hard, stopHard := context.WithCancel(context.WithoutCancel(ctx))
	defer stopHard()
	// The one shutdown deadline: every graceful wait below ends at hard.
	unhook := context.AfterFunc(soft, func() { time.AfterFunc(r.cfg.ShutdownTimeout, stopHard) })
	defer unhook()

	defer r.enc.Close()
	tbl, _ := outboxschema.ParseTable(r.cfg.Postgres.Table)
	store, err := deadletter.Open(soft, r.cfg.Postgres.URL, tbl.Schema, tbl.Name) // connects lazily
	if err != nil {
		return err
	}
	defer store.Close()

	g, gctx := errgroup.WithContext(hard)
	aux, stopAux := context.WithCancel(gctx) // what serves until the leadership part is over
	defer stopAux()
	g.Go(func() error {
		select {
		case <-r.closing:
			stopSoft()
		case <-soft.Done():
		}
		return nil
	})
	if r.server != nil {
		g.Go(func() error { return r.server.Run(aux) })
	}
	if len(r.outboxes) == 1 && r.outboxes[0].Own { // other tables have no dead-letter row marks
		g.Go(func() error { return r.pollDeadLetters(aux, store) })
	}
	g.Go(func() error {
		defer stopAux()
		defer stopSoft()
		lead := func(tctx context.Context, epoch int64) error { return r.runTerm(tctx, gctx, epoch, store) }
		if r.elector == nil {
			tctx, cancel := context.WithCancel(gctx)
			defer context.AfterFunc(soft, cancel)()
			defer cancel()
			return lead(tctx, 0)
		}
		defer context.AfterFunc(soft, r.elector.Close)()
		return r.elector.Run(gctx, lead)
	})
	return g.Wait()
}

// Health is a snapshot for /readyz and /role.
type Health struct {
	Ready  bool
	Reason string
	Role   any // leader.Status, or a fixed leader role when election is off
}

// Health reports whether this instance does its job: as the leader,
// replication streams, Kafka is reachable and nothing halted it; as a
// standby, its lease connection works so it can take over. Any goroutine.
func (r *Relay) Health() Health {
	h := Health{Role: map[string]any{"role": "leader", "election": "disabled"}}
	if r.elector != nil {
		h.Role = r.elector.Status()
	}
	switch t := r.current.Load(); {
	case t != nil:
		h.Ready, h.Reason = t.ready()
	case r.elector == nil:
		h.Reason = "starting"
	default:
		switch st := r.elector.Status(); {
		case !st.Connected:
			h.Reason = "standby: lease connection down: " + st.LastError
		case st.Holder == "" || st.Holder == st.Instance:
			// Nobody leads yet (a first start, a lease just freed) or this
			// instance won and its term is starting: ready only once it
			// streams, not a moment before as a standby of no one.
			h.Reason = "standby: no leader yet, electing"
		default:
			h.Ready, h.Reason = true, "standby: lease connection up, ready to take over from "+st.Holder
		}
	}
	return h
}

// Gather serves the process's metrics plus those of the running term: a
// standby shows no producer or slot metrics.
func (r *Relay) Gather() ([]*dto.MetricFamily, error) {
	gs := prometheus.Gatherers{r.base}
	if t := r.termReg.Load(); t != nil {
		gs = append(gs, t)
	}
	return gs.Gather()
}

// pollDeadLetters keeps outbox_relay_dlq_unresolved_rows current: the "DLQ
// size > 0, an operator is needed" alert of the seeds.
func (r *Relay) pollDeadLetters(ctx context.Context, store *deadletter.Store) error {
	t := time.NewTicker(r.cfg.Postgres.LagPollInterval)
	defer t.Stop()
	for {
		if n, err := store.Unresolved(ctx); err == nil {
			r.dlqRows.Set(float64(n))
		} else if ctx.Err() == nil {
			r.log.Debug().Err(err).Msg("count dead-lettered rows")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
