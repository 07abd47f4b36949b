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
	"text/tabwriter"
	"time"

	"github.com/outbox-relay/outbox-relay/deadletter"
	"github.com/outbox-relay/outbox-relay/outboxschema"
)

// dlqMain runs `outbox-relay dlq list|replay|resolve` with the relay's own
// config (file, env, flags), so it finds the same outbox table.
func dlqMain(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		fmt.Fprintln(stderr, "usage: outbox-relay dlq list [--all] [--limit N] | replay --id N | resolve --id N  [config flags]")
		return exitConfig
	}
	sub, rest := args[0], args[1:]
	var (
		id    int64
		all   bool
		limit int
	)
	opts := func(fs *flag.FlagSet) {
		switch sub {
		case "list":
			fs.BoolVar(&all, "all", false, "include resolved rows")
			fs.IntVar(&limit, "limit", 100, "most rows to show")
		case "replay", "resolve":
			fs.Int64Var(&id, "id", 0, "outbox row id (see dlq list)")
		}
	}
	switch sub {
	case "list", "replay", "resolve":
	default:
		fmt.Fprintf(stderr, "unknown dlq command %q: use list, replay or resolve\n", sub)
		return exitConfig
	}
	cfg, err := loadConfig("dlq "+sub, rest, getenv, opts)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(stdout, "usage: outbox-relay dlq list [--all] [--limit N] | replay --id N | resolve --id N  [config flags]")
		printFlags(stdout, opts)
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "invalid configuration:\n%v\n", indent(err))
		return exitConfig
	}
	if why := cfg.ownTableOnly("dlq"); why != "" {
		fmt.Fprintln(stderr, why)
		return exitConfig
	}
	if sub != "list" && id <= 0 {
		fmt.Fprintf(stderr, "dlq %s: --id is required: the outbox row id, from `outbox-relay dlq list`\n", sub)
		return exitConfig
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
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
		newID, err := store.Replay(ctx, id)
		if err != nil {
			fmt.Fprintln(stderr, "dlq replay:", err)
			return exitFatal
		}
		fmt.Fprintf(stdout, "replayed outbox row %d as row %d; the relay publishes it like any new event\n", id, newID)
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
