package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/outboxschema"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/status"
)

const statusUsage = "usage: outbox-relay status [--json] [--id N] [--config FILE] [config flags]"

// statusMain runs `outbox-relay status`: it reads PostgreSQL only, with the
// relay's own config, so it answers while every relay is down. Exit codes:
// 0 all ok, 4 (report.ExitWarn) some warn, 3 (report.ExitBad) some bad,
// 2 usage, 1 the report could not be written.
func statusMain(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	var (
		asJSON bool
		id     int64
	)
	own := func(fs *flag.FlagSet) {
		fs.BoolVar(&asJSON, "json", false, "print the report as JSON")
		fs.Int64Var(&id, "id", 0, "only answer: is outbox row `N` delivered?")
	}
	cfg, err := loadConfig("status", args, getenv, own)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(stdout, statusUsage)
		printFlags(stdout, own)
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "invalid configuration:\n%v\n", indent(err))
		return exitConfig
	}
	if id < 0 {
		fmt.Fprintln(stderr, "status: --id must be an outbox row id (a positive integer)")
		return exitConfig
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	tbl, _ := outboxschema.ParseTable(cfg.Postgres.Table) // valid: loadConfig checked it
	opts := status.Options{
		Table: tbl, Slot: cfg.Postgres.Slot, EventID: id,
		LeaderEnabled: cfg.Leader.Enabled, LeaseTTL: cfg.Leader.LeaseTTL,
		Keep: retentionKeep(cfg), MessagesPrefix: cfg.Messages.Prefix, Mapped: cfg.Postgres.Mappings != nil,
	}
	if opts.Mapped && id > 0 {
		fmt.Fprintln(stderr, cfg.ownTableOnly("status --id"))
		return exitConfig
	}
	var facts status.Facts
	conn, err := replication.Connect(ctx, cfg.Postgres.URL)
	if err != nil {
		facts = status.Facts{Table: tbl.String(), Slot: cfg.Postgres.Slot, ConnectError: noSecret(err.Error(), cfg.Postgres.URL)}
	} else {
		facts = status.Gather(ctx, conn, opts)
		conn.Close(context.WithoutCancel(ctx))
		facts.ConnectError = noSecret(facts.ConnectError, cfg.Postgres.URL)
	}
	rep := status.Evaluate(facts)
	write := status.Text
	if asJSON {
		write = status.JSON
	}
	if err := write(stdout, rep); err != nil {
		fmt.Fprintln(stderr, "status:", err)
		return exitFatal
	}
	return rep.ExitCode
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
