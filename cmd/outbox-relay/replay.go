package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/outbox-relay/outbox-relay/replay"
)

// replayMain runs `outbox-relay replay` with the relay's own config (file,
// env, flags): it finds the same table and publishes like the relay.
func replayMain(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	var opts func() (replay.Options, error)
	cfg, err := loadConfig("replay", args, getenv, func(fs *flag.FlagSet) { opts = replay.Bind(fs) })
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(stdout, "usage:", replay.Usage)
		printFlags(stdout, func(fs *flag.FlagSet) { replay.Bind(fs) })
		return exitOK
	}
	o, oerr := opts() // also after a config error: one run shows every problem
	if err = errors.Join(oerr, err); err != nil {
		fmt.Fprintf(stderr, "replay: invalid arguments or configuration:\n%v\nusage: %s\n", indent(err), replay.Usage)
		return exitConfig
	}
	if why := cfg.ownTableOnly("replay"); why != "" {
		fmt.Fprintln(stderr, why)
		return exitConfig
	}
	log := newLogger(cfg.Log, stderr)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	r, err := replay.New(replayConfig(cfg), o, replay.Deps{Log: log, Progress: stderr, Terminal: isTerminal(stderr)})
	if err != nil {
		fmt.Fprintln(stderr, "replay:", err)
		return exitConfig
	}
	if _, err := r.Run(ctx); err != nil {
		fmt.Fprintf(stderr, "replay failed:\n%v", indent(err))
		return exitFatal
	}
	return exitOK
}

// replayConfig is what replay takes of the relay's configuration c (which
// loadConfig validated whole).
func replayConfig(c Config) replay.Config {
	return replay.Config{PostgresURL: c.Postgres.URL, Table: c.Postgres.Table, Kafka: c.Kafka, Policy: c.Policy(),
		MaxEvents: c.InFlight.MaxEvents, MaxBytes: c.InFlight.MaxBytes, ShutdownTimeout: c.ShutdownTimeout}
}

// isTerminal reports whether w is a terminal (a character device).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
