package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/rs/zerolog"

	"github.com/outbox-relay/outbox-relay/deadletter"
	"github.com/outbox-relay/outbox-relay/outboxschema"
	"github.com/outbox-relay/outbox-relay/record"
)

const dlqUsage = "usage: outbox-relay dlq list [--all] [--limit N] | replay --id N | resolve --id N  [config flags]"

// dlqMain runs `outbox-relay dlq list|replay|resolve` with the relay's own
// config (file, env, flags), so it finds the same outbox table.
func dlqMain(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		fmt.Fprintln(stderr, dlqUsage)
		return exitConfig
	}
	sub, rest := args[0], args[1:]
	switch sub {
	case "list", "replay", "resolve":
	default:
		fmt.Fprintf(stderr, "unknown dlq command %q: use list, replay or resolve\n", sub)
		return exitConfig
	}
	a := &dlqArgs{sub: sub}
	return runCommand("dlq "+sub, command{usage: dlqUsage, flags: a.flags, ownTable: true, timeout: time.Minute, run: a.run},
		rest, getenv, stdout, stderr)
}

// dlqArgs are the flags of dlq sub.
type dlqArgs struct {
	sub   string
	id    int64
	all   bool
	limit int
}

func (a *dlqArgs) flags(fs *flag.FlagSet) {
	switch a.sub {
	case "list":
		fs.BoolVar(&a.all, "all", false, "include resolved rows")
		fs.IntVar(&a.limit, "limit", 100, "most rows to show")
	case "replay", "resolve":
		fs.Int64Var(&a.id, "id", 0, "outbox row id (see dlq list)")
	}
}

func (a *dlqArgs) run(ctx context.Context, cfg Config, stdout, stderr io.Writer, _ zerolog.Logger) int {
	return runDLQ(ctx, cfg, a.sub, a.id, a.all, a.limit, stdout, stderr)
}

// runDLQ runs dlq sub (list, replay or resolve) on the configured outbox
// table.
func runDLQ(ctx context.Context, cfg Config, sub string, id int64, all bool, limit int, stdout, stderr io.Writer) int {
	if sub != "list" && id <= 0 {
		fmt.Fprintf(stderr, "dlq %s: --id is required: the outbox row id, from `outbox-relay dlq list`\n", sub)
		return exitConfig
	}
	tbl, _ := outboxschema.ParseTable(cfg.Postgres.Table) // valid: loadConfig checked it
	store, err := deadletter.Open(ctx, cfg.Postgres.URL, tbl.Schema, tbl.Name)
	if err != nil {
		fmt.Fprintln(stderr, "dlq:", err)
		return exitConfig
	}
	defer store.Close()

	switch sub {
	case "list":
		rows, err := store.List(ctx, all, limit)
		if err != nil {
			fmt.Fprintln(stderr, "dlq list:", err)
			return exitFatal
		}
		w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "ID\tAGGREGATE_TYPE\tAGGREGATE_ID\tEVENT_TYPE\tATTEMPTS\tDEAD_LETTERED_AT\tRESOLVED_AT\tLAST_ERROR")
		for _, r := range rows {
			resolved := "-"
			if r.ResolvedAt != nil {
				resolved = r.ResolvedAt.UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", r.ID, r.AggregateType, r.AggregateID, r.EventType,
				r.Attempts, r.DeadLetteredAt.UTC().Format(time.RFC3339), resolved, oneLine(r.LastError))
		}
		w.Flush()
		fmt.Fprintf(stderr, "%d row(s); replay one with `outbox-relay dlq replay --id N` after fixing its cause\n", len(rows))
	case "replay":
		r, err := store.Replay(ctx, id)
		if err != nil {
			fmt.Fprintln(stderr, "dlq replay:", err)
			return exitFatal
		}
		fmt.Fprintf(stdout, "replayed outbox row %d as row %d, event_id %s (the dead-lettered event's own), marked %s: %s; the relay publishes it in commit order\n",
			id, r.NewID, r.EventID, outboxschema.HeaderReplayedFrom, record.ReplayedFromDLQ)
	case "resolve":
		if err := store.Resolve(ctx, id); err != nil {
			fmt.Fprintln(stderr, "dlq resolve:", err)
			return exitFatal
		}
		fmt.Fprintf(stdout, "outbox row %d marked resolved without replay\n", id)
	}
	return exitOK
}

func oneLine(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > 160 {
		s = s[:160] + "..."
	}
	return s
}
