// Command outbox-relay publishes the rows inserted into a PostgreSQL outbox
// table to Kafka, reading them from a pgoutput logical replication slot and
// confirming the slot only after Kafka acked them.
//
//	outbox-relay run      [--config FILE] [flags]   the relay
//	outbox-relay migrate  [--config FILE] [flags]   create the outbox table, index, publication and slot
//	outbox-relay dlq list|replay|resolve       inspect and replay dead-lettered events
//	outbox-relay status   [--json] [--id N]   health from PostgreSQL alone; exit 0 ok, 4 warn, 3 bad
//	outbox-relay replay --since TIME|--from-id N [...]   republish outbox rows from the table
//	outbox-relay cleanup [--dry-run]           retention now: remove delivered rows older than retention.keep
//	outbox-relay check [--json] [--print-grants ROLE]   preflight: every check with its fix; exit 0 ok, 4 warn, 3 fail
//	outbox-relay version
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/rs/zerolog"

	"github.com/outbox-relay/outbox-relay/internal/pg"
	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/outboxschema"
	"github.com/outbox-relay/outbox-relay/pgsetup"
	"github.com/outbox-relay/outbox-relay/relay"
)

var version = "dev"

// Exit codes: 0 clean stop (also on SIGTERM/SIGINT), 1 fatal error, 2 bad
// configuration or usage. status and check add theirs: 3 a check bad or
// failed, 4 a warning (report.ExitBad, report.ExitWarn).
const (
	exitOK     = 0
	exitFatal  = 1
	exitConfig = 2
)

func main() {
	os.Exit(realMain(os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

// realMain is main with its inputs and outputs given: it runs the command
// line args (without the program name) and returns the exit code.
func realMain(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return exitConfig
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "version", "--version":
		fmt.Fprintln(stdout, "outbox-relay", version)
		return exitOK
	case "help", "-h", "--help":
		usage(stdout)
		return exitOK
	case "dlq":
		return dlqMain(rest, getenv, stdout, stderr)
	}
	c, ok := commands[cmd]
	if !ok {
		fmt.Fprintf(stderr, "unknown command %q\n", cmd)
		usage(stderr)
		return exitConfig
	}
	return runCommand(cmd, c(), rest, getenv, stdout, stderr)
}

// newLogger is the logger of c (level, json or console) writing to w.
func newLogger(c LogConfig, w io.Writer) zerolog.Logger {
	lvl, _ := zerolog.ParseLevel(c.Level)
	var out io.Writer = w
	if c.Format == "console" {
		out = zerolog.ConsoleWriter{Out: w, TimeFormat: "15:04:05.000"}
	}
	zerolog.TimeFieldFormat = time.RFC3339Nano
	// Durations as Go writes them ("retry_in":"1.5s"), never a bare number
	// of milliseconds.
	zerolog.DurationFieldFormat = zerolog.DurationFormatString
	return zerolog.New(out).Level(lvl).With().Timestamp().Logger()
}

// migrate is `outbox-relay migrate`: the outbox table (partitioned when
// postgres.partition says so and it is new), its index and the relay's
// helper tables, the publication and the slot; with a column mapping,
// only the helper tables, the publication and the slot.
func migrate(ctx context.Context, cfg Config, _, _ io.Writer, log zerolog.Logger) int {
	tbl, _ := outboxschema.ParseTable(cfg.Postgres.Table) // valid: loadConfig checked it
	conn, err := pg.Connect(ctx, cfg.Postgres.URL)
	if err != nil {
		log.Error().Err(err).Msg("migrate: connect to postgres")
		return exitFatal
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if cfg.Postgres.Mappings != nil {
		// compat, columns or tables: the outbox tables are the user's and
		// stay as they are; only the relay's helper tables (beside
		// postgres.table), the publication and the slot are created.
		if err := migrations.ApplyHelpers(ctx, conn, migrations.Names{Schema: tbl.Schema, Table: tbl.Name, Publication: cfg.Postgres.Publication}); err != nil {
			log.Error().Err(err).Msg("migrate failed")
			return exitFatal
		}
		conn.Close(context.WithoutCancel(ctx))
		info, err := pgsetup.Prepare(ctx, cfg.Postgres.Config, true, pg.Identity{}, log)
		if err != nil {
			log.Error().Err(err).Msg("migrate: outbox tables, slot and publication check failed")
			return exitFatal
		}
		log.Info().Str("slot", cfg.Postgres.Slot).Bool("slot_created", info.Created).Str("lsn", info.ConfirmedFlush.String()).
			Msg("migrate done: mapped outbox tables left as they are; helper tables, publication and slot ready")
		return exitOK
	}
	// Before migration 0001 (CREATE TABLE IF NOT EXISTS): a missing outbox
	// is created partitioned when postgres.partition asks for it.
	created, err := migrations.CreatePartitionedOutbox(ctx, conn, tbl, cfg.Postgres.Partition, log)
	if err != nil {
		log.Error().Err(err).Msg("migrate: create the partitioned outbox")
		return exitFatal
	}
	if created {
		log.Info().Str("table", tbl.String()).Str("partition", cfg.Postgres.Partition).Msg("outbox table created partitioned by created_at, with a DEFAULT partition")
	}
	applied, err := migrations.Apply(ctx, conn, migrations.Names{Schema: tbl.Schema, Table: tbl.Name, Publication: cfg.Postgres.Publication}, log)
	if err != nil {
		log.Error().Err(err).Msg("migrate failed")
		return exitFatal
	}
	if err := preparePartitioned(ctx, conn, cfg, tbl, log); err != nil {
		log.Error().Err(err).Msg("migrate failed")
		return exitFatal
	}
	conn.Close(context.WithoutCancel(ctx))
	// The slot is created here too, so every row inserted after migrate is
	// streamed even if the relay starts later.
	info, err := pgsetup.Prepare(ctx, cfg.Postgres.Config, true, pg.Identity{}, log)
	if err != nil {
		log.Error().Err(err).Msg("migrate: slot and publication check failed")
		return exitFatal
	}
	for _, w := range info.Warnings {
		log.Warn().Str("slot", cfg.Postgres.Slot).Msg(w)
	}
	log.Info().Ints("applied", applied).Str("slot", cfg.Postgres.Slot).Bool("slot_created", info.Created).
		Bool("slot_failover", info.Failover).Str("lsn", info.ConfirmedFlush.String()).Msg("migrate done")
	return exitOK
}

// run is `outbox-relay run`, the relay, until ctx ends (exit 0) or a fatal
// error (1); 2 when relay.New refuses the config. Past the shutdown
// deadline it exits the process itself.
func run(ctx context.Context, cfg Config, _, _ io.Writer, log zerolog.Logger) int {
	log = log.With().Str("slot", cfg.Postgres.Slot).Logger()
	log.Info().Str("version", version).Str("config", cfg.redacted()).Msg("starting outbox-relay")
	gcPercent, memLimit := tuneGC(cfg.InFlight.MaxBytes)
	log.Info().Int("gogc", gcPercent).Int64("gomemlimit", memLimit).Msg("go runtime GC pacing (GOGC, GOMEMLIMIT override it)")
	logRetention(cfg, log)
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	r, err := relay.New(cfg.Config, relay.Deps{Log: log, Registry: reg})
	if err != nil {
		log.Error().Err(err).Msg("relay config")
		return exitConfig
	}
	// Run keeps the deadline itself; this is the belt to its braces, so an
	// orchestrator never has to SIGKILL us mid-write.
	defer context.AfterFunc(ctx, func() {
		time.AfterFunc(cfg.ShutdownTimeout+relay.ExitMargin, func() {
			log.Error().Dur("shutdown_timeout", cfg.ShutdownTimeout).Msg("shutdown deadline passed; exiting: the slot keeps every unconfirmed event")
			os.Exit(exitFatal)
		})
	})()
	if err := r.Run(ctx); err != nil {
		msg := "relay stopped on error; it resumes from the slot on restart"
		if errors.Is(err, pgsetup.ErrSlotVanished) {
			msg = "relay stopped: its slot is gone; a restart refuses the same way until the recovery steps in the error are done (docs/failover.md after a failover)"
		}
		log.Error().Err(err).Msg(msg)
		return exitFatal
	}
	log.Info().Msg("relay stopped")
	return exitOK
}
