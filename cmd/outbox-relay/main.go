// Command outbox-relay publishes the rows inserted into a PostgreSQL outbox
// table to Kafka, reading them from a pgoutput logical replication slot and
// confirming the slot only after Kafka acked them.
//
//	outbox-relay run      [--config FILE] [flags]   the relay
//	outbox-relay migrate  [--config FILE] [flags]   create the outbox table, index, publication and slot
//	outbox-relay dlq list|replay|resolve       inspect and replay dead-lettered events
//	outbox-relay version
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/rs/zerolog"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/deadletter"
	"github.com/outbox-relay/outbox-relay/leader"
	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/outboxschema"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/sink"
)

var version = "dev"

// Exit codes: 0 clean stop (also on SIGTERM/SIGINT), 1 fatal error, 2 bad
// configuration or usage.
const (
	exitOK     = 0
	exitFatal  = 1
	exitConfig = 2
)

func main() {
	os.Exit(realMain(os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

func realMain(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return exitConfig
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "version", "--version":
		fmt.Fprintln(stderr, "outbox-relay", version)
		return exitOK
	case "run", "migrate":
	case "dlq":
		return dlqMain(rest, getenv, stdout, stderr)
	case "help", "-h", "--help":
		usage(stderr)
		return exitOK
	default:
		fmt.Fprintf(stderr, "unknown command %q\n", cmd)
		usage(stderr)
		return exitConfig
	}
	cfg, err := loadConfig(cmd, rest, getenv)
	if errors.Is(err, flag.ErrHelp) {
		usage(stderr)
		fmt.Fprintln(stderr, "\nflags (each overrides its env variable, which overrides --config FILE):")
		for _, k := range keys {
			fmt.Fprintf(stderr, "  --%-26s %s (env %s)\n", k.flag, k.usage, k.env)
		}
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "invalid configuration:\n%v\n", indent(err))
		return exitConfig
	}
	log := newLogger(cfg.Log, stderr)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if cmd == "migrate" {
		return migrate(ctx, cfg, log)
	}
	return run(ctx, cfg, log)
}

func usage(w io.Writer) {
	fmt.Fprint(w, `usage: outbox-relay <command> [--config FILE] [flags]

commands:
  run       stream outbox inserts from the replication slot to Kafka
  migrate   create the outbox table, its index, the publication and the slot
  dlq       list | replay --id N | resolve --id N: dead-lettered events
  version   print the version

Run "outbox-relay run -h" for every flag; each has an OUTBOX_RELAY_* env twin.
`)
}

func indent(err error) string {
	var b []byte
	for _, line := range splitLines(err.Error()) {
		b = append(b, "  - "...)
		b = append(b, line...)
		b = append(b, '\n')
	}
	return string(b)
}

func splitLines(s string) []string {
	var out []string
	start := 0
	for i := 0; i < len(s); i++ {
		if s[i] == '\n' {
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return append(out, s[start:])
}

func newLogger(c LogConfig, w io.Writer) zerolog.Logger {
	lvl, _ := zerolog.ParseLevel(c.Level)
	var out io.Writer = w
	if c.Format == "console" {
		out = zerolog.ConsoleWriter{Out: w, TimeFormat: "15:04:05.000"}
	}
	zerolog.TimeFieldFormat = time.RFC3339Nano
	return zerolog.New(out).Level(lvl).With().Timestamp().Logger()
}

func migrate(ctx context.Context, cfg Config, log zerolog.Logger) int {
	schema, table, _ := outboxschema.SplitTable(cfg.Postgres.Table)
	conn, err := replication.Connect(ctx, cfg.Postgres.URL)
	if err != nil {
		log.Error().Err(err).Msg("migrate: connect to postgres")
		return exitFatal
	}
	applied, err := migrations.Apply(ctx, conn, migrations.Names{Schema: schema, Table: table, Publication: cfg.Postgres.Publication}, log)
	conn.Close(context.WithoutCancel(ctx))
	if err != nil {
		log.Error().Err(err).Msg("migrate failed")
		return exitFatal
	}
	// The slot is created here too, so every row inserted after migrate is
	// streamed even if the relay starts later.
	info, err := replication.Prepare(ctx, cfg.Postgres, true)
	if err != nil {
		log.Error().Err(err).Msg("migrate: slot and publication check failed")
		return exitFatal
	}
	log.Info().Ints("applied", applied).Str("slot", cfg.Postgres.Slot).Bool("slot_created", info.Created).
		Str("lsn", info.ConfirmedFlush.String()).Msg("migrate done")
	return exitOK
}

func run(ctx context.Context, cfg Config, log zerolog.Logger) int {
	log = log.With().Str("slot", cfg.Postgres.Slot).Logger()
	log.Info().Str("version", version).Str("config", cfg.redacted()).Msg("starting outbox-relay")

	base := prometheus.NewRegistry()
	base.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := &termGatherer{base: base}

	schema, table, _ := outboxschema.SplitTable(cfg.Postgres.Table)
	store, err := deadletter.Open(ctx, cfg.Postgres.URL, schema, table)
	if err != nil {
		log.Error().Err(err).Msg("dead-letter store")
		return exitConfig
	}
	defer store.Close()

	var elector *leader.Elector
	if cfg.Leader.Enabled {
		if cfg.Leader.InstanceID == "" {
			host, _ := os.Hostname()
			cfg.Leader.InstanceID = fmt.Sprintf("%s-%d", host, os.Getpid())
		}
		elector, err = leader.New(leader.Config{URL: cfg.Postgres.URL, Slot: cfg.Postgres.Slot, Schema: schema,
			InstanceID: cfg.Leader.InstanceID, TTL: cfg.Leader.LeaseTTL, Renew: cfg.Leader.RenewInterval,
			Poll: cfg.Leader.PollInterval}, log, leader.NewMetrics(base))
		if err != nil {
			log.Error().Err(err).Msg("leader config")
			return exitConfig
		}
	}
	var current atomic.Pointer[term] // the running leadership term, for /readyz
	ready := func() (bool, string) {
		if t := current.Load(); t != nil {
			return t.ready()
		}
		if elector == nil {
			return false, "starting"
		}
		if st := elector.Status(); st.Connected {
			return true, "standby: lease connection up, ready to take over from " + st.Holder
		} else {
			return false, "standby: lease connection down: " + st.LastError
		}
	}
	role := func() any {
		if elector == nil {
			return map[string]any{"role": "leader", "election": "disabled"}
		}
		return elector.Status()
	}
	if cfg.MetricsAddr != "" {
		srv, err := serveHTTP(cfg.MetricsAddr, cfg.Pprof, metrics, ready, role, log)
		if err != nil {
			log.Error().Err(err).Msg("metrics listener")
			return exitFatal
		}
		defer func() {
			sctx, c := context.WithTimeout(context.Background(), 2*time.Second)
			defer c()
			_ = srv.Shutdown(sctx)
		}()
	}
	lagCtx, stopLag := context.WithCancel(ctx)
	defer stopLag()
	go pollUnresolved(lagCtx, store, base, cfg.Postgres.LagPollInterval, log)

	// acked carries the ack watermark from one term to the next: Kafka's
	// acks stay true whoever leads, so a term that follows a lost lease
	// (a PostgreSQL restart ends every session) resends only what was not
	// acked, not everything since the slot's last confirmation.
	var acked pglogrepl.LSN
	lead := func(ctx context.Context, epoch int64) error {
		t := &term{cfg: cfg, log: log.With().Int64("epoch", epoch).Logger(), store: store, gatherer: metrics, start: acked}
		if elector != nil {
			t.fence = elector
		}
		current.Store(t)
		defer current.Store(nil)
		err := t.run(ctx)
		if tr := t.tracker.Load(); tr != nil {
			acked = max(acked, tr.Flushed())
		}
		return err
	}
	if elector != nil {
		err = elector.Run(ctx, lead)
	} else {
		err = lead(ctx, 0)
	}
	if err != nil {
		log.Error().Err(err).Msg("relay stopped on error; it resumes from the slot on restart")
		return exitFatal
	}
	log.Info().Msg("relay stopped")
	return exitOK
}

// term is one leadership term: a producer, a tracker, a pipeline and a
// replication stream, all new, so nothing of an earlier term (sarama's
// idempotent sequence numbers, in-flight events) leaks into it.
type term struct {
	cfg      Config
	log      zerolog.Logger
	store    *deadletter.Store
	gatherer *termGatherer
	fence    replication.Fence // nil when election is disabled
	start    pglogrepl.LSN     // acked by an earlier term of this process
	tracker  atomic.Pointer[checkpoint.Tracker]

	stream   atomic.Pointer[replication.Stream]
	pipe     atomic.Pointer[pipeline]
	producer atomic.Pointer[sink.Producer]
}

func (t *term) ready() (bool, string) {
	if p := t.pipe.Load(); p != nil && p.Halted() != nil {
		return false, "halted on a poison event: " + p.Halted().Error()
	}
	switch s, pr := t.stream.Load(), t.producer.Load(); {
	case s == nil || !s.Streaming():
		return false, "leader: replication not streaming"
	case pr == nil || !pr.Connected():
		return false, "leader: kafka not connected"
	}
	return true, "leader: streaming"
}

// fenced reports whether the term ended because the lease was lost.
func (t *term) fenced() bool { return t.fence != nil && !t.fence.Valid() }

func (t *term) run(ctx context.Context) error {
	cfg, log := t.cfg, t.log
	reg := prometheus.NewRegistry() // this term's metrics, shown while it runs
	t.gatherer.term.Store(reg)
	defer t.gatherer.term.Store(nil)

	producer, err := sink.New(cfg.Kafka, log, reg)
	if err != nil {
		return err
	}
	t.producer.Store(producer)
	if err := producer.Connect(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("cannot connect to kafka: %w", err)
	}
	// Publishing outlives the term's context by the shutdown timeout (see
	// pipeline.pubCtx), unless the lease was lost: then it stops at once.
	pubCtx, hardStop := context.WithCancel(context.Background())
	defer hardStop()
	context.AfterFunc(ctx, func() {
		if t.fenced() {
			hardStop()
			return
		}
		time.AfterFunc(cfg.ShutdownTimeout, hardStop)
	})
	producerDone := make(chan struct{})
	go func() {
		defer close(producerDone)
		_ = producer.Run(pubCtx)
	}()
	defer func() {
		// A fenced leader has stopped feeding the producer (pubCtx); what is
		// already inside it may still go out: duplicates, never a confirm.
		producer.Close(5 * time.Second)
		select {
		case <-producerDone:
		case <-time.After(10 * time.Second):
			log.Warn().Msg("kafka producer did not stop within 10s; abandoning it")
		}
	}()

	// The watermark starts at what earlier terms got acked (0 at first);
	// each replication session raises it to the slot's confirmed position
	// before streaming (Stream.session) and starts from there.
	tracker := checkpoint.New(t.start, checkpoint.Limits{MaxEvents: cfg.InFlight.MaxEvents, MaxBytes: cfg.InFlight.MaxBytes})
	t.tracker.Store(tracker)
	tmpl, _ := sink.ParseTemplate(cfg.Kafka.TopicTemplate)
	policy := poisonPolicy{halt: cfg.OnPoison == "halt", topic: cfg.DeadLetter.Topic, maxAttempts: cfg.DeadLetter.MaxAttempts,
		backoff: cfg.DeadLetter.RetryBackoff, transientMax: cfg.Kafka.RetryBackoffMax}
	pipe, err := newPipeline(cfg.Postgres.Table, tracker, producer, tmpl, t.store, policy, pubCtx, log, reg)
	if err != nil {
		return err
	}
	repMetrics := replication.NewMetrics(reg)
	stream, err := replication.NewStream(cfg.Postgres, pipe, log, repMetrics)
	if err != nil {
		return err
	}
	stream.DrainTimeout = cfg.ShutdownTimeout
	stream.Fence = t.fence
	t.stream.Store(stream)
	t.pipe.Store(pipe)

	lagCtx, stopLag := context.WithCancel(ctx)
	defer stopLag()
	go replication.PollLag(lagCtx, cfg.Postgres, repMetrics, log)

	err = stream.Run(ctx, pipe.Handle)
	log.Info().Str("lsn", tracker.Flushed().String()).Bool("fenced", t.fenced()).Err(err).Msg("leader term ended")
	return err
}

// termGatherer serves the process's own metrics plus those of the running
// leadership term: a standby shows no producer or slot metrics.
type termGatherer struct {
	base *prometheus.Registry
	term atomic.Pointer[prometheus.Registry]
}

func (g *termGatherer) Gather() ([]*dto.MetricFamily, error) {
	gs := prometheus.Gatherers{g.base}
	if t := g.term.Load(); t != nil {
		gs = append(gs, t)
	}
	return gs.Gather()
}

// pollUnresolved keeps outbox_relay_dlq_unresolved_rows current: the "DLQ
// size > 0, an operator is needed" alert of the seeds.
func pollUnresolved(ctx context.Context, store *deadletter.Store, reg prometheus.Registerer, every time.Duration, log zerolog.Logger) {
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "outbox_relay_dlq_unresolved_rows",
		Help: "Outbox rows dead-lettered and not yet replayed or resolved (outbox-relay dlq list)."})
	reg.MustRegister(g)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if n, err := store.Unresolved(ctx); err == nil {
			g.Set(float64(n))
		} else if ctx.Err() == nil {
			log.Debug().Err(err).Msg("count dead-lettered rows")
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func serveHTTP(addr string, profiling bool, g prometheus.Gatherer, ready func() (bool, string), role func() any, log zerolog.Logger) (*http.Server, error) {
	mux := http.NewServeMux()
	if profiling {
		mux.HandleFunc("/debug/pprof/", pprof.Index) // Index also serves allocs, heap, goroutine...
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	}
	mux.Handle("/metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	mux.HandleFunc("/role", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(role())
	})
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		ok, why := ready()
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		fmt.Fprintln(w, why)
	})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on metrics_addr %s: %w", addr, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error().Err(err).Msg("metrics server stopped")
		}
	}()
	log.Info().Str("addr", ln.Addr().String()).Msg("serving /metrics, /healthz, /readyz, /role")
	return srv, nil
}
