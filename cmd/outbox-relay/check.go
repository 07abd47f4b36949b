package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/rs/zerolog"

	"github.com/outbox-relay/outbox-relay/outboxschema"
	"github.com/outbox-relay/outbox-relay/preflight"
	"github.com/outbox-relay/outbox-relay/record"
	"github.com/outbox-relay/outbox-relay/serialize"
)

// checkCommand is `outbox-relay check`, the preflight before `run`, with
// the relay's own config. Exit codes as status's: 0 all ok, 4
// (report.ExitWarn) some warn, 3 (report.ExitBad) some check failed, 2
// usage, 1 the report could not be written.
func checkCommand() command {
	a := &checkArgs{}
	return command{usage: "usage: outbox-relay check [--json] [--print-grants ROLE] [--config FILE] [config flags]", flags: a.flags, timeout: 60 * time.Second, run: a.run}
}

// checkArgs are check's own flags.
type checkArgs struct {
	jsonFlag
	grants string // --print-grants: print the GRANT block for this role, check nothing
}

func (a *checkArgs) flags(fs *flag.FlagSet) {
	a.bind(fs)
	fs.StringVar(&a.grants, "print-grants", "", "print the GRANT block for role `ROLE` and exit (connects to nothing)")
}

// run gathers the facts, judges them and writes the report (with
// --print-grants, only the GRANT block).
func (a *checkArgs) run(ctx context.Context, cfg Config, stdout, stderr io.Writer, _ zerolog.Logger) int {
	tbl, _ := outboxschema.ParseTable(cfg.Postgres.Table) // valid: loadConfig checked it
	o := preflight.Options{
		PostgresURL: cfg.Postgres.URL, Table: tbl, Publication: cfg.Postgres.Publication, Slot: cfg.Postgres.Slot,
		CreatePublication: cfg.Postgres.CreatePublication, LeaderEnabled: cfg.Leader.Enabled,
		HeartbeatInterval: cfg.Heartbeat.Interval, RetentionKeep: cfg.Retention.Keep, RetentionArchive: cfg.Retention.Archive,
		Kafka: cfg.Kafka, DeadLetterTopic: cfg.DeadLetter.Topic, MessagesPrefix: cfg.Messages.Prefix, Mappings: cfg.Postgres.Mappings,
		SlotFailover: cfg.Postgres.SlotFailover, StandbySlots: cfg.Postgres.StandbySlots,
		PoisonHalts: cfg.OnPoison == "halt", ReservedHeaders: record.ReservedExtra(cfg.Compat),
	}
	if enc := cfg.Encoding(); enc.UsesRegistry() {
		ser, err := serialize.New(enc.Serialization, enc.Topics, enc.Registry, zerolog.Nop(), nil) // no I/O
		if err != nil {
			fmt.Fprintln(stderr, "check:", err)
			return exitConfig
		}
		defer ser.Close()
		o.Registry = &preflight.RegistryOptions{Config: enc.Registry, Format: ser.Format}
	}
	obs, _ := cfg.Outboxes() // valid: loadConfig resolved them
	for _, ob := range obs {
		m := ob.Mapping
		o.Routes = append(o.Routes, preflight.Route{Table: m.Table, Template: ob.Template, RouteBy: m.RouteBy, Type: m.Type,
			Headers: m.Headers, ID: m.ID, Own: ob.Own})
	}

	if a.grants != "" {
		fmt.Fprint(stdout, preflight.Grants(o, a.grants))
		return exitOK
	}
	rep := preflight.Evaluate(preflight.Gather(ctx, o))
	return writeReport("check", a.asJSON, preflight.Text, preflight.JSON, rep, rep.ExitCode, stdout, stderr)
}
