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

	"github.com/rs/zerolog"
)

// command is one subcommand: what it adds to the configuration flags and
// what it does with the loaded configuration. runCommand does the rest,
// the same for every subcommand.
type command struct {
	usage string              // the first line of its -h, "usage: outbox-relay ..."
	flags func(*flag.FlagSet) // registers its own flags; nil: none
	// args checks its own flags once parsed; its error is reported with
	// the configuration's (one run shows every problem) and the usage
	// line. nil: nothing to check.
	args func() error
	// ownTable: it reads or writes the relay's bookkeeping columns, so it
	// refuses a table read through a column mapping (Config.ownTableOnly).
	ownTable bool
	timeout  time.Duration // bounds run; 0: only a signal stops it
	run      runFunc
}

// runFunc does a subcommand's work: ctx ends on SIGINT or SIGTERM (or the
// command's timeout), log writes to stderr as log.level and log.format
// say. It returns the exit code.
type runFunc func(ctx context.Context, cfg Config, stdout, stderr io.Writer, log zerolog.Logger) int

// commands are the subcommands runCommand runs by name (dlq chooses its own
// by the word after it: dlqMain); each entry makes a fresh command, whose
// flags are bound to variables of its own.
var commands = map[string]func() command{
	"run":     configOnly("run", run),
	"migrate": configOnly("migrate", migrate),
	"status":  statusCommand,
	"check":   checkCommand,
	"cleanup": cleanupCommand,
	"replay":  replayCommand,
}

// configOnly is a command with no flags but the configuration's.
func configOnly(name string, run runFunc) func() command {
	return func() command {
		return command{usage: "usage: outbox-relay " + name + " [--config FILE] [flags]", run: run}
	}
}

// runCommand runs subcommand c as name (the words after outbox-relay) with
// args: it loads the configuration (--config file, env, flags), answers -h
// with the usage and every flag on stdout (exit 0), reports invalid
// arguments or configuration on stderr (exit 2), refuses a mapped table
// when c.ownTable (exit 2), then runs c with a logger and a context that
// SIGINT and SIGTERM cancel (and c.timeout ends). Called once, from main's
// goroutine; it blocks until c returns.
func runCommand(name string, c command, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	var own []func(*flag.FlagSet)
	if c.flags != nil {
		own = append(own, c.flags)
	}
	cfg, err := loadConfig(name, args, getenv, own...)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(stdout, c.usage)
		printFlags(stdout, own...)
		return exitOK
	}
	if c.args != nil {
		// Also after a configuration error: one run shows every problem.
		if err = errors.Join(c.args(), err); err != nil {
			fmt.Fprintf(stderr, "%s: invalid arguments or configuration:\n%v\n%s\n", name, indent(err), c.usage)
			return exitConfig
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "invalid configuration:\n%v\n", indent(err))
		return exitConfig
	}
	if c.ownTable {
		word, _, _ := strings.Cut(name, " ") // "dlq list" refuses as dlq
		if why := cfg.ownTableOnly(word); why != "" {
			fmt.Fprintln(stderr, why)
			return exitConfig
		}
	}
	log := newLogger(cfg.Log, stderr)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if c.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.timeout)
		defer cancel()
	}
	return c.run(ctx, cfg, stdout, stderr, log)
}

// usage writes the list of commands to w.
func usage(w io.Writer) {
	fmt.Fprint(w, `usage: outbox-relay <command> [--config FILE] [flags]

commands:
  run       stream outbox inserts from the replication slot to Kafka
  migrate   create the outbox table, its index, the publication and the slot
  dlq       list | replay --id N | resolve --id N: dead-lettered events
  status    [--json] [--id N]: leader, slot, lag, undelivered, DLQ, retention, each with
            what to do; reads PostgreSQL only. Exit 0 all ok, 4 a warning, 3 a check is bad
  replay    --since TIME|--from-id N [--until TIME|--to-id M] [--aggregate-type T]
            [--event-type E] [--rate N/s]: republish outbox rows from the table with
            their original event_id (after a lost or dropped slot, rows older than
            the slot, a new consumer); TIME is RFC 3339 or 2006-01-02 (UTC)
  cleanup   [--dry-run] remove delivered rows older than retention.keep now
  check     [--json] [--print-grants ROLE]: preflight before run: server, privileges,
            publication, slot, Kafka, topics, ACLs, each with the exact fix.
            Exit 0 all ok, 4 a warning, 3 a check failed
  version   print the version

Run "outbox-relay <command> -h" for its flags and their defaults; each
configuration flag has an OUTBOX_RELAY_* env twin. --config FILE (or env
OUTBOX_RELAY_CONFIG) reads a YAML file first.
`)
}

// indent formats an error, one "  - " line per line of it.
func indent(err error) string {
	return "  - " + strings.ReplaceAll(err.Error(), "\n", "\n  - ") + "\n"
}

// jsonFlag is --json of the commands that print a report (status, check).
type jsonFlag struct{ asJSON bool }

func (j *jsonFlag) bind(fs *flag.FlagSet) {
	fs.BoolVar(&j.asJSON, "json", false, "print the report as JSON (field names in docs/commands.md)")
}

// writeReport writes rep, the report of status or check, to stdout: as JSON
// when asJSON, else as text. It returns exit, the report's exit code, or
// exitFatal (the error on stderr, after name) when it could not write it.
func writeReport[R any](name string, asJSON bool, text, json func(io.Writer, R) error, rep R, exit int, stdout, stderr io.Writer) int {
	write := text
	if asJSON {
		write = json
	}
	if err := write(stdout, rep); err != nil {
		fmt.Fprintln(stderr, name+":", err)
		return exitFatal
	}
	return exit
}
