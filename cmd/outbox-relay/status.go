package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/rs/zerolog"

	"github.com/outbox-relay/outbox-relay/internal/pg"
	"github.com/outbox-relay/outbox-relay/outboxschema"
	"github.com/outbox-relay/outbox-relay/status"
)

// statusCommand is `outbox-relay status`: it reads PostgreSQL only, with
// the relay's own config, so it answers while every relay is down. Exit
// codes: 0 all ok, 4 (report.ExitWarn) some warn, 3 (report.ExitBad) some
// bad, 2 usage, 1 the report could not be written.
func statusCommand() command {
	a := &statusArgs{}
	return command{usage: "usage: outbox-relay status [--json] [--id N] [--config FILE] [config flags]", flags: a.flags, timeout: 30 * time.Second, run: a.run}
}

// statusArgs are status's own flags.
type statusArgs struct {
	jsonFlag
	id int64 // --id: > 0 asks only whether this outbox row is delivered
}

func (a *statusArgs) flags(fs *flag.FlagSet) {
	a.bind(fs)
	fs.Int64Var(&a.id, "id", 0, "only answer: is outbox row `N` delivered?")
}

// run gathers the facts (with --id, only that row's), judges them and
// writes the report.
func (a *statusArgs) run(ctx context.Context, cfg Config, stdout, stderr io.Writer, _ zerolog.Logger) int {
	if a.id < 0 {
		fmt.Fprintln(stderr, "status: --id must be an outbox row id (a positive integer)")
		return exitConfig
	}
	tbl, _ := outboxschema.ParseTable(cfg.Postgres.Table) // valid: loadConfig checked it
	opts := status.Options{
		Table: tbl, Slot: cfg.Postgres.Slot, EventID: a.id,
		LeaderEnabled: cfg.Leader.Enabled, LeaseTTL: cfg.Leader.LeaseTTL,
		Keep: retentionKeep(cfg), MessagesPrefix: cfg.Messages.Prefix, Mapped: cfg.Postgres.Mappings != nil,
		SlotFailover: cfg.Postgres.SlotFailover, StandbySlots: cfg.Postgres.StandbySlots,
	}
	if opts.Mapped && a.id > 0 {
		fmt.Fprintln(stderr, cfg.ownTableOnly("status --id"))
		return exitConfig
	}
	var facts status.Facts
	conn, err := pg.Connect(ctx, cfg.Postgres.URL)
	if err != nil {
		facts = status.Facts{Table: tbl.String(), Slot: cfg.Postgres.Slot, ConnectError: noSecret(err.Error(), cfg.Postgres.URL)}
	} else {
		facts = status.Gather(ctx, conn, opts)
		conn.Close(context.WithoutCancel(ctx))
		facts.ConnectError = noSecret(facts.ConnectError, cfg.Postgres.URL)
	}
	rep := status.Evaluate(facts)
	return writeReport("status", a.asJSON, status.Text, status.JSON, rep, rep.ExitCode, stdout, stderr)
}

// retentionKeep is retention.keep for the oldest_row and retention checks.
func retentionKeep(c Config) *time.Duration { return &c.Retention.Keep }

// noSecret removes the URL's password from a message, whatever the driver
// put in it.
func noSecret(msg, url string) string {
	if pc, err := pgconn.ParseConfig(url); err == nil && pc.Password != "" {
		msg = strings.ReplaceAll(msg, pc.Password, "xxxxx")
	}
	return msg
}
