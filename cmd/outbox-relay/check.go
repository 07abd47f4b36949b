package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os/signal"
	"syscall"
	"time"

	"github.com/outbox-relay/outbox-relay/outboxschema"
	"github.com/outbox-relay/outbox-relay/preflight"
)

const checkUsage = "usage: outbox-relay check [--json] [--print-grants ROLE] [--config FILE] [config flags]"

// checkMain runs `outbox-relay check`, the preflight before `run`, with the
// relay's own config. Exit codes as status's: 0 all ok, 4
// (report.ExitWarn) some warn, 3 (report.ExitBad) some check failed,
// 2 usage, 1 the report could not be written.
func checkMain(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	var (
		asJSON bool
		grants string
	)
	own := func(fs *flag.FlagSet) {
		fs.BoolVar(&asJSON, "json", false, "print the report as JSON (field names in docs/commands.md)")
		fs.StringVar(&grants, "print-grants", "", "print the GRANT block for role `ROLE` and exit (connects to nothing)")
	}
	cfg, err := loadConfig("check", args, getenv, own)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(stdout, checkUsage)
		printFlags(stdout, own)
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "invalid configuration:\n%v\n", indent(err))
		return exitConfig
	}
	tbl, _ := outboxschema.ParseTable(cfg.Postgres.Table) // valid: loadConfig checked it
	o := preflight.Options{
		PostgresURL: cfg.Postgres.URL, Table: tbl, Publication: cfg.Postgres.Publication, Slot: cfg.Postgres.Slot,
		CreatePublication: cfg.Postgres.CreatePublication, LeaderEnabled: cfg.Leader.Enabled,
		HeartbeatInterval: cfg.Heartbeat.Interval, RetentionKeep: cfg.Retention.Keep, RetentionArchive: cfg.Retention.Archive,
		Kafka: cfg.Kafka, DeadLetterTopic: cfg.DeadLetter.Topic, MessagesPrefix: cfg.Messages.Prefix, Mappings: cfg.Postgres.Mappings,
	}

	if grants != "" {
		fmt.Fprint(stdout, preflight.Grants(o, grants))
		return exitOK
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	rep := preflight.Evaluate(preflight.Gather(ctx, o))
	write := preflight.Text
	if asJSON {
		write = preflight.JSON
	}
	if err := write(stdout, rep); err != nil {
		fmt.Fprintln(stderr, "check:", err)
		return exitFatal
	}
	return rep.ExitCode
}
